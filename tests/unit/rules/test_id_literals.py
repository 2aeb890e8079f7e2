"""Finding ids are written once: in their rule module (``ddpfix/rules/<area>.py``), their fixtures
(``tests/fixtures/rules/<id>/``), the generated places (README.md's table, the roles' and remediate.yml's tag lists)
and the docs. Everything else reads them from the registry (``ddpfix.rules.registry.RULES``) or a rule attribute.

The guard: a NEW hand-written id in ``controller/ddpfix`` outside its own rule module (another area's module
included: it imports the rule object) fails ``test_no_new_id_literals``; what remains is ALLOWED below, each with
its reason. ``python tests/unit/rules/test_id_literals.py`` prints, for each id,
every file outside those places where the literal appears (tests about one finding may name it; they are listed too).
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from ddpfix.lab.scenarios.registry import SCENARIOS
from ddpfix.rules import registry, tags

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "controller/ddpfix/"
RULES_DIR = PACKAGE + "rules/"
#: Where an id is written by design besides its rule module and fixtures: the user's contract and the history.
FIXTURES = "tests/fixtures/rules/"  # recorded facts: a rule's fixtures may hold other rules' expected ids
DOCS = frozenset({"README.md", "CHANGELOG.md", "CONTRIBUTING.md"})

#: Files under controller/ddpfix outside rules/ whose ids are DATA, each validated against the registry by a test:
#: file -> why the literals stay (and which test checks them). Everything else reads ids from the registry, a rule
#: object (``rules.reachability.INVALID.id``) or a registry query (``fixed_by``, ``area_ids``, ``scoped``).
ALLOWED: dict[str, str] = {
    "controller/ddpfix/diagnose/patterns.py":
        "a log pattern names the findings to look at for that failure, a many-to-many map of the patterns' own "
        "(a rule does not know the logs); checked by test_explain.py::test_pattern_finding_ids_exist",
    **{f"controller/ddpfix/lab/scenarios/{area}.py":
       "a lab scenario declares the findings it must raise, as test data beside the fault it injects (production "
       "rules must not know the lab); checked by test_lab_scenarios_declare_registered_ids"
       for area in ("clock", "fabric", "firewall", "host", "hosts", "netif", "sites")},
}


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
    if path in generated:  # the generated tag lists are not hand-written; the rest of the file is
        text = tags._INTERSECT.sub("", tags._TAGS.sub("", text))
    return text


@functools.cache
def occurrences() -> dict[str, list[str]]:
    """id -> the tracked files outside its rule module, its fixtures, the generated places and DOCS that name it."""
    homes = rule_modules()
    generated = {str(p.relative_to(ROOT)) for p, _ in tags.files(ROOT)}
    texts = {p: _text(p, generated) for p in _tracked() if p not in DOCS}
    out: dict[str, list[str]] = {}
    for fid, home in homes.items():
        pat = _pattern(fid)
        out[fid] = [p for p, t in texts.items()
                    if p != home and not p.startswith(FIXTURES) and pat.search(t)]
    return out


def controller_literals(found: dict[str, list[str]]) -> set[tuple[str, str]]:
    """(file, id) for every id written in controller/ddpfix outside its rule module."""
    return {(p, fid) for fid, paths in found.items() for p in paths if p.startswith(PACKAGE)}


def test_no_new_id_literals() -> None:
    new = {(p, fid) for p, fid in controller_literals(occurrences()) if p not in ALLOWED}
    assert not new, ("finding ids written by hand in controller/ddpfix outside their rule module (read them from the "
                     "rule object, the registry or a rule attribute, or add the file to ALLOWED with the reason): "
                     + repr(sorted(new)))


def test_allow_list_is_current() -> None:
    stale = ALLOWED.keys() - {p for p, _ in controller_literals(occurrences())}
    assert not stale, f"ALLOWED names files that hold no id: {sorted(stale)}"


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
    lines += ["", "controller/ddpfix outside the id's rule module (file: ids):"]
    by_file: dict[str, list[str]] = {}
    for p, fid in sorted(controller_literals(found)):
        by_file.setdefault(p, []).append(fid)
    lines += [f"  {p}{' (allowed: data)' if p in ALLOWED else ''}: {', '.join(ids)}" for p, ids in by_file.items()]
    by_area = Counter(_area(p) for paths in found.values() for p in paths)
    lines += ["", "(id, file) pairs outside the rule module, fixtures, generated places and docs, by area:"]
    lines += [f"  {n:4d}  {area}" for area, n in sorted(by_area.items())]
    lines.append(f"  {sum(by_area.values()):4d}  total; ids with any: {sum(1 for v in found.values() if v)} of "
                 f"{len(found)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(report() + "\n")
