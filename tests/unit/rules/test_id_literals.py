"""Finding ids are written once: in their rule module (``ddpfix/rules/<area>.py``), their fixtures (the rules'
``tests/fixtures/rules/<id>/`` and the other recorded inputs under ``tests/unit/fixtures/``: field logs naming the
findings explain must point at, recorded reports), the generated places (README.md's table, the roles' and
remediate.yml's tag lists and fix task names, the files module's ``WHAT_IDS``: ``python -m tools.generate``)
and the docs (README, CHANGELOG, CONTRIBUTING, BENCHMARKS and the benchmark notes, which quote measured reports).
Everything else, tests included, reads them from a rule object (``from ddpfix.rules import hosts as hosts_rules``;
``hosts_rules.PEER_MISMATCH.id``), the registry or a registry query (``fixed_by``, ``area_ids``, ``scoped``), so that
renaming an id is one edit in its rule module (plus its fixture directory) and the generator.

``test_ids_only_in_their_places`` fails on an id anywhere else in the tracked files.
``PYTHONPATH=controller:. python tests/unit/rules/test_id_literals.py`` prints, for each id, every file outside those
places that names it.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from ddpfix.lab.scenarios.registry import SCENARIOS
from ddpfix.rules import registry
from tools import tags

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "controller/ddpfix/"
RULES_DIR = PACKAGE + "rules/"
#: recorded inputs: a rule's fixtures may hold other rules' expected ids; field logs and recorded reports name theirs
FIXTURES = ("tests/fixtures/", "tests/unit/fixtures/")
#: the user's contract and the history, and the benchmark notes and results (measured reports quoted as they were)
DOCS = frozenset({"README.md", "CHANGELOG.md", "CONTRIBUTING.md", "BENCHMARKS.md"})
MEASURED = re.compile(r"^(benchmarks/[^/]+\.(md|json)|benchmarks/results/.*|docs/.*)$")


def rule_modules() -> dict[str, str]:
    """id -> the rule module (repository path) that declares it."""
    return {r.id: reg.check.__module__.replace(".", "/").replace("ddpfix/", PACKAGE, 1) + ".py"
            for reg in registry.registered() for r in reg.rules}


def _pattern(fid: str) -> re.Pattern[str]:
    # the whole id: not part of a longer one (`a.b` is not in `a.b-c`)
    return re.compile(r"(?<![\w.-])" + re.escape(fid) + r"(?![\w-])")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def _text(path: str, generated: set[str]) -> str:
    try:
        text = (ROOT / path).read_text()
    except (UnicodeDecodeError, OSError):
        return ""
    if path in generated:  # the generated tag lists and fix task names are not hand-written; the rest of the file is
        text = tags._INTERSECT.sub("", tags._TAGS.sub("", text))
        text = tags._FIX_NAME.sub(lambda m: m.group(0)[:m.start("ids") - m.start()] + " | ", text)
    if path == str(tags.WHAT_FILE):
        text = tags._WHAT.sub("", text)
    return text


@functools.cache
def occurrences() -> dict[str, list[str]]:
    """id -> the tracked files outside its rule module, its fixtures, the generated places and DOCS that name it."""
    homes = rule_modules()
    generated = {str(p.relative_to(ROOT)) for p, _ in tags.files(ROOT)}
    texts = {p: _text(p, generated) for p in _tracked()
             if p not in DOCS and not MEASURED.match(p) and not p.startswith(FIXTURES)}
    out: dict[str, list[str]] = {}
    for fid, home in homes.items():
        pat = _pattern(fid)
        out[fid] = [p for p, t in texts.items()
                    if p != home and pat.search(t)]
    return out


def test_ids_only_in_their_places() -> None:
    found = {fid: paths for fid, paths in occurrences().items() if paths}
    assert not found, ("finding ids written by hand outside their rule module, fixtures, generated places and docs "
                       "(read them from the rule object: `from ddpfix.rules import <area> as <area>_rules`, "
                       "`<area>_rules.<NAME>.id`): " + repr(found))


def test_the_guard_sees_a_hand_written_id(tmp_path: Path) -> None:
    """The pattern finds an id written in code, and not a longer id it is the start of."""
    fid = next(iter(registry.RULES))
    assert _pattern(fid).search(f'x = "{fid}"') and not _pattern(fid).search(f'x = "{fid}-other"')
    generated = tags._TAGS.sub("", f"  tags: [env, {fid}]\n- name: Fix {fid} | Write\n")
    assert _pattern(fid).search(tags._FIX_NAME.sub(lambda m: "", generated)) is None


def test_lab_scenarios_declare_registered_ids() -> None:
    for s in SCENARIOS.values():
        assert set(s.findings) | {e.id for e in s.expect} <= set(registry.RULES), s.name


def _area(path: str) -> str:
    if path.startswith(RULES_DIR):
        return "rules/ (another area)"
    if path.startswith(PACKAGE):
        return "controller/ddpfix outside rules/"
    return path.split("/")[0] + "/" if "/" in path else path


def report() -> str:
    found = occurrences()
    lines = [f"{fid}: {len(paths)} file(s): {', '.join(paths)}" for fid, paths in found.items() if paths]
    by_area = Counter(_area(p) for paths in found.values() for p in paths)
    lines += ["", "(id, file) pairs outside the rule module, fixtures, generated places and docs, by area:"]
    lines += [f"  {n:4d}  {area}" for area, n in sorted(by_area.items())]
    lines.append(f"  {sum(by_area.values()):4d}  total; ids with any: {sum(1 for v in found.values() if v)} of "
                 f"{len(found)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(report() + "\n")
