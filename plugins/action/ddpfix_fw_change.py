"""Action plugin ddpfix.cluster.ddpfix_fw_change: one node's guarded runtime firewall change, as one task.

Arm the node's automatic revert, make the change, drop the SSH connection, and cancel the revert through a NEW
connection: all inside this one task for this one node, so the time from the arm to the cancel is this node's own
(a few seconds), whatever the number of nodes, `forks`, `serial` or the strategy. Consecutive tasks could not give
that: Ansible's linear strategy runs a task on every host, in batches of `forks`, before the next task starts, so a
node armed in the first batch would wait for every other batch before its confirmation (issue 21, item 2).
Documentation: plugins/modules/ddpfix_fw_change.py.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, Callable

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fw import run_tag

GUARD = "ddpfix.cluster.ddpfix_fw_guard"
ARGUMENT_SPEC: dict[str, Any] = {
    "backend": {"type": "str", "required": True, "choices": ["firewalld", "ufw", "iptables", "nftables"]},
    "cidr": {"type": "str", "required": True},
    "zone": {"type": "str", "default": "trusted"},
    "firewalld_changes": {"type": "list", "elements": "dict", "default": []},
    "iptables_variant": {"type": "str", "default": "auto", "choices": ["auto", "legacy", "nft"]},
    "egress": {"type": "list", "elements": "dict", "default": []},
    "ingress": {"type": "bool", "default": True},
    "nft_chains": {"type": "list", "elements": "dict", "default": []},
    "iptables": {"type": "str", "default": "iptables"},
    "timeout": {"type": "int", "required": True},
    "confirm_timeout": {"type": "int", "default": 0},
    "run_id": {"type": "str", "default": ""},
}
#: Longest single attempt of the confirming connection (seconds); attempts repeat until the confirmation window ends.
ATTEMPT_TIMEOUT = 5


class Lost(Exception):
    """The connection to the node failed (Ansible would call the host unreachable)."""


def change_call(args: dict[str, Any], tag: str) -> tuple[str, dict[str, Any]]:
    """The module (and its arguments) that makes the runtime change; its rules carry `tag`."""
    backend, cidr = args["backend"], args["cidr"]
    if backend == "firewalld":
        return "ddpfix.cluster.ddpfix_fw_firewalld", {"changes": args.get("firewalld_changes") or [], "cidr": cidr,
                                                      "zone": args["zone"], "permanent": False}
    if backend == "ufw":
        # first of ufw's own rules (appended when there is none): ahead of a user's deny, as ddpfix's iptables
        # accept goes first in INPUT
        return "community.general.ufw", {"rule": "allow", "from_ip": cidr, "comment": tag, "insert": 0,
                                         "insert_relative_to": "first-ipv4"}
    return "ddpfix.cluster.ddpfix_fw_rule", {"backend": backend, "cidr": cidr,
                                             "iptables_variant": args["iptables_variant"], "comment": tag,
                                             "egress": args.get("egress") or [], "ingress": args.get("ingress", True),
                                             "nft_chains": args.get("nft_chains") or []}


def confirm_window(args: dict[str, Any]) -> int:
    """Seconds after the change within which a new connection must cancel the revert (half the revert timeout, at
    least 5 s, unless given)."""
    return int(args["confirm_timeout"]) or max(int(args["timeout"]) // 2, 5)


def _msg(res: dict[str, Any]) -> str:
    text = res.get("msg") or res.get("module_stderr") or res.get("stderr") or "failed"
    return " ".join(str(text).split())[:300]


def guarded_change(args: dict[str, Any], call: Callable[[str, dict[str, Any]], dict[str, Any]],
                   reconnect: Callable[[int], None], check_mode: bool = False,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """One node's arm -> change -> new connection -> cancel. `call(module, module_args)` runs a module on the node
    (raises Lost when the connection fails); `reconnect(connect_timeout)` drops the connection so that the next call
    opens a new one. Returns the task result: the change's (diff included) when it was confirmed, else failed with a
    message saying what happened to the change (never changed, reverted now, or reverted by the node by itself)."""
    tag = run_tag(args["run_id"])
    module, module_args = change_call(args, tag)
    if check_mode:
        return call(module, module_args)
    timeout = int(args["timeout"])
    guard = {"backend": args["backend"], "cidr": args["cidr"], "comment": tag, "zone": args["zone"],
             "iptables": args["iptables"], "changes": args.get("firewalld_changes") or []}
    by_itself = (f"reverted: the revert armed on the node removes this run's change (rules tagged {tag}, nothing "
                 f"else) by itself {timeout} s after the change")

    def failed(msg: str, changed: bool = False) -> dict[str, Any]:
        return {"failed": True, "changed": changed, "msg": msg, "run_tag": tag}

    try:
        armed = call(GUARD, {**guard, "state": "armed", "timeout": timeout})
    except Lost as exc:
        return failed(f"firewall change not made: the node did not answer ({exc}); nothing changed")
    if armed.get("failed"):
        return failed(f"firewall change not made: {_msg(armed)}; nothing changed")
    changed_at = clock()
    try:
        result = call(module, module_args)
    except Lost as exc:
        return failed(f"firewall change not kept: the connection broke during the change ({exc}); {by_itself}", True)
    if result.get("failed"):
        try:  # the node still answers: remove this run's rules now
            now = call(GUARD, {**guard, "state": "reverted"})
            undone = "reverted now (this run's rules removed, nothing else)" if not now.get("failed") else by_itself
        except Lost:
            undone = by_itself
        return failed(f"firewall change not kept: {_msg(result)}; {undone}", bool(result.get("changed")))
    if not result.get("changed"):
        try:  # nothing was missing after all (another run added it meanwhile): nothing to guard, nothing to revert
            call(GUARD, {**guard, "state": "cancelled"})
        except Lost as exc:
            return failed(f"firewall unchanged, but the node stopped answering before its armed revert was "
                          f"cancelled ({exc})")
        return result
    # confirmed only by a NEW connection from the controller (the one the change ran on may survive a rule that
    # blocks new ones): the cancel itself runs over it, retried until the window ends
    window = confirm_window(args)
    deadline = changed_at + window
    lost: Exception | None = None
    while True:
        reconnect(max(1, min(ATTEMPT_TIMEOUT, int(deadline - clock()))))
        try:
            cancelled = call(GUARD, {**guard, "state": "cancelled"})
            break
        except Lost as exc:
            lost = exc
        if clock() + 1 >= deadline:
            return failed(f"firewall change not kept: no new connection reached the node within {window} s of the "
                          f"change ({lost}); {by_itself}", True)
        sleep(1)
    if cancelled.get("failed"):  # confirmed too late: the revert already ran
        return failed(f"firewall change not kept: {_msg(cancelled)}", True)
    return {**result, "run_tag": tag, "confirmed_after_s": round(clock() - changed_at, 1), "revert_timeout": timeout}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # check mode: only the change module, in check mode (its diff); no arm, no cancel

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if int(args["timeout"]) < 5:
            result.update(failed=True, msg=f"ddpfix_firewall_revert_timeout must be at least 5 s, got {args['timeout']}"
                                           "; nothing changed")
            return result
        args["run_id"] = args["run_id"] or uuid.uuid4().hex[:12]
        try:
            run_tag(args["run_id"])
        except ValueError as exc:
            result.update(failed=True, msg=f"{exc}; nothing changed")
            return result
        facts: dict[str, Any] = {}

        def call(module: str, module_args: dict[str, Any]) -> dict[str, Any]:
            try:
                res = self._execute_module(module_name=module, module_args=module_args, task_vars=task_vars)
            except AnsibleConnectionFailure as exc:
                raise Lost(" ".join(str(exc).split())[:200]) from None
            facts.update(res.pop("ansible_facts", None) or {})  # a discovered interpreter, kept for later tasks
            return res

        try:
            out = guarded_change(args, call, self._reconnect, check_mode=bool(self._task.check_mode))
        finally:
            with contextlib.suppress(AnsibleError):
                self._remove_tmp_path(self._connection._shell.tmpdir)
        if facts:
            out["ansible_facts"] = facts
        result.update(out)
        return result

    def _reconnect(self, connect_timeout: int) -> None:
        """Drop the connection (ControlPersist master included) so that the next module opens a new one, giving up
        on it after `connect_timeout` seconds."""
        with contextlib.suppress(AttributeError, KeyError, AnsibleError):  # a connection without that option
            self._connection.set_option("timeout", connect_timeout)
        with contextlib.suppress(AttributeError):
            self._connection.reset()
