"""The tags a task was written with, read from its file: ansible-runner's events name a task's file and line
(`task_path`, `FILE:LINE`) but not its tags. A task's tags here are its own and those of the blocks (and the play)
around it in that file; tags an include or import adds at run time are not read (the fix tasks carry their rule ids
themselves: tools/tags.py generates them)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: the keys whose task lists inherit a block's (or a play's) tags
_TASK_LISTS = ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers")


def task_tags(task_path: str) -> tuple[str, ...]:
    """The tags of the task at `task_path` (`FILE:LINE`, as ansible-runner's events give it); () when the file cannot
    be read or holds no task at that line."""
    path, sep, line = task_path.rpartition(":")
    if not sep or not line.isdigit():
        return ()
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return _tags_by_line(path, st.st_mtime_ns, st.st_size).get(int(line), ())


@functools.lru_cache(maxsize=64)
def _tags_by_line(path: str, mtime_ns: int, size: int) -> dict[int, tuple[str, ...]]:
    """Line (1-based, where Ansible says the task starts) -> tags, for every task, block and play of the file."""
    del mtime_ns, size  # the cache key's: a file rewritten is read again
    try:
        # libyaml's parser where PyYAML has it (15x faster on the playbooks; the same nodes and marks)
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=_LOADER)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    out: dict[int, tuple[str, ...]] = {}
    _walk(root, (), out)
    return out


def _walk(node: yaml.Node | None, inherited: tuple[str, ...], out: dict[int, tuple[str, ...]]) -> None:
    if not isinstance(node, yaml.SequenceNode):
        return
    for item in node.value:
        if not isinstance(item, yaml.MappingNode):
            continue
        keys = {k.value: v for k, v in item.value if isinstance(k, yaml.ScalarNode)}
        tags = inherited + tuple(t for t in _tag_list(keys.get("tags")) if t not in inherited)
        out[item.start_mark.line + 1] = tags
        for key in _TASK_LISTS:
            _walk(keys.get(key), tags, out)


def _tag_list(node: yaml.Node | None) -> list[str]:
    """`tags: [a, b]`, `tags: a, b` or `tags: a`; templated or other values give none."""
    if isinstance(node, yaml.ScalarNode):
        items = str(node.value).split(",")
    elif isinstance(node, yaml.SequenceNode):
        items = [str(n.value) for n in node.value if isinstance(n, yaml.ScalarNode)]
    else:
        return []
    return [t.strip() for t in items if t.strip() and "{{" not in t]
