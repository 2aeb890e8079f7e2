"""Regenerate every generated region of the repository from the registries: the docs (tools/docs.py: the findings
table and one page per finding, the lab's scenario list, the failures `ddpfix explain` names) and the fix tasks' tags
and names (tools/tags.py). Run from the repository root after changing a rule, a scenario or an explain pattern:

    PYTHONPATH=controller .venv/bin/python -m tools.generate          # rewrite
    PYTHONPATH=controller .venv/bin/python -m tools.generate --check  # list what is stale, exit 1 if anything is

tools/ is the repository's, not the package's: nothing under controller/ddpfix imports it, and neither the wheel nor
the collection ships it. Unit tests (tests/unit/tools/) fail when a generated region is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools import docs, tags

ROOT = Path(__file__).resolve().parents[1]


def stale(root: Path = ROOT) -> list[str]:
    return [*docs.stale(root), *(str(p.relative_to(root)) for p in tags.stale(root))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="list the stale files and exit 1 when there is one")
    args = ap.parse_args(argv)
    try:
        if args.check:
            found = stale()
            for p in found:
                sys.stdout.write(f"stale: {p}\n")
            return 1 if found else 0
        docs.write(ROOT)
        tags.sync(ROOT)
    except ValueError as exc:  # a region without its markers
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
