"""The share of logs `ddpfix explain` names correctly, on the field corpus it is developed on
(fixtures/logs/field/) and on a held-out set it is not tuned on (fixtures/logs/heldout/, real pastes from public
issue threads, each citing its thread). Both shares are printed; a non-distributed log (`# expect: none`) must
name no host check in either set."""

from __future__ import annotations

from pathlib import Path

import pytest
from unit_helpers import FIXTURES

from ddpfix.diagnose.match import diagnose, finding_ids

LOGS = FIXTURES / "logs"
SETS = {"field": sorted((LOGS / "field").glob("*.log")), "held-out": sorted((LOGS / "heldout").glob("*.log"))}
#: the held-out share the test holds explain to (the field corpus is held to all of its logs in test_explain_field)
HELD_OUT_FLOOR = 0.95


def _read(path: Path) -> tuple[dict[str, str], list[str]]:
    head: dict[str, str] = {}
    body = path.read_text(encoding="utf-8", errors="replace").splitlines()
    while body and body[0].startswith("# "):
        k, _, v = body.pop(0)[2:].partition(":")
        head[k.strip()] = v.strip()
    return head, body


def share(paths: list[Path]) -> tuple[int, int, list[str], list[str]]:
    """(right, total, the wrong ones, the non-distributed logs that named a host check)."""
    right, wrong, loud = 0, [], []
    for p in paths:
        head, body = _read(p)
        want = [] if head["expect"] == "none" else head["expect"].split()
        got = diagnose(body)
        keys = sorted(d.pattern.key for d in got)
        if keys == sorted(want):
            right += 1
        else:
            wrong.append(f"{p.name}: {keys or 'none'} (expected {want or 'none'})")
        if not want and finding_ids(got):
            loud.append(p.name)
    return right, len(paths), wrong, loud


def test_sets_cite_their_sources() -> None:
    assert len(SETS["held-out"]) >= 15
    for paths in SETS.values():
        for p in paths:
            head, body = _read(p)
            assert head.get("source") and head.get("expect") and body, p.name
    for p in SETS["held-out"]:
        assert _read(p)[0]["source"].startswith("https://"), p.name


def test_shares_on_the_tuned_and_the_held_out_logs(capsys: pytest.CaptureFixture[str]) -> None:
    results = {name: share(paths) for name, paths in SETS.items()}
    with capsys.disabled():
        for name, (right, total, wrong, loud) in results.items():
            print(f"\nexplain on the {name} logs: {right}/{total} named correctly ({100 * right / total:.1f} %); "
                  f"non-distributed logs naming a host check: {len(loud)}")
            for w in wrong:
                print(f"  wrong: {w}")
    for name, (_, _, _, loud) in results.items():
        assert loud == [], (name, loud)
    right, total, _, _ = results["held-out"]
    assert right / total >= HELD_OUT_FLOOR
