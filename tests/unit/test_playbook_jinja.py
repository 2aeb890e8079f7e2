"""Playbooks carry out what the plan decided (issue 38 item 1: decide once, in Python): no Jinja expression or
statement in `playbooks/` spans more than 5 lines. A longer one is a decision (which fixes, which files, which paths)
that belongs in the plan (`ddpfix.remediate`: `HostPlan.to_vars`, `remediate_extravars`) or a plugin, where it is
tested without hosts; the playbook then reads the value."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
MAX_LINES = 5
_CLOSE = {"{{": "}}", "{%": "%}"}
_PAIRS = {"(": ")", "[": "]", "{": "}"}


def jinja_blocks(text: str) -> Iterator[tuple[int, str]]:
    """Every `{{ ... }}` and `{% ... %}` of `text`: (its first line, its text). Quotes and brackets inside are
    skipped over, so a dict literal's `}}` does not end the expression."""
    i = 0
    while (start := min((j for j in (text.find("{{", i), text.find("{%", i)) if j >= 0), default=-1)) >= 0:
        close, stack, quote, j = _CLOSE[text[start:start + 2]], [], "", start + 2
        while j < len(text):
            c = text[j]
            if quote:
                quote = "" if c == quote else quote
            elif c in "'\"":
                quote = c
            elif not stack and text.startswith(close, j):
                break
            elif c in _PAIRS:
                stack.append(_PAIRS[c])
            elif stack and c == stack[-1]:
                stack.pop()
            j += 1
        yield text.count("\n", 0, start) + 1, text[start:j + 2]
        i = j + 2


def test_the_scanner_finds_whole_expressions() -> None:
    text = "a: \"{{ {'x': {'y': 1}} if b else omit }}\"\nb: >-\n  {{ c\n     | d }}\n{% if x %}\n"
    assert list(jinja_blocks(text)) == [(1, "{{ {'x': {'y': 1}} if b else omit }}"), (3, "{{ c\n     | d }}"),
                                        (5, "{% if x %}")]


@pytest.mark.parametrize("playbook", sorted(p.name for p in PLAYBOOKS.glob("*.yml")))
def test_no_jinja_longer_than_5_lines(playbook: str) -> None:
    text = (PLAYBOOKS / playbook).read_text(encoding="utf-8")
    long = [(line, block.count("\n") + 1) for line, block in jinja_blocks(text) if block.count("\n") + 1 > MAX_LINES]
    assert not long, (f"{playbook}: Jinja over {MAX_LINES} lines at (line, lines) {long}: compute the value in Python "
                      "(the plan's extra vars) and read it here")
