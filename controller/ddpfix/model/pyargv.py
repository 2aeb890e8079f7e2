"""The one place that says what `ddp_python` is: the interpreter the jobs run, as the argv that starts it. A leaf:
imports nothing of ddpfix.

A string is one word, an interpreter's absolute path or a command name (`python3`, `/opt/venv/bin/python`). A list
is the jobs' own launch, a container runtime's for example (`[docker, run, --rm, --network, host, IMAGE, python3]`,
`[enroot, start, IMAGE, python3]`, `[apptainer, exec, IMAGE.sif, python3]`). ddpfix appends its own arguments
(`-c CODE`, `-m torch.distributed.run ...`) and starts it without a shell: no word is expanded, quoted or rendered as a
template, so a word that only a shell or Jinja would give a meaning is refused rather than passed on literally.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence
from typing import Any

#: the first word: a command name (looked up in PATH) or a normalized absolute path
COMMAND = re.compile(r"[A-Za-z0-9._+-]{1,255}")
ABS_PATH = re.compile(r"(/[A-Za-z0-9._+@:-]+)+")
#: bounds: words, one word's characters, all words' characters
MAX_WORDS = 32
MAX_WORD = 1024
MAX_TOTAL = 4096
#: what a shell or Jinja would expand; ddp_python is never run by a shell nor rendered
EXPANSIONS = ("$(", "${", "`", "{{", "{%", "{#")
DEFAULT = "python3"


def _first_word(s: str) -> bool:
    return bool(COMMAND.fullmatch(s) or (ABS_PATH.fullmatch(s) and posixpath.normpath(s) == s))


def argv_problem(value: Any) -> str | None:
    """Why `value` is not a ddp_python (None: it is one)."""
    if isinstance(value, str):
        if _first_word(value):
            return None
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            return "contains a newline or another control character"
        if len(value.split()) > 1:
            return ("must be one word (an absolute path or a command name); write a command with arguments, such as "
                    "a container runtime's, as a YAML list: [docker, run, --rm, --network, host, IMAGE, python3]")
        return "must be an absolute path or a command name, without whitespace or shell characters"
    if not isinstance(value, (list, tuple)):
        return f"must be a string or a list of strings, not {type(value).__name__}"
    if not value:
        return "is an empty list (leave it unset for python3)"
    if len(value) > MAX_WORDS:
        return f"has {len(value)} words, at most {MAX_WORDS}"
    for i, word in enumerate(value):
        if not isinstance(word, str):
            return f"word {i + 1} ({word!r}) is not a string (quote it in YAML)"
        if not word:
            return f"word {i + 1} is empty"
        if len(word) > MAX_WORD:
            return f"word {i + 1} has {len(word)} characters, at most {MAX_WORD}"
        if any(ord(c) < 32 or ord(c) == 127 for c in word):
            return f"word {i + 1} contains a newline or another control character"
        if any(x in word for x in EXPANSIONS):
            return (f"word {i + 1} ({word!r}) holds a shell or template expansion; ddp_python runs without a shell "
                    "and is never rendered, so write the value itself")
    if sum(len(w) for w in value) > MAX_TOTAL:
        return f"is longer than {MAX_TOTAL} characters"
    if not _first_word(value[0]):
        return f"its first word {value[0]!r} must be an absolute path or a command name"
    return None


def shown_value(value: Any, limit: int = 160) -> str:
    """The value as a refusal names it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...]"


def argv(value: Any) -> list[str]:
    """ddp_python as the argv it is started with (the caller checked it with argv_problem)."""
    return [value] if isinstance(value, str) else [str(w) for w in value]


def shown(value: str | Sequence[str]) -> str:
    """ddp_python as one line for reports and commands an operator copies (shell-quoted words)."""
    return value if isinstance(value, str) else shlex.join(value)
