"""The linear strategy, plus a graceful stop: once the file named by DDPFIX_STOP_FILE exists (the ddpfix controller
creates it on Ctrl-C/SIGTERM), no new step starts. A step is a play-level task (in ddpfix's plays: one role, e.g.
the firewall fix with its runtime change, connection check and persistence); a role already started runs to its end,
so a node is never left with a runtime-only firewall change. Handlers already notified and the node-lock tasks
(role ``ddpfix_run``, its lock and unlock task files) still run, so a node is never left locked or half-restarted."""

from __future__ import annotations

DOCUMENTATION = r"""
name: ddpfix_linear
short_description: linear, stopping before the next task once the ddpfix stop file exists
description:
  - Behaves like C(linear). When the file named by the environment variable C(DDPFIX_STOP_FILE) exists, every later
    play-level task is skipped (not run at all), except meta tasks and tasks whose name starts with C(lock |). Tasks
    of a role that already started, and handlers, still run.
author: ddpfix
"""

import os
from typing import Any

from ansible.playbook.handler import Handler
from ansible.plugins.strategy.linear import StrategyModule as LinearStrategy
from ansible.utils.display import Display

display = Display()

#: Tasks that still run after a stop request: the node lock's includes (role ddpfix_run, its lock and unlock task
#: files), known by what they include, whatever they are named.
LOCK_ROLE = "ddpfix_run"
LOCK_TASK_FILES = ("lock", "unlock")
#: Tag of the facts role's second-round tasks (collect a detached prober): not iterated when no prober was detached.
COLLECT_TAG = "ddpfix_facts_collect"


def is_lock_include(task: Any) -> bool:
    """An include_role/import_role of ddpfix_run's lock or unlock tasks (FQCN or short names)."""
    if str(task.action).rsplit(".", 1)[-1] not in ("include_role", "import_role"):
        return False
    args = task.args or {}
    return (str(args.get("name") or "").rsplit(".", 1)[-1] == LOCK_ROLE
            and str(args.get("tasks_from") or "").removesuffix(".yml") in LOCK_TASK_FILES)


def stop_requested() -> bool:
    path = os.environ.get("DDPFIX_STOP_FILE")
    return bool(path) and os.path.exists(path)


def detached_prober(facts: Any) -> bool:
    """The node's facts name a detached prober (`ddpfix_node.probe.result_path`) that a second task must collect."""
    node = facts.get("ddpfix_node") if isinstance(facts, dict) else None
    probe = node.get("probe") if isinstance(node, dict) else None
    return isinstance(probe, dict) and probe.get("result_path") is not None


class StrategyModule(LinearStrategy):
    def _get_next_task_lockstep(self, hosts, iterator):  # type: ignore[override]
        while True:
            host_tasks = super()._get_next_task_lockstep(hosts, iterator)
            if host_tasks and self._no_prober_to_collect(host_tasks):
                continue  # every node ran at once: the collect tasks are not iterated per node (as --skip-tags)
            if not host_tasks or not stop_requested():
                return host_tasks
            task = host_tasks[0][1]
            name = task.get_name() or ""
            if (isinstance(task, Handler) or task._role is not None
                    or task.action in ("meta", "ansible.builtin.meta") or is_lock_include(task)):
                return host_tasks  # a role that started finishes; the lock is always released
            display.display(f"ddpfix: stop requested, not starting: {name}")
            # the iterator has already moved these hosts past the task: dropping it skips it

    def _no_prober_to_collect(self, host_tasks: list[tuple[Any, Any]]) -> bool:
        """A task of the facts role's second round (tag COLLECT_TAG) when no node of this step left a prober
        detached (all ran at once: forks >= nodes). Its `when` would skip it on every node; dropping it spares a
        worker per node. With a detached prober anywhere, the task runs and its `when` decides per node."""
        tasks = [t for _, t in host_tasks if t.action not in ("meta", "ansible.builtin.meta")]
        if not tasks or COLLECT_TAG not in (tasks[0].tags or []):
            return False
        for host, _ in host_tasks:
            try:
                facts = self._variable_manager._fact_cache.get(host.name)
            except KeyError:
                continue
            if detached_prober(facts):
                return False
        return True
