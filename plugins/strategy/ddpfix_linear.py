"""The linear strategy, plus a graceful stop: once the file named by DDPFIX_STOP_FILE exists (the ddpfix controller
creates it on Ctrl-C/SIGTERM), no new step starts. A step is a play-level task (in ddpfix's plays: one role, e.g.
the firewall fix with its runtime change, connection check and persistence); a role already started runs to its end,
so a node is never left with a runtime-only firewall change. Handlers already notified and the node-lock includes
(ddpfix_run's lock and unlock tasks) still run, so a node is never left locked or half-restarted."""

from __future__ import annotations

DOCUMENTATION = r"""
name: ddpfix_linear
short_description: linear, stopping before the next task once the ddpfix stop file exists
description:
  - Behaves like C(linear). When the file named by the environment variable C(DDPFIX_STOP_FILE) exists, every later
    play-level task is skipped (not run at all), except meta tasks and the includes of C(ddpfix_run)'s lock and unlock
    tasks. Tasks of a role that already started, and handlers, still run.
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


class StrategyModule(LinearStrategy):
    def _get_next_task_lockstep(self, hosts, iterator):  # type: ignore[override]
        while True:
            host_tasks = super()._get_next_task_lockstep(hosts, iterator)
            if not host_tasks or not stop_requested():
                return host_tasks
            task = host_tasks[0][1]
            name = task.get_name() or ""
            if (isinstance(task, Handler) or task._role is not None
                    or task.action in ("meta", "ansible.builtin.meta") or is_lock_include(task)):
                return host_tasks  # a role that started finishes; the lock is always released
            display.display(f"ddpfix: stop requested, not starting: {name}")
            # the iterator has already moved these hosts past the task: dropping it skips it
