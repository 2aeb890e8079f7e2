"""Results are read by identity (the module that ran, the facts it returned), never by task name: renaming a task
(ansible-lint's name[casing], a translation) or calling a module by its FQCN changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpfix import audit, remediate
from ddpfix.ansible.results import HostResult, RunResult, TaskResult, is_node_lock_task, lock_held_elsewhere


def _tasks(sim: Any, name: str, fqcn: bool) -> list[TaskResult]:
    """The audit's one task per node (the facts module takes the lock and folds the probe into the facts), then a
    renamed second-round task that returned the facts again (the detached prober's result folded in)."""
    p = "ddpfix.cluster." if fqcn else ""
    doc = sim.docs[name]
    first = {**doc["node"], "probe": {**doc["node"]["probe"], "mode": "detached"}}
    folded = {**first, "probe": {**first["probe"], **doc["probe"]}}
    return [
        TaskResult("Some renamed facts task", "ok", {"ansible_facts": {"ddpfix_node": first}},
                   "2026-01-01T00:00:01.000000", "2026-01-01T00:00:00.500000", "2026-01-01T00:00:01.000000",
                   action=f"{p}ddpfix_node_facts", role=f"{p}ddpfix_facts"),
        TaskResult("Collect it", "ok", {"probe": dict(doc["probe"])}, action=f"{p}ddpfix_probe", role=f"{p}ddpfix_facts"),
        TaskResult("Keep it", "ok", {"ansible_facts": {"ddpfix_node": folded}}, action="ansible.builtin.set_fact",
                   role=f"{p}ddpfix_facts"),
    ]


@pytest.mark.parametrize("fqcn", [False, True])
def test_audit_reads_facts_and_probe_by_module_not_task_name(sim: Any, monkeypatch: pytest.MonkeyPatch,
                                                             fqcn: bool) -> None:
    hosts = {n: HostResult(n, tasks=_tasks(sim, n, fqcn)) for n in sim.docs}
    run = RunResult("successful", 0, {}, hosts, Path("/nonexistent"), 1.0)
    monkeypatch.setattr(audit, "run_playbook", lambda *a, **k: run)
    ctx, _ = audit.collect(sim.cluster())
    for n, doc in sim.docs.items():
        h = ctx.hosts[n]
        assert h.reachable and h.node is not None and h.probe is not None
        assert {k: h.probe.get(k) for k in doc["probe"]} == doc["probe"]  # the folded result, not the first one
        assert h.window is not None and h.collected_at is not None  # the facts module's own task window


def test_short_name_matches_fqcn_and_legacy() -> None:
    t = TaskResult("x", "ok", {}, action="ansible.legacy.shell", role="ddpfix.cluster.ddpfix_verify")
    assert t.is_action("shell") and t.is_action("ansible.builtin.shell") and t.in_role("ddpfix_verify")
    assert not t.is_action("command") and not t.in_role("ddpfix_facts")
    hr = HostResult("h", tasks=[t, TaskResult("y", "skipped", {"skipped": True}, action="shell",
                                              role="ddpfix_verify")])
    assert hr.find("shell", role="ddpfix_verify", ran=True) is t
    assert hr.find("shell") is not t  # the last one, skipped or not
    assert hr.fact("ddpfix_node") is None


def test_node_lock_tasks_by_role_and_module() -> None:
    held = TaskResult("whatever the name", "failed", {"msg": "/run/ddpfix.lock is held by run 1"},
                      action="ansible.builtin.fail", role="ddpfix.cluster.ddpfix_run")
    assert lock_held_elsewhere(held, "/run/ddpfix.lock is held by run 1")
    assert not lock_held_elsewhere(held, "the node lock module failed")
    other = TaskResult("x", "failed", {"msg": "is held by"}, action="ansible.builtin.fail", role="ddpfix_firewall")
    assert not lock_held_elsewhere(other, "is held by")
    preflight = TaskResult("p", "failed", {"msg": "cannot write", "unwritable": {"/etc/hosts": "read-only"}},
                           action="ddpfix_run_lock", role="ddpfix_run")
    assert is_node_lock_task(held) and not is_node_lock_task(preflight)
    # the audit's facts module takes the lock itself: its "locked" failure is the lock code too
    facts = TaskResult("x", "failed", {"msg": "is held by run 1", "locked": True},
                       action="ddpfix.cluster.ddpfix_node_facts", role="ddpfix.cluster.ddpfix_facts")
    assert lock_held_elsewhere(facts, "is held by run 1")


def test_failure_step_skips_the_lock_release_after_it() -> None:
    step = TaskResult("Apply the rule", "failed", {"msg": "reverted"}, action="ddpfix_fw_rule", role="ddpfix_firewall")
    release = TaskResult("Release it", "unreachable", {"msg": "gone"}, action="ddpfix_run_lock", role="ddpfix_run")
    run = RunResult("failed", 2, {}, {"n1": HostResult("n1", unreachable=True, message="gone", tasks=[step, release])},
                    Path("/nonexistent"), 1.0)
    assert remediate.failures_of(run) == {"n1": "Apply the rule: reverted"}


def test_a_fix_step_whose_module_broke_names_the_modules_own_error() -> None:
    res = {"failed": True, "rc": 1, "module_stdout": "", "module_stderr": "Traceback ...\nMemoryError\n",
           "msg": "Module result deserialization failed: No start of json char found"}
    step = TaskResult("Write the env file", "failed", res, action="ddpfix_env_file", role="ddpfix_env")
    run = RunResult("failed", 2, {}, {"n1": HostResult("n1", failed=True, message="x", tasks=[step])},
                    Path("/nonexistent"), 1.0)
    assert remediate.failures_of(run) == {"n1": "Write the env file: Module result deserialization failed: No start of "
                                                "json char found; rc=1; stderr: Traceback ... MemoryError"}
