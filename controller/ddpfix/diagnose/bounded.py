"""Log text is hostile input: a paste from anywhere, or what a node printed. This module bounds it before anything
matches it, and makes it safe to show.

- `cap_bytes` cuts an input at a byte cap and says so (`explain` reads 64 MiB; `verify` keeps 1 MiB of what each
  node printed, its first and last halves, `cap_text`): what is cut is reported, never dropped in silence.
- `for_matching` cuts each line at `MAX_LINE` characters and removes terminal control sequences (colours, but also
  OSC window titles and clipboard writes, DCS, C1 CSI), so a regex sees plain text of bounded length. Every regex
  of the table (`diagnose.patterns`) is written to run in linear time on such a line: no `X.*Y` span that retries
  from every occurrence of X (see `then`), bounded classes after a repeated literal; a unit test runs each one on
  long adversarial lines.
- `shown` is the text a human sees: colour codes dropped, every other control character escaped (`\\x1b`, `\\x9b`,
  `\\r`, bidi overrides as `\\u202e`), so a pasted log cannot write to the clipboard, retitle the terminal or hide
  text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: characters of one line that are matched (a real log line, a long C++ exception included, is under 4 KiB)
MAX_LINE = 8192
#: bytes `ddpfix explain` reads of its input (all files together)
MAX_LOG_BYTES = 64 * 1024 * 1024
#: bytes of one node's output (stdout and stderr each) that `verify` matches
MAX_NODE_BYTES = 1024 * 1024

#: a terminal control sequence: CSI (7-bit ESC [ and C1 0x9b), OSC / DCS / SOS / PM / APC strings (7-bit and C1)
#: up to their terminator (BEL, ST) or the end of the line, and two-character escapes. Linear: each alternative
#: starts at an ESC or C1 character and scans forward once.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?")
#: colour and text attributes only (SGR): dropped from shown text, harmless to lose
_SGR = re.compile(r"\x1b\[[0-9;:]*m")
_C1 = re.compile("[\x80-\x9f]")
_NAMED = {"\t": "\\t", "\r": "\\r", "\n": "\\n"}
_INVISIBLE = (0x200B, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF)
_ESCAPES = {c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES.update({c: f"\\u{c:04x}" for c in _INVISIBLE})


@dataclass(frozen=True)
class Capped:
    """Text cut at a cap: what was kept and how many bytes beyond the cap were not read or not kept."""

    text: str
    dropped: int = 0  # bytes beyond the cap; -1: some, not counted (a stream read up to the cap)

    def note(self, what: str, cap: int) -> str | None:
        """The line that reports the cut, None when nothing was cut."""
        if not self.dropped:
            return None
        how = "the rest was" if self.dropped < 0 else f"{self.dropped} more bytes were"
        return f"{what} is longer than the {_size(cap)} cap: {how} not matched (only {_size(cap)} of it was)"


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n // 1024} KiB"


def cap_bytes(data: bytes, cap: int, *, more: bool = False) -> Capped:
    """`data` decoded (bytes that are not UTF-8 replaced) and cut at `cap` bytes; `more`: the reader stopped at the
    cap and more input followed (its size unknown)."""
    dropped = len(data) - cap if len(data) > cap else (-1 if more else 0)
    return Capped(data[:cap].decode("utf-8", errors="replace"), dropped)


def cap_text(text: str, cap: int = MAX_NODE_BYTES) -> Capped:
    """A node's output (already text) cut at `cap` bytes: its first and last halves are kept (the first failure
    is near the start, the exception that ended the run at the end), with a line where the middle was cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= cap:
        return Capped(text)
    half = cap // 2
    head = data[:half].decode("utf-8", errors="replace")
    tail = data[len(data) - half:].decode("utf-8", errors="replace")
    dropped = len(data) - 2 * half
    return Capped(f"{head}\n[ddpfix: {dropped} bytes cut here]\n{tail}", dropped)


def plain(line: str) -> str:
    """One line as a regex sees it: control sequences removed, cut at `MAX_LINE` characters (cut first, so the
    removal itself runs on a bounded line)."""
    line = line[:MAX_LINE]
    if "\x1b" in line or _C1.search(line):
        line = _SEQUENCE.sub("", line)
    return line


def for_matching(lines: Iterable[str]) -> list[str]:
    return [plain(ln.rstrip("\r\n")) for ln in lines]


def long_lines(lines: Iterable[str]) -> int:
    """How many lines are longer than what is matched of them."""
    return sum(len(ln) > MAX_LINE for ln in lines)


def shown(text: str, limit: int = 300) -> str:
    """Log text made safe to print: colour codes dropped, every other control character escaped, cut at `limit`
    characters (before escaping, so an escape is never cut in half)."""
    return _SGR.sub("", text[:MAX_LINE]).strip()[:limit].translate(_ESCAPES)


def then(first: str, later: str) -> str:
    """The regex `first.*later` written to run in linear time on one line. Python's `re` retries `.*later` from
    every place `first` matches, scanning to the end each time (quadratic on a line that repeats `first`); this
    form scans to the first `first` once (`first` holds no group and matches a bounded length) and looks for
    `later` after it: it matches the same lines."""
    return rf"^(?:(?!{first}).)*{first}.*{later}"
