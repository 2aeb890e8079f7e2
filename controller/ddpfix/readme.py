"""The README's generated sections, each between `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers: the findings
table (from the rule registry), the failures `ddpfix explain` recognises (from its pattern table) and the lab's
scenario list (from the lab's scenario registry, as `ddpfix lab up --help` prints it). A unit test fails when
README.md differs; regenerate with (the same command regenerates the rule-id tags of the roles' fix tasks and of
playbooks/remediate.yml from the registry: ``ddpfix.rules.tags``)

    PYTHONPATH=controller .venv/bin/python -m ddpfix.readme README.md
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from ddpfix.cli.lab import scenarios_text
from ddpfix.diagnose import match as explain
from ddpfix.rules import registry as rules


def _rules() -> str:

    rules.load()  # every module that registers rules
    return rules.markdown()


def _explain_patterns() -> str:

    return explain.markdown()


def _lab_scenarios() -> str:

    return "```\n" + scenarios_text() + "```\n"


#: section name -> what goes between its markers
SECTIONS: dict[str, Callable[[], str]] = {"rules": _rules, "lab-scenarios": _lab_scenarios,
                                          "explain-patterns": _explain_patterns}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"


def current(text: str, name: str) -> str | None:
    """What README text holds between the markers of section `name` (None: no such section)."""
    begin, end = markers(name)
    m = re.search(re.escape(begin) + "(.*?)" + re.escape(end), text, re.DOTALL)
    return m.group(1) if m else None


def sync(text: str) -> str:
    """README text with every generated section regenerated (a missing section is a ValueError)."""
    for name, make in SECTIONS.items():
        begin, end = markers(name)
        if current(text, name) is None:
            raise ValueError(f"no {begin.strip()} ... {end} section")
        head, rest = text.split(begin, 1)
        text = head + begin + make() + end + rest.split(end, 1)[1]
    return text


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m ddpfix.readme README.md\n")
        return 2
    path = Path(args[0])
    try:
        path.write_text(sync(path.read_text()))
    except ValueError as exc:
        sys.stderr.write(f"{path}: {exc}\n")
        return 2
    from ddpfix.rules import tags  # the registry's checks load only for this command

    tags.sync(path.resolve().parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
