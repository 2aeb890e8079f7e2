"""The rule-id tags of the fix tasks, generated from the registry: every tag list of a role's tasks (and of
playbooks/remediate.yml) that holds a finding id is rewritten as its non-id tags plus the ids of every rule whose
remedy names one of those tags (``Remedy.tags``; "" for a role task that carries ids only) for that role (any role
in remediate.yml). So is every `intersect([...])` list of quoted tags that holds an id (remediate.yml's "was this
group asked for by --tags" tests). `python -m ddpfix.readme README.md` rewrites them with the README; a unit test
fails when stale.

The fix tasks' names are generated the same way: a task named `Fix <ids> | what it does` (STYLE: the finding id in
the fix task's name, as ansible-lockdown names its tasks by rule number) gets as `<ids>` the ids of its own tag list,
or of the block it sits in (`label`). So do the names remediate's report gives the files module ddpfix_node_files
writes (its `WHAT_IDS`, whose ids are those of the role that used to write each file).
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


#: a fix task's name: `- name: Fix <ids> | ...`, the name quoted, plain or folded (`name: >-` then the text)
_FIX_NAME = re.compile(r"^(?P<indent>[ \t]*)- name: (?P<lead>>-\n[ \t]*|[\"']?)Fix (?P<ids>[^|\n]*?) \| ", re.M)
#: the files module's ids of its files (`WHAT_IDS`): `    "hosts": "<ids>",`
_WHAT = re.compile(r'^(?P<lead>    "(?P<key>[a-z_]+)": ")(?P<ids>[a-z0-9., -]+)(?=",$)', re.M)
#: the files of the files module (plugins/module_utils/ddpfix_files.py `WHAT`) and the role of each's ids
WHAT_ROLES = {"hosts": "ddpfix_hosts", "env": "ddpfix_env", "cluster_file": "ddpfix_env"}
WHAT_FILE = Path("plugins/module_utils/ddpfix_files.py")


def label(ids: list[str]) -> str:
    """The ids a fix task's name shows: one or two, or the first two and how many more (all are in its tags)."""
    return ", ".join(ids) if len(ids) <= 2 else f"{ids[0]}, {ids[1]} and {len(ids) - 2} more"


def _task_tags(text: str, start: int, indent: str) -> list[str] | None:
    """The id tags of the task whose `- name:` line starts at `start` (its own `tags:` key, at its keys' indent),
    or None when it has none."""
    keys = indent + "  "
    end = len(text)
    for m in re.finditer(r"^(?P<i>[ \t]*)- ", text[start + 1:], re.M):
        if len(m.group("i")) <= len(indent):
            end = start + 1 + m.start()
            break
    for m in _TAGS.finditer(text, start, end):
        if m.group("indent") == keys:
            return [t.strip() for t in m.group("items").replace("\n", " ").split(",") if ID_TAG.match(t.strip())]
    return None


def _names(text: str) -> str:
    """`text` with every fix task's name carrying the ids of its tags (or its block's): call after the tags."""
    out, last = [], 0
    for m in _FIX_NAME.finditer(text):
        ids = _task_tags(text, m.start(), m.group("indent"))
        if not ids:  # a task inside a block: the nearest enclosing task (less indented) with id tags
            for outer in reversed(list(_FIX_NAME.finditer(text, 0, m.start()))):
                if len(outer.group("indent")) < len(m.group("indent")):
                    ids = _task_tags(text, outer.start(), outer.group("indent"))
                    if ids:
                        break
        if ids:
            out.append(text[last:m.start("ids")] + label(ids))
            last = m.end("ids")
    out.append(text[last:])
    return _FOLDED.sub(_reflow, _LONG_NAME.sub(_fold, "".join(out)))


#: a plain (unquoted, one-line) fix task name longer than WIDTH
_LONG_NAME = re.compile(r"^(?P<indent>[ \t]*)- name: (?P<name>Fix [^'\"\n>].*)$", re.M)


def _fold(m: re.Match[str]) -> str:
    """A fix task name too long for one line as a folded scalar (wrapped by `_reflow`)."""
    if len(m.group(0)) <= WIDTH:
        return m.group(0)
    return f"{m.group('indent')}- name: >-\n{m.group('indent')}    {m.group('name')}"


#: a folded task name (`- name: >-` and its indented lines)
_FOLDED = re.compile(r"^(?P<head>[ \t]*- name: >-\n)(?P<body>(?:(?P<ind>[ \t]+)\S.*\n)(?:(?P=ind)\S.*\n)*)", re.M)


def _reflow(m: re.Match[str]) -> str:
    """A folded name's lines wrapped at WIDTH again (folding turns its line breaks into spaces: the name is the
    same)."""
    ind, words = m.group("ind"), m.group("body").split()
    lines, cur = [], ind
    for w in words:
        if cur != ind and len(cur) + 1 + len(w) > WIDTH:
            lines.append(cur)
            cur = ind + w
        else:
            cur += ("" if cur == ind else " ") + w
    return m.group("head") + "\n".join([*lines, cur]) + "\n"


def what_label(key: str) -> str:
    """The ids the files module names the change of its file `key` by (the ids of the role that writes it)."""
    return label(_ids(["", "hosts", "env"], WHAT_ROLES[key]))


def sync_what(text: str) -> str:
    """The files module's `WHAT_IDS` regenerated."""
    return _WHAT.sub(lambda m: m.group("lead") + what_label(m.group("key")), text)


def sync_text(text: str, role: str | None) -> str:
    """`text` (a task file of `role`, or remediate.yml when None) with every id-holding tag list regenerated, then
    every fix task's name."""
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

    return _names(_INTERSECT.sub(fix_intersect, _TAGS.sub(fix, text)))


def files(root: Path) -> list[tuple[Path, str | None]]:
    """(file, its role; None: the remediate playbook) of every file whose tags are generated."""
    roles = sorted({m.role for r in registry.RULES.values() for m in r.remedies})
    out: list[tuple[Path, str | None]] = [(p, role) for role in roles
                                          for p in sorted((root / "roles" / role / "tasks").glob("*.yml"))]
    return [*out, (root / "playbooks" / "remediate.yml", None)]


def _synced(path: Path, role: str | None, root: Path) -> str:
    text = path.read_text()
    return sync_what(text) if path == root / WHAT_FILE else sync_text(text, role)


def _all(root: Path) -> list[tuple[Path, str | None]]:
    return [*files(root), (root / WHAT_FILE, None)]


def stale(root: Path) -> list[Path]:
    """The files whose tags or fix task names differ from the registry's."""
    return [p for p, role in _all(root) if _synced(p, role, root) != p.read_text()]


def sync(root: Path) -> None:
    """Rewrite every generated tag list and fix task name under `root` (the repository)."""
    for p, role in _all(root):
        if (new := _synced(p, role, root)) != p.read_text():
            p.write_text(new)
