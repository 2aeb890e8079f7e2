"""Remediation's changes: what a run changed (or would change), one `Change` per task or file, its diff rendered."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from ddpfix.ansible.results import RunResult
from ddpfix.plan import redact_env
from ddpfix.remediate.plan import FILE_RULES
from ddpfix.rules.registry import RULES


@dataclass
class Change:
    host: str
    task: str
    diff: str
    rules: tuple[str, ...] = ()  # the ids of the findings the change fixes (its task's rule-id tags, or its file's)


def changes_of(run: RunResult) -> list[Change]:
    """One change per changed task; a task that writes several files (ddpfix_node_files: its `files`) one per
    changed file, named by what it is."""
    out: list[Change] = []
    for host, hr in sorted(run.hosts.items()):
        for t in hr.tasks:
            if t.status != "changed":
                continue
            files = t.res.get("files") if isinstance(t.res, dict) and t.action.endswith("ddpfix_node_files") else None
            if isinstance(files, list) and files:
                out += [Change(host, str(f.get("what") or t.task), render_diff(f.get("diff")),
                               FILE_RULES.get(str(f.get("key")), ()))
                        for f in files if isinstance(f, dict) and f.get("changed")]
                continue
            out.append(Change(host, t.task, render_diff(t.res.get("diff")), tuple(x for x in t.tags if x in RULES)))
    return out


def render_diff(diff: Any) -> str:
    items = diff if isinstance(diff, list) else [diff] if isinstance(diff, dict) else []
    chunks = []
    for d in items:
        if not isinstance(d, dict):
            continue
        if "prepared" in d:
            chunks.append(redact_env(str(d["prepared"])).rstrip())
            continue
        before, after = d.get("before"), d.get("after")
        if isinstance(before, str) and isinstance(after, str):
            # the modules redact already; a diff from any other module gets the same treatment here
            before, after = redact_env(before), redact_env(after)
            a = d.get("before_header", "before")
            b = d.get("after_header", "after")
            chunks.append("".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), a, b)).rstrip())
        elif before is not None or after is not None:
            chunks.append(f"- {before}\n+ {after}")
    return "\n".join(c for c in chunks if c)
