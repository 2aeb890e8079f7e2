"""What a node returned to `verify`, read as hostile input: its output capped before the failure table matches it
(`capped_output`), its result lines (`DDPFIX_RESULT {json}`, `DDPFIX_NCCL_RESULT {json}`) parsed and validated
(`result_lines`): a malformed line is a clear error on that node, never a traceback in the controller."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ddpfix.diagnose.bounded import MAX_NODE_BYTES, cap_text, shown

#: the fields a result line carries and their types (`int` accepts no bool; a number is an int or a finite float)
_BOOL, _INT, _NUM, _STR, _LIST = "bool", "int", "number", "str", "list"
TORCH_FIELDS = {"ok": _BOOL, "rank": _INT, "world_size": _INT, "sum": _NUM, "expected": _NUM, "hostname": _STR,
                "seconds": _NUM}
NCCL_FIELDS = {"ok": _BOOL, "rank": _INT, "world_size": _INT, "hostname": _STR, "gpus": _INT, "nccl": _STR,
               "seconds": _NUM, "sweep": _LIST, "skipped": _BOOL, "error": _STR}
_POINT = {"size": _INT, "seconds": _NUM}


class MalformedResult(ValueError):
    """A node's result line that is not the JSON object the verify script prints."""


def capped_output(res: Mapping[str, Any], cap: int = MAX_NODE_BYTES) -> tuple[str, str, list[str]]:
    """A task result's stdout and stderr, each cut at `cap` bytes, and a line for each cut."""
    out: list[str] = []
    notes: list[str] = []
    for key in ("stdout", "stderr"):
        value = res.get(key)
        c = cap_text(value if isinstance(value, str) else "", cap)
        out.append(c.text)
        if note := c.note(f"the node's {key}", cap):
            notes.append(note)
    return out[0], out[1], notes


def _typed(value: Any, kind: str) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, str if kind == _STR else list)


def _check(doc: Any, fields: Mapping[str, str], what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise MalformedResult(f"{what} is not a JSON object")
    for key, kind in fields.items():
        if key in doc and doc[key] is not None and not _typed(doc[key], kind):
            raise MalformedResult(f"{what}: {key} is not a {kind}")
    return doc


def parse_result(line: str, prefix: str, fields: Mapping[str, str]) -> dict[str, Any]:
    """One result line (`prefix` + a JSON object) validated against `fields`; raises MalformedResult."""
    try:
        doc = json.loads(line[len(prefix):])
    except (ValueError, RecursionError) as e:
        raise MalformedResult(f"not JSON ({type(e).__name__})") from None
    doc = _check(doc, fields, "the result")
    for i, pt in enumerate(doc.get("sweep") or []):
        _check(pt, _POINT, f"sweep point {i}")
        if "size" not in pt or "seconds" not in pt or pt["size"] <= 0 or pt["seconds"] < 0:
            raise MalformedResult(f"sweep point {i} has no positive size and seconds")
    return doc


def result_lines(stdout: str, prefix: str, fields: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The valid result lines in a node's stdout, and an error line for each malformed one (its reason and the
    line's start, control characters escaped)."""
    docs: list[dict[str, Any]] = []
    errors: list[str] = []
    for line in stdout.splitlines():
        if not line.startswith(prefix.rstrip()):
            continue
        try:
            docs.append(parse_result(line, prefix.rstrip(), fields))
        except MalformedResult as e:
            errors.append(f"malformed {prefix.strip()} line from the node ({e}): {shown(line, 160)}")
    return docs, errors
