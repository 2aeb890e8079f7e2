"""The rule-id tags of the fix tasks, generated from the registry: every tag list of a role's tasks (and of
playbooks/remediate.yml) that holds a finding id is rewritten as its non-id tags plus the ids of every rule whose
remedy names one of those tags (``Remedy.tags``; "" for a role task that carries ids only) for that role (any role
in remediate.yml). So is every `intersect([...])` list of quoted tags that holds an id (remediate.yml's "was this
group asked for by --tags" tests). `python -m ddpfix.readme README.md` rewrites them with the README; a unit test
fails when stale.
"""

from __future__ import annotations

import re
from pathlib import Path

from ddpfix.rules import registry

ID_TAG = re.compile(r"^[a-z]+\.[a-z0-9-]+$")  # a dotted finding id (role tags like `env` or `always` are not)
#: a task's tag list in flow style, possibly over several lines: `tags: [a, b,\n   c]`
_TAGS = re.compile(r"^(?P<indent>[ \t]*)tags: \[(?P<items>[^\]]*)\]", re.M)
#: a Jinja list of quoted tags a condition tests the run's tags against: `intersect(['env', 'env.<id>', ...])`
_INTERSECT = re.compile(r"intersect\(\[(?P<items>[^\]]*)\]")
WIDTH = 120


def _ids(keywords: list[str], role: str | None) -> list[str]:
    """The ids of the rules whose remedy (of `role`; any role when None) is one of the task groups `keywords`."""
    groups = set(keywords) or {""}
    return [r.id for r in registry.RULES.values()
            if any((role is None or m.role == role) and groups & set(m.tags) for m in r.remedies)]


def _line(indent: str, items: list[str]) -> str:
    """`tags: [...]` wrapped at WIDTH, continuation lines aligned after the bracket."""
    return _wrap(f"{indent}tags: [", items)


def _wrap(head: str, items: list[str]) -> str:
    """`head` (a line's text up to its list's `[`) and `items`, then `]`: wrapped at WIDTH, continuation lines
    aligned after the bracket."""
    lines, cur = [], head
    for i, item in enumerate(items):
        word = item + ("]" if i == len(items) - 1 else ",")
        if cur != head and len(cur) + 1 + len(word) > WIDTH:
            lines.append(cur)
            cur = " " * len(head) + word
        else:
            cur += ("" if cur == head else " ") + word
    lines.append(cur)
    return "\n".join(lines)


def sync_text(text: str, role: str | None) -> str:
    """`text` (a task file of `role`, or remediate.yml when None) with every id-holding tag list regenerated."""
    def fix(m: re.Match[str]) -> str:
        items = [t.strip() for t in m.group("items").replace("\n", " ").split(",") if t.strip()]
        if not any(ID_TAG.match(t) for t in items):
            return m.group(0)
        keywords = [t for t in items if not ID_TAG.match(t)]
        return _line(m.group("indent"), keywords + _ids(keywords, role))

    def fix_intersect(m: re.Match[str]) -> str:
        items = [t.strip().strip("'") for t in m.group("items").replace("\n", " ").split(",") if t.strip()]
        if not any(ID_TAG.match(t) for t in items):
            return m.group(0)
        keywords = [t for t in items if not ID_TAG.match(t)]
        prefix = m.string[m.string.rfind("\n", 0, m.start()) + 1:m.start()]  # the line's text before `intersect`
        quoted = [f"'{t}'" for t in keywords + _ids(keywords, role)]
        return _wrap(prefix + "intersect([", quoted)[len(prefix):]

    return _INTERSECT.sub(fix_intersect, _TAGS.sub(fix, text))


def files(root: Path) -> list[tuple[Path, str | None]]:
    """(file, its role; None: the remediate playbook) of every file whose tags are generated."""
    roles = sorted({m.role for r in registry.RULES.values() for m in r.remedies})
    out: list[tuple[Path, str | None]] = [(p, role) for role in roles
                                          for p in sorted((root / "roles" / role / "tasks").glob("*.yml"))]
    return [*out, (root / "playbooks" / "remediate.yml", None)]


def stale(root: Path) -> list[Path]:
    """The files whose tags differ from the registry's."""
    return [p for p, role in files(root) if sync_text(p.read_text(), role) != p.read_text()]


def sync(root: Path) -> None:
    """Rewrite every generated tag list under `root` (the repository)."""
    for p, role in files(root):
        text = p.read_text()
        if (new := sync_text(text, role)) != text:
            p.write_text(new)
