"""The grammars a node's values are checked against (names, addresses, fixed formats, short sysfs words), free
text as one printable line, and the checker that records each value that fails its grammar as a problem."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Problem = tuple[str, str, str]  # (field, value, why)

#: Names the hosts block never manages (and a node's hostname must not be): the loopback and IPv6 well-known names.
RESERVED_NAMES = ("localhost", "localhost.localdomain", "localhost4", "localhost4.localdomain4", "localhost6",
                  "localhost6.localdomain6")
MAC = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5,19}$")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # hosts_block_sha256



#: what a shown value must not carry: C0/C1 controls but tab (line breaks, escapes, NUL), Unicode line separators
#: and lone surrogates (undecodable bytes): `one_line` writes them as Python escapes
UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
#: the longest free-text value kept (error messages, /etc/hosts lines); longer ones are cut, marked with '...'
FREE_TEXT_MAX = 2000
#: fact subtrees that are machine text parsed on the controller, line by line (iptables-save, nft), not shown whole
PARSED_TEXT = ("firewall",)


def one_line(text: str, limit: int = FREE_TEXT_MAX) -> str:
    """`text` as one printable line: control characters, line separators and lone surrogates as Python escapes
    (`\\n`, `\\x1b`, `\\udcff`), cut at `limit` characters."""
    out = UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)
    return out if len(out) <= limit else out[:limit] + "..."


def _line(text: str) -> str:
    return text if len(text) <= FREE_TEXT_MAX and not UNPRINTABLE.search(text) else one_line(text)


def neutral(value: Any) -> Any:
    """Every string of a (free-text) fact subtree as one printable line; dict keys too. (JSON types only: what a
    module returns.)"""
    if isinstance(value, str):
        return _line(value)
    if isinstance(value, dict):
        return {(_line(k) if isinstance(k, str) else k): neutral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [neutral(v) for v in value]
    return value


_JSON_ESCAPE = re.compile(rf'\\[^"\\/t]|"[^"]{{{FREE_TEXT_MAX},}}"')  # not \t: a tab stays


def printable_json(value: Any) -> bool:
    """Whether `value` surely holds no string `_line` would change, from its JSON text alone (escapes of a control
    character, line separator or non-ASCII character, or a string that long), a scan at C speed; False: walk it."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return False
    return _JSON_ESCAPE.search(text) is None


def is_reserved_name(name: str) -> bool:
    n = name.lower()
    return n in RESERVED_NAMES or n.startswith("ip6-")


def is_hostname(s: str) -> bool:
    """An RFC 1123 host name (labels of letters, digits and inner hyphens; at most 253 characters)."""
    if not s or len(s) > 253 or s.endswith("."):
        return False
    labels = s.split(".")
    if all(lbl.isdigit() for lbl in labels):
        return False
    return all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", lbl) for lbl in labels)


def int_in(lo: int, hi: int) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def matches(rx: re.Pattern[str]) -> Callable[[object], bool]:
    return lambda v: isinstance(v, str) and rx.fullmatch(v) is not None


def optional(ok: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or ok(v)


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def show_value(v: object) -> str:
    return str(v)[:200]


class Checker:
    """Collects problems while walking one node's facts; `ok(field, value, test, why)` says whether to keep it."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def ok(self, fld: str, value: object, test: Callable[[object], bool], why: str) -> bool:
        if test(value):
            return True
        self.problems.append((fld, show_value(value), why))
        return False
