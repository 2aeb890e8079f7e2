"""A run's typed results: per task, per host, per run, folded from ansible-runner's events; which task is the
node lock's, and what a stopped run had changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpfix.ansible.tasktags import task_tags
from ddpfix.factguard.grammar import one_line


@dataclass
class TaskResult:
    task: str
    status: str  # ok | changed | failed | skipped | unreachable
    res: dict[str, Any]
    created: str = ""  # controller-side ISO timestamp of the result event
    start: str = ""  # controller-side ISO timestamps: when the task started for this host, and when it ended
    end: str = ""
    action: str = ""  # the module or action plugin that ran (resolved, e.g. ddpfix.cluster.ddpfix_node_facts)
    role: str = ""  # the role the task belongs to ("" for a play's own task)
    tags: tuple[str, ...] = ()  # the tags the task was written with (its file's, see ansible/tasktags.py)

    def is_action(self, name: str) -> bool:
        """Whether this task ran module/action `name`: its short name, whatever the prefix (FQCN, legacy, none)."""
        return short_name(self.action) == short_name(name)

    def in_role(self, name: str) -> bool:
        return short_name(self.role) == short_name(name)


def short_name(name: str) -> str:
    """The last dotted component: `ddpfix.cluster.ddpfix_node_facts` and `ddpfix_node_facts` are the same module."""
    return name.rsplit(".", 1)[-1]


@dataclass
class HostResult:
    name: str
    unreachable: bool = False
    failed: bool = False
    message: str = ""
    #: a module that failed on the node without a result of its own (its interpreter exited non-zero, a traceback, no
    #: Python): "MODULE: its error" (SSH worked: never "unreachable")
    module_error: str = ""
    tasks: list[TaskResult] = field(default_factory=list)

    def find(self, action: str, *, role: str | None = None, ran: bool = False,
             has: str | None = None) -> TaskResult | None:
        """The last result of a task that ran module/action `action` (matched by its short name, never by the task's
        name), optionally only in `role`, only one that ran (not skipped), only one whose result has key `has`."""
        for t in reversed(self.tasks):
            if (t.is_action(action) and (role is None or t.in_role(role)) and not (ran and t.status == "skipped")
                    and (has is None or has in t.res)):
                return t
        return None

    def fact(self, key: str) -> tuple[TaskResult, Any] | None:
        """The last task result that returned fact `key` (`ansible_facts[key]`), and that fact's value."""
        for t in reversed(self.tasks):
            facts = t.res.get("ansible_facts") if isinstance(t.res, dict) else None
            if isinstance(facts, dict) and key in facts:
                return t, facts[key]
        return None

    @property
    def ok(self) -> bool:
        return not (self.unreachable or self.failed)


@dataclass
class RunResult:
    status: str
    rc: int
    stats: dict[str, dict[str, int]]
    hosts: dict[str, HostResult]
    run_dir: Path
    seconds: float
    interrupted: bool = False  # Ctrl-C/SIGTERM: the run stopped starting tasks (see run_playbook)

    def changed(self, host: str | None = None) -> int:
        per_host = self.stats.get("changed", {}) or {}
        if host is not None:
            return int(per_host.get(host, 0))
        return sum(int(v) for v in per_host.values())

    @property
    def unreachable(self) -> list[str]:
        return sorted(h for h, r in self.hosts.items() if r.unreachable)


#: How ansible-core words a module that returned no result of its own: its process failed on the node
MODULE_FAILURE_MARKERS = ("MODULE FAILURE", "Module result deserialization failed", "The module interpreter")


def module_failure(res: Mapping[str, Any]) -> str | None:
    """The module's own error, in one line, when a module failed on the node without a result of its own (its
    interpreter exited non-zero or is missing, a traceback): ansible-core's message, the exit status and the tails of
    what the process wrote (stderr, then stdout, then the traceback). None for a module that failed by itself
    (fail_json: its own message is the error)."""
    msg = " ".join(str(res.get("msg") or "").split())
    if not msg.startswith(MODULE_FAILURE_MARKERS) and "module_stderr" not in res:
        return None
    parts = [one_line(msg, 200) or "MODULE FAILURE"]  # what the node wrote is hostile text: one printable line
    rc = res.get("rc")
    if isinstance(rc, int) and not isinstance(rc, bool):
        parts.append(f"rc={rc}")
    for key, label in (("module_stderr", "stderr"), ("module_stdout", "stdout"), ("exception", "traceback")):
        text = " ".join(str(res.get(key) or "").split())
        if text:
            parts.append(f"{label}: {one_line(text[-300:], 400)}")
    return "; ".join(parts)


def record_event(hosts: dict[str, HostResult], event: Mapping[str, Any]) -> None:
    """Fold one ansible-runner event into the per-host results (`hosts`, by host name)."""
    data = event.get("event_data") or {}
    host = data.get("host")
    kind = str(event.get("event", ""))
    if not host or not kind.startswith("runner_on_"):
        return
    hr = hosts.setdefault(host, HostResult(name=host))
    res = data.get("res") or {}
    task = data.get("task", "")
    created = str(event.get("created", ""))
    # identity of the task: the module that ran, its role and its tags (task names are for people)
    ident: dict[str, Any] = {"action": str(data.get("resolved_action") or data.get("task_action") or ""),
                             "role": str(data.get("resolved_role") or data.get("role") or ""),
                             "tags": task_tags(str(data.get("task_path") or ""))}
    if kind == "runner_on_unreachable":
        hr.unreachable = True
        hr.message = short_line(res.get("msg", "unreachable"))
        hr.tasks.append(TaskResult(task, "unreachable", res, **ident))
    elif kind == "runner_on_failed" and not data.get("ignore_errors"):
        hr.failed = True
        broken = module_failure(res)
        if broken:
            hr.module_error = f"{short_name(ident['action']) or task}: {broken}"
        hr.message = broken or short_line(res.get("msg") or res.get("stderr") or "task failed")
        hr.tasks.append(TaskResult(task, "failed", res, **ident))
    elif kind == "runner_on_ok":
        hr.tasks.append(TaskResult(task, "changed" if res.get("changed") else "ok", res, created,
                                   str(data.get("start", "")), str(data.get("end", "")), **ident))
    elif kind == "runner_on_skipped":
        hr.tasks.append(TaskResult(task, "skipped", res, **ident))



#: The role whose first tasks take the node lock in every play (and whose `always` tasks release it).
NODE_LOCK_ROLE = "ddpfix_run"
#: The node lock's module; the lock is taken by a `fail` task of that role when another run holds it.
NODE_LOCK_MODULE = "ddpfix_run_lock"
#: The audit's facts module, which takes the node lock itself for its one task per node.
NODE_FACTS_MODULE = "ddpfix_node_facts"


def is_node_lock_task(t: TaskResult) -> bool:
    """A task that takes or releases the node lock: one of role ddpfix_run's, but for its pre-flight (the same module
    with `state: writable`, whose result says `unwritable`)."""
    args = (t.res.get("invocation") or {}).get("module_args") or {} if isinstance(t.res, dict) else {}
    preflight = "unwritable" in t.res or (isinstance(args, dict) and args.get("state") == "writable")
    return t.in_role(NODE_LOCK_ROLE) and not preflight


def lock_held_elsewhere(t: TaskResult, message: str) -> bool:
    """A failed node-lock task of role ddpfix_run reporting that another run holds the lock (exit 5); a lock
    module that broke is a failure of that host, not "locked"."""
    if t.status != "failed" or "is held by" not in message:
        return False
    # the audit's facts module takes the node lock itself (module_utils ddpfix_lock), in its one task per node
    return (t.in_role(NODE_LOCK_ROLE) and (t.is_action("fail") or t.is_action(NODE_LOCK_MODULE))) or (
        t.is_action(NODE_FACTS_MODULE) and bool(t.res.get("locked")))


def changed_before(hosts: Mapping[str, HostResult], check: bool = False) -> str:
    """What a run that stopped (exit 5) had changed by then, in one clause: per node, the tasks that reported a
    change (under --check: would have), or that it changed nothing."""
    done = {h: [t.task for t in hr.tasks if t.status == "changed"] for h, hr in sorted(hosts.items())}
    done = {h: ts for h, ts in done.items() if ts}
    verb = "would have changed" if check else "changed"
    if not done:
        return f"this run {'would have changed' if check else 'had changed'} nothing before it stopped"
    return f"this run {verb} before it stopped: " + "; ".join(
        f"{h}: {', '.join(ts[:5])}{f' (+{len(ts) - 5} more)' if len(ts) > 5 else ''}" for h, ts in done.items())



def short_line(text: object) -> str:
    s = str(text).strip().replace("\r", "")
    return " ".join(s.split())[:400]
