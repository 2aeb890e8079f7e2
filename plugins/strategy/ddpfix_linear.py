"""The linear strategy, plus a graceful stop: once the file named by DDPFIX_STOP_FILE exists (the ddpfix controller
creates it on Ctrl-C/SIGTERM), no new step starts. A step is a play-level task (in ddpfix's plays: one role, e.g.
the firewall fix with its runtime change, connection check and persistence); a role already started runs to its end,
so a node is never left with a runtime-only firewall change. Handlers already notified and the node-lock tasks
(role ``ddpfix_run``, its lock and unlock task files) still run, so a node is never left locked or half-restarted.

It also takes the ddpfix controller lock of the cluster (keyed on its sorted node addresses, ``ddpfix.lock``) in
this process, as soon as the cluster is known (the audit's ``ddpfix_audit_cluster``, registered by its first task
or passed as an extra variable), before any further task runs: a second run on the same nodes, from the CLI or from
ansible-playbook, fails here before any node is contacted. It is held until ansible-playbook exits; it is not taken
when the process's environment names that key in ``DDPFIX_CLUSTER_LOCK`` (the ddpfix CLI holds it already)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: ddpfix_linear
short_description: linear, stopping before the next task once the ddpfix stop file exists
description:
  - Behaves like C(linear). When the file named by the environment variable C(DDPFIX_STOP_FILE) exists, every later
    play-level task is skipped (not run at all), except meta tasks and tasks whose name starts with C(lock |). Tasks
    of a role that already started, and handlers, still run.
  - Once the play has the cluster view C(ddpfix_audit_cluster) (registered or an extra variable), takes the ddpfix
    controller lock of that cluster (its sorted node addresses) before the next task, unless C(DDPFIX_CLUSTER_LOCK)
    names it (the ddpfix CLI holds it); another run holding it fails the play before any node is contacted.
author: ddpfix
"""

import os
from typing import Any

from ansible.errors import AnsibleError
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
#: Tag of tasks whose `when` this strategy evaluates itself, per host, before any worker is started: when it is false
#: for every host of the step, the step is left out (as with --skip-tags: no worker per node, no skip events). The
#: facts role's probe-at-cluster-addresses tasks carry it: they run only for multi-homed inventories.
WHEN_TAG = "ddpfix_when_on_controller"
#: The play's cluster view (action ddpfix_cluster's result, or the CLI's extra variable).
CLUSTER_VIEW = "ddpfix_audit_cluster"
#: The controller locks this process holds (cluster key -> lock), for its lifetime.
_HELD: dict[str, Any] = {}


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


def cluster_addresses(view: Any) -> list[str] | None:
    """The node addresses of a cluster view ({addresses: {name: address}}), None when it has none."""
    addresses = view.get("addresses") if isinstance(view, dict) and not view.get("failed") else None
    if not isinstance(addresses, dict) or not addresses:
        return None
    return [str(a or n) for n, a in addresses.items()]


def hold_cluster_lock(addresses: list[str]) -> None:
    """Take the controller lock of these nodes for this process (AnsibleError naming the holder when another run
    has it); nothing when this process, or the ddpfix CLI that started it, holds it already."""
    from ansible_collections.ddpfix.cluster.plugins.plugin_utils.ddpfix_controller import ddpfix

    lock = ddpfix("ddpfix.lock")
    key = lock.cluster_key(addresses)
    if key in _HELD or os.environ.get(lock.HELD_ENV) == key:
        return
    try:
        _HELD[key] = lock.controller_lock(addresses)
    except ddpfix("ddpfix.app").DdpfixError as exc:
        msg = f"{exc} (no node was contacted)"
        report = os.environ.get("DDPFIX_LOCKED_FILE")  # the ddpfix CLI reads it: exit 5 with this line
        if report:
            with open(report, "w") as f:
                f.write(msg + "\n")
        raise AnsibleError(f"ddpfix: {msg}") from None
    except OSError as exc:  # no writable state directory here (e.g. a read-only home): the node locks still apply
        display.warning(f"ddpfix: controller lock not taken: {exc}; only the node locks keep runs apart")
        _HELD[key] = None


class StrategyModule(LinearStrategy):
    def _cluster_view(self, hosts: Any) -> Any:
        vm = self._variable_manager
        view = (vm.extra_vars or {}).get(CLUSTER_VIEW)
        if view is None:
            for host in hosts:
                view = vm._nonpersistent_fact_cache.get(host.name, {}).get(CLUSTER_VIEW)
                if view is not None:
                    break
        return view

    def _get_next_task_lockstep(self, hosts, iterator):  # type: ignore[override]
        while True:
            host_tasks = super()._get_next_task_lockstep(hosts, iterator)
            if host_tasks and not getattr(self, "_ddpfix_locked", False):
                addresses = cluster_addresses(self._cluster_view(hosts))
                if addresses:
                    hold_cluster_lock(addresses)
                    self._ddpfix_locked = True
            if host_tasks and self._no_prober_to_collect(host_tasks):
                continue  # every node ran at once: the collect tasks are not iterated per node (as --skip-tags)
            if host_tasks and self._false_everywhere(host_tasks, iterator):
                continue  # its condition holds for no node: not iterated per node (as --skip-tags)
            if not host_tasks or not stop_requested():
                return host_tasks
            task = host_tasks[0][1]
            name = task.get_name() or ""
            if (isinstance(task, Handler) or task._role is not None
                    or task.action in ("meta", "ansible.builtin.meta") or is_lock_include(task)):
                return host_tasks  # a role that started finishes; the lock is always released
            display.display(f"ddpfix: stop requested, not starting: {name}")
            # the iterator has already moved these hosts past the task: dropping it skips it

    def _false_everywhere(self, host_tasks: list[tuple[Any, Any]], iterator: Any) -> bool:
        """A task tagged WHEN_TAG whose `when` is false for every host of the step (for a run_once task: its first
        host, the one Ansible would run it on). Each host's condition is evaluated with that host's variables, as
        its worker would; a condition that cannot be evaluated here is left to the worker (the task runs)."""
        tasks = [(h, t) for h, t in host_tasks if t is not None and t.action not in ("meta", "ansible.builtin.meta")]
        if not tasks or len(tasks) != len(host_tasks) or WHEN_TAG not in (tasks[0][1].tags or []):
            return False
        for host, task in tasks[:1] if tasks[0][1].run_once is True else tasks:
            try:
                task_vars = self._variable_manager.get_vars(play=iterator._play, host=host, task=task,
                                                            _hosts=self._hosts_cache, _hosts_all=self._hosts_cache_all)
                if task._resolve_conditional(task.when, task_vars):
                    return False
            except Exception:  # noqa: BLE001 - the worker evaluates it again and reports the error there
                return False
        return True

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
