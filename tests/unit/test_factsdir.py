"""Saved facts batches (`ddpfix audit --facts-out DIR` per --limit batch, then `--facts-in DIR ...`): what is saved,
what is read back and what never is. On the recorded clean cluster (fixtures/facts/clean3, see unit_helpers).

- saved in batches and merged, the checks find what they find on one run of the same facts, with the same plan;
- a saved file is hostile input: a link, a file past the size bound, non-JSON, another schema, a file whose host
  differs from its name, NaN clock values are ignored with a note; a host outside the inventory is ignored with a
  note; the facts read are guarded as live facts (the same invalid-fact findings);
- a node without a file, or whose newest file is older than the age bound or dated in the future, is not read
  (unreachable, with why), never a pass; of two files of one node the newer is read;
- the skew check (SKEW) compares offsets measured by one controller's clock only;
- the CLI: --facts-in runs nothing (no ansible-playbook), refuses --limit and --facts-out, reports in every format
  with the notes in `facts_in`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from unit_helpers import Sim

from ddpfix import factsdir, schemas
from ddpfix.cli import cli
from ddpfix.factsdir import MAX_FILE_BYTES, NOT_SAVED, load_facts, save_facts
from ddpfix.rules import env as env_rules
from ddpfix.rules.context import Context, Thresholds
from ddpfix.rules.engine import run_checks
from ddpfix.rules.reachability import INVALID
from ddpfix.rules.time import SKEW

NOW = 1795995890.0


def keys(findings: list[Any]) -> list[tuple[str, str | None, str]]:
    return sorted((f.id, f.host, f.message) for f in findings)


def save_batches(sim: Sim, tmp: Path, batches: dict[str, list[str]], now: float = NOW, **kw: Any) -> list[Path]:
    hosts = sim.context().hosts
    out = []
    for dirname, names in batches.items():
        save_facts(tmp / dirname, {n: hosts[n] for n in names}, run_id=f"run-{dirname}", now=now, **kw)
        out.append(tmp / dirname)
    return out


def merged(sim: Sim, dirs: list[Path], now: float = NOW, **kw: Any) -> tuple[Context, factsdir.Saved]:
    saved = load_facts(dirs, sim.cluster(), now=now, **kw)
    return Context(sim.cluster(), saved.hosts, Thresholds()), saved


def test_batches_merged_find_what_one_run_finds(sim: Sim, tmp_path: Path) -> None:
    sim.set_hosts_file("node3", "127.0.0.1\tlocalhost\n127.0.1.1\tnode3\n")
    sim.node("node3")["resolve_self"] = {"node3": ["127.0.1.1"]}
    dirs = save_batches(sim, tmp_path, {"a": ["node1", "node2"], "b": ["node3"]})
    ctx, saved = merged(sim, dirs)
    assert keys(run_checks(ctx)) == keys(sim.findings())
    assert {n: p.address for n, p in ctx.plan.items()} == {n: p.address for n, p in sim.context().plan.items()}
    assert saved.notes == []
    assert [(r["id"], r["hosts"]) for r in saved.runs] == [("run-a", ["node1", "node2"]), ("run-b", ["node3"])]
    # one file per node, private
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["node1.facts.json", "node2.facts.json"]
    assert (tmp_path / "a" / files[0]).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700
    for p in (tmp_path / "a").iterdir():
        schemas.validate(json.loads(p.read_text()))


def test_a_master_port_not_probed_from_every_node_is_said(sim: Sim, tmp_path: Path) -> None:
    sim.probe("node3")["connects"] = [c for c in sim.probe("node3")["connects"] if c["kind"] != "master"]
    dirs = save_batches(sim, tmp_path, {"a": ["node1", "node2"], "b": ["node3"]})
    _, saved = merged(sim, dirs)
    assert saved.notes == ["the master port was probed from 1 of the 2 other nodes read: only batches that held the "
                           "master (node1) dial it; put it in every batch, run one after another, to probe it from "
                           "all (docs/fleet.md)"]


def test_an_unreachable_node_of_a_batch_stays_unreachable(sim: Sim, tmp_path: Path) -> None:
    sim.set_unreachable("node2", "ssh: connect to host 10.0.0.2 port 22: No route to host")
    dirs = save_batches(sim, tmp_path, {"a": ["node1", "node2"], "b": ["node3"]})
    ctx, _ = merged(sim, dirs)
    assert not ctx.hosts["node2"].reachable and "No route to host" in ctx.hosts["node2"].error
    assert keys(run_checks(ctx)) == keys(sim.findings())


def test_a_node_in_no_batch_is_not_read(sim: Sim, tmp_path: Path) -> None:
    dirs = save_batches(sim, tmp_path, {"a": ["node1", "node2"]})
    ctx, _ = merged(sim, dirs)
    assert not ctx.hosts["node3"].reachable and ctx.hosts["node3"].error == NOT_SAVED
    sim.set_unreachable("node3", NOT_SAVED)
    assert keys(run_checks(ctx)) == keys(sim.findings())  # reported as a node not read, as live


def test_stale_and_future_facts_are_not_read(sim: Sim, tmp_path: Path) -> None:
    save_batches(sim, tmp_path, {"a": ["node1", "node2"]}, now=NOW - 7200)
    save_batches(sim, tmp_path, {"b": ["node3"]}, now=NOW + 3600)
    ctx, saved = merged(sim, [tmp_path / "a", tmp_path / "b"])
    assert not any(h.reachable for h in ctx.hosts.values())
    assert "past the 3600 s --facts-max-age" in ctx.hosts["node1"].error
    assert "in the future" in ctx.hosts["node3"].error
    assert len(saved.notes) == 3
    ctx, _ = merged(sim, [tmp_path / "a"], max_age=3 * 3600)  # the operator's bound
    assert ctx.hosts["node1"].reachable


def test_the_newer_of_two_files_is_read(sim: Sim, tmp_path: Path) -> None:
    save_batches(sim, tmp_path, {"old": ["node1"]}, now=NOW - 60)
    sim.node("node1")["hostname"] = "renamed"
    save_batches(sim, tmp_path, {"new": ["node1"]}, now=NOW - 10)
    for order in (["old", "new"], ["new", "old"]):
        ctx, saved = merged(sim, [tmp_path / d for d in order])
        assert (ctx.hosts["node1"].node or {}).get("hostname") == "renamed"
        assert any("saved twice" in n and "run-new" in n for n in saved.notes)


def _write(path: Path, data: Any) -> None:
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def test_hostile_files_are_ignored_with_a_note(sim: Sim, tmp_path: Path) -> None:
    (d,) = save_batches(sim, tmp_path, {"a": ["node1"]})
    good = json.loads((d / "node1.facts.json").read_text())
    _write(d / "node2.facts.json", {**good, "host": "node1"})  # names another host than its file
    os.symlink(d / "node1.facts.json", d / "node3.facts.json")  # a link: never followed
    _write(d / "ghost.facts.json", {**good, "host": "ghost"})  # not in the inventory
    _write(d / "stray.json", "{}")
    ctx, saved = merged(sim, [d])
    assert ctx.hosts["node1"].reachable
    assert not ctx.hosts["node2"].reachable and not ctx.hosts["node3"].reachable
    notes = "\n".join(saved.notes)
    assert "node2.facts.json: ignored: names host 'node1'" in notes
    assert "node3.facts.json: ignored: cannot open" in notes
    assert "host 'ghost' is not in the inventory" in notes
    assert "stray.json: ignored: not a saved facts file" in notes


@pytest.mark.parametrize(("content", "why"), [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"schema": "ddpfix.facts/v1", "host": "node2", "run": {"saved_at": NaN}}', "no run time"),
    ({"schema": "ddpfix.report/v1"}, "not a ddpfix.facts/v1 document"),
    ({"schema": "ddpfix.facts/v1", "host": "node2", "run": {"saved_at": "soon"}}, "no run time"),
    ({"schema": "ddpfix.facts/v1", "host": "node2", "run": {"saved_at": NOW}, "reachable": True, "failed": False,
      "error": "", "node": ["x"], "probe": None}, "node: not a mapping or null"),
    ("\xff\xfe", "not JSON"),
])
def test_malformed_files_are_ignored(sim: Sim, tmp_path: Path, content: Any, why: str) -> None:
    d = tmp_path / "a"
    d.mkdir()
    _write(d / "node2.facts.json", content)
    ctx, saved = merged(sim, [d])
    assert not ctx.hosts["node2"].reachable
    assert any(why in n for n in saved.notes), saved.notes


def test_an_oversized_file_is_not_read(sim: Sim, tmp_path: Path) -> None:
    (d,) = save_batches(sim, tmp_path, {"a": ["node2"]})
    with open(d / "node2.facts.json", "a") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    ctx, saved = merged(sim, [d])
    assert not ctx.hosts["node2"].reachable
    assert any("past the" in n for n in saved.notes)


def test_reading_stops_at_the_total_bound(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (d,) = save_batches(sim, tmp_path, {"a": ["node1", "node2", "node3"]})
    size = (d / "node1.facts.json").stat().st_size
    monkeypatch.setattr(factsdir, "MAX_TOTAL_BYTES", size + 10)  # node1's file, not node2's as well
    ctx, saved = merged(sim, [d])
    assert ctx.hosts["node1"].reachable and not ctx.hosts["node2"].reachable
    assert any("node2.facts.json: ignored: not read: the" in n and "are spent" in n for n in saved.notes), saved.notes


def test_facts_with_nan_read_back_as_live(sim: Sim, tmp_path: Path) -> None:
    sim.node("node2")["time"]["chrony_tracking"] = {"synchronised": True, "system_offset": float("nan")}
    dirs = save_batches(sim, tmp_path, {"a": ["node1", "node2", "node3"]})
    ctx, saved = merged(sim, dirs)
    assert ctx.hosts["node2"].reachable and not saved.notes
    assert keys(run_checks(ctx)) == keys(sim.findings())


def test_saved_facts_are_guarded_as_live_facts(sim: Sim, tmp_path: Path) -> None:
    sim.node("node2")["hostname"] = "node2{{ lookup('pipe', 'id') }}"
    dirs = save_batches(sim, tmp_path, {"a": ["node1", "node2", "node3"]})
    ctx, _ = merged(sim, dirs)
    assert ctx.invalid == sim.context().invalid and "node2" in ctx.invalid
    assert [f.host for f in run_checks(ctx) if f.id == INVALID.id] == ["node2"]


def test_skew_is_compared_within_one_controllers_clock(sim: Sim) -> None:
    hosts = sim.context().hosts
    for h in hosts.values():
        h.window = (h.collected_at - 0.1, h.collected_at + 0.1)  # type: ignore[operator]
    hosts["node3"].node["now"] = hosts["node3"].window[1] + 5  # type: ignore[index]
    skew = [f for f in run_checks(Context(sim.cluster(), hosts)) if f.id == SKEW.id]
    assert len(skew) == 1 and "node3: +5.00s vs controller (" in skew[0].evidence  # as before
    hosts["node3"].clock = "controller-b"  # node3 read by another controller: its offset is that clock's
    assert not [f for f in run_checks(Context(sim.cluster(), hosts)) if f.id == SKEW.id]
    hosts["node2"].clock = "controller-b"
    skew = [f for f in run_checks(Context(sim.cluster(), hosts)) if f.id == SKEW.id]
    assert len(skew) == 1 and "vs controller controller-b" in skew[0].evidence


def test_batches_of_several_controllers_say_their_clocks_are_not_compared(sim: Sim, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    save_batches(sim, tmp_path, {"a": ["node1", "node2"]})
    monkeypatch.setattr(factsdir, "controller_id", lambda: "controller-b")
    save_batches(sim, tmp_path, {"b": ["node3"]})
    ctx, saved = merged(sim, [tmp_path / "a", tmp_path / "b"])
    assert ctx.hosts["node3"].clock == "controller-b" != ctx.hosts["node1"].clock
    assert any(n.startswith("clock skew compared among the nodes of each controller only") for n in saved.notes)
    assert [r["controller"] for r in saved.runs][1] == "controller-b"


def test_file_names_never_leave_the_directory() -> None:
    for host in ("node1", "../etc/passwd", ".hidden", "a/b", "x y"):
        name = factsdir.file_name(host)
        assert "/" not in name and not name.startswith(".")
        assert factsdir._host_of(name) == host


# ------------------------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def inventory(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {hosts: {node1: {}, node2: {}, node3: {}}}\n")
    monkeypatch.setattr("ddpfix.cli.audit.load_cluster", lambda _inv: sim.cluster())

    def no_run(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("--facts-in ran a playbook")

    monkeypatch.setattr("ddpfix.audit.run_playbook", no_run)
    return inv


@pytest.mark.parametrize("fmt", ["json", "text", "plain", "junit", "prometheus", "html", "table"])
def test_cli_facts_in_reports_without_contacting_a_node(sim: Sim, tmp_path: Path, inventory: Path,
                                                        fmt: str) -> None:
    dirs = save_batches(sim, tmp_path, {"a": ["node1", "node2"], "b": ["node3"]}, now=None)  # type: ignore[arg-type]
    args = ["-i", str(inventory), "audit", "--facts-in", str(dirs[0]), "--facts-in", str(dirs[1]), "--format", fmt,
            "--fail-on", "info"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1, r.output  # MISSING (the env file) on every node, at info
    if fmt == "json":
        doc = json.loads(r.stdout)
        assert sorted((f["id"], f["host"]) for f in doc["findings"]) == sorted((f.id, f.host) for f in sim.findings())
        assert doc["summary"]["reachable"] == 3
        assert [run["id"] for run in doc["facts_in"]["runs"]] == ["run-a", "run-b"]
        schemas.validate(doc)
    r = CliRunner().invoke(cli, [*args, "--skip", env_rules.MISSING.id])
    assert r.exit_code == 0, r.output


def test_cli_facts_in_refuses_a_limit_and_facts_out(tmp_path: Path, inventory: Path) -> None:
    for extra in (["-l", "node1"], ["--facts-out", str(tmp_path / "out")]):
        r = CliRunner().invoke(cli, ["-i", str(inventory), "audit", "--facts-in", str(tmp_path), *extra])
        assert r.exit_code == 2 and "--facts-in reads saved batches" in r.output
    r = CliRunner().invoke(cli, ["-i", str(inventory), "audit", "--facts-in", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "not a directory" in r.output


def test_cli_facts_in_refuses_probe_settings_it_would_ignore(tmp_path: Path, inventory: Path) -> None:
    """--probe-peers / --probe-timeout set the run's probes; --facts-in runs none: one line, exit 2, not a silent
    default. --no-probe still means what it means there (the saved probes' findings are left out)."""
    for extra, line in ((["--probe-peers", "3"], "--probe-peers 3: --facts-in runs no probe"),
                        (["--probe-timeout", "5"], "--probe-timeout 5.0: --facts-in runs no probe")):
        r = CliRunner().invoke(cli, ["-i", str(inventory), "audit", "--facts-in", str(tmp_path), *extra])
        assert r.exit_code == 2 and line in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1


def test_cli_facts_out_is_refused_before_anything_runs(tmp_path: Path, inventory: Path) -> None:
    (tmp_path / "file").write_text("")
    r = CliRunner().invoke(cli, ["-i", str(inventory), "audit", "--facts-out", str(tmp_path / "file")])
    assert r.exit_code == 2 and "--facts-out" in r.output
