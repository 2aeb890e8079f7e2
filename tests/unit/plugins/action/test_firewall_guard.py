"""The guarded runtime firewall change (issue 21, items 2 and 3), without hosts: each node's arm, change, confirmation
by a new connection and cancel are one unit (action plugin ddpfix_fw_change), and a revert removes only what its own
run added (the run's tag on the rules)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from ddpfix.ansible import collection

fw = collection.module_utils("ddpfix_fw")
change = collection.action_plugin("ddpfix_fw_change")

CIDR = "192.168.77.0/24"
TAG = "ddpfix-cluster:run2"
ARGS = {"backend": "nftables", "cidr": CIDR, "zone": "trusted", "iptables_variant": "auto", "iptables": "iptables",
        "timeout": 10, "confirm_timeout": 0, "run_id": "run2"}


# --------------------------------------------------------------------------- tags: which run added a rule

def test_run_tag_and_ddpfix_comments() -> None:
    assert fw.run_tag("3f2a9c1b0d4e") == "ddpfix-cluster:3f2a9c1b0d4e"
    for bad in ("", "a b", 'x"', "-lead", "x" * 41, None):
        with pytest.raises(ValueError, match="ddpfix_firewall_run_id"):
            fw.run_tag(bad)
    assert fw.is_ddpfix_comment("ddpfix-cluster") and fw.is_ddpfix_comment(TAG)
    assert not fw.is_ddpfix_comment("ddpfix-cluster-not") and not fw.is_ddpfix_comment(None)


def _saddr(addr: str, plen: int | None = None) -> dict[str, Any]:
    right: Any = {"prefix": {"addr": addr, "len": plen}} if plen is not None else addr
    return {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": right}}


def _rule(handle: int, expr: list[Any], comment: str | None, chain: str = "input") -> dict[str, Any]:
    r = {"family": "inet", "table": "filter", "chain": chain, "handle": handle, "expr": expr}
    if comment:
        r["comment"] = comment
    return {"rule": r}


RULESET = {"nftables": [
    {"chain": {"family": "inet", "table": "filter", "name": "input", "hook": "input", "policy": "drop"}},
    _rule(2, [_saddr("10.99.0.0", 16), {"accept": None}], "ddpfix-cluster:run1"),  # an earlier run, another CIDR
    _rule(3, [_saddr("192.168.77.0", 24), {"accept": None}], TAG),                 # this run
    _rule(4, [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}},
              {"drop": None}], TAG),                                                 # this run's (a cut, in a test)
    _rule(5, [_saddr("192.168.77.0", 24), {"accept": None}], "ddpfix-cluster", chain="other"),  # persisted, at boot
    _rule(6, [_saddr("192.168.77.0", 24), {"accept": None}], "someone-else", chain="third"),
]}


def test_nft_rule_of_any_run_counts_as_present_for_its_cidr_only() -> None:
    assert fw.nft_has_rule(RULESET, ("inet", "filter", "input"), CIDR)          # this run's
    assert fw.nft_has_rule(RULESET, ("inet", "filter", "other"), CIDR)          # persisted: ddpfix-cluster alone
    assert not fw.nft_has_rule(RULESET, ("inet", "filter", "third"), CIDR)      # not ddpfix's
    assert fw.nft_has_rule(RULESET, ("inet", "filter", "input"), "10.99.0.0/16")
    assert not fw.nft_has_rule(RULESET, ("inet", "filter", "other"), "10.99.0.0/16")  # a tagged rule, other CIDR
    host = {"nftables": [_rule(7, [_saddr("10.1.2.3"), {"accept": None}], "ddpfix-cluster:r")]}
    assert fw.nft_has_rule(host, ("inet", "filter", "input"), "10.1.2.3/32")


def test_a_revert_removes_only_its_own_runs_rules() -> None:
    assert fw.nft_tagged(RULESET, TAG) == [("inet", "filter", "input", 3), ("inet", "filter", "input", 4)]
    assert fw.nft_tagged(RULESET, "ddpfix-cluster:run1") == [("inet", "filter", "input", 2)]
    save = ("*filter\n:INPUT DROP [0:0]\n"
            f'-A INPUT -s {CIDR} -m comment --comment "{TAG}" -j ACCEPT\n'
            '-A INPUT -s 10.99.0.0/16 -m comment --comment "ddpfix-cluster:run1" -j ACCEPT\n'
            f"-A INPUT -s {CIDR} -m comment --comment ddpfix-cluster -j ACCEPT\nCOMMIT\n")
    assert fw.iptables_tagged(save, TAG) == [fw.iptables_rule(CIDR, TAG)]
    assert fw.iptables_has_rule(save, CIDR) and fw.iptables_has_rule(save, "10.99.0.0/16")
    assert not fw.iptables_has_rule(save, "10.98.0.0/16")
    earlier_only = "*filter\n:INPUT DROP [0:0]\n-A INPUT -s 192.168.77.0/24 -m comment --comment ddpfix-cluster -j ACCEPT\nCOMMIT\n"
    assert fw.iptables_has_rule(earlier_only, "192.168.77.0/24") and fw.iptables_tagged(earlier_only, TAG) == []


# --------------------------------------------------------------------------- one node's guarded change

class Node:
    """A fake node: each module call costs `cost` seconds of a fake clock; `new_connections_fail` drops new
    connections (SSH really lost after the change)."""

    def __init__(self, cost: float = 1.0, new_connections_fail: bool = False, cancel: dict[str, Any] | None = None,
                 change: dict[str, Any] | None = None, change_lost: bool = False) -> None:
        self.now, self.cost, self.log = 0.0, cost, []
        self.fresh, self.new_connections_fail, self.change_lost = False, new_connections_fail, change_lost
        self.cancel = cancel or {"changed": True}
        self.change = change or {"changed": True, "diff": {"before": "", "after": "nft insert rule ...\n"}}

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def reconnect(self, connect_timeout: int) -> None:
        self.log.append(("reconnect", connect_timeout))
        self.fresh = True

    def call(self, module: str, args: dict[str, Any]) -> dict[str, Any]:
        step = args.get("state") or module.rsplit(".", 1)[-1]
        self.log.append((step, args.get("comment")))
        if self.fresh and self.new_connections_fail:
            self.now += self.log[-2][1] if self.log[-2][0] == "reconnect" else 5
            raise change.Lost("ssh: connect to host node2 port 22: Connection timed out")
        self.now += self.cost
        if step == "ddpfix_fw_rule":
            if self.change_lost:
                raise change.Lost("Shared connection to node2 closed.")
            return dict(self.change)
        return dict(self.cancel) if step == "cancelled" else {"changed": True}

    def run(self, **over: Any) -> dict[str, Any]:
        return change.guarded_change({**ARGS, **over}, self.call, self.reconnect, clock=self.clock, sleep=self.sleep)


def test_arm_change_new_connection_cancel_in_one_unit() -> None:
    node = Node()
    res = node.run()
    assert [s for s, _ in node.log] == ["armed", "ddpfix_fw_rule", "reconnect", "cancelled"]
    assert {c for s, c in node.log if s != "reconnect"} == {TAG}  # the rules and the revert carry this run's tag
    assert res["changed"] and not res.get("failed") and res["diff"]["after"].startswith("nft insert")
    assert res["run_tag"] == TAG and res["confirmed_after_s"] == 2.0 and res["revert_timeout"] == 10


def test_ssh_lost_after_the_change_leaves_the_revert_armed() -> None:
    node = Node(new_connections_fail=True)
    res = node.run()
    steps = [s for s, _ in node.log]
    assert steps[:2] == ["armed", "ddpfix_fw_rule"] and "reverted" not in steps and steps.count("cancelled") >= 1
    assert res["failed"] and "no new connection reached the node within 5 s" in res["msg"]
    assert "removes this run's change (rules tagged ddpfix-cluster:run2, nothing else) by itself 10 s" in res["msg"]
    assert node.now < 10  # given up before the node's own revert is due
    assert all(1 <= t <= change.ATTEMPT_TIMEOUT for s, t in node.log if s == "reconnect")


def test_change_that_fails_is_reverted_now_and_one_that_breaks_ssh_by_itself() -> None:
    node = Node(change={"failed": True, "msg": "nft insert rule failed: Error: Could not process rule"})
    res = node.run()
    assert [s for s, _ in node.log] == ["armed", "ddpfix_fw_rule", "reverted"]
    assert res["failed"] and "Could not process rule; reverted now (this run's rules removed" in res["msg"]
    node = Node(change_lost=True)
    res = node.run()
    assert [s for s, _ in node.log] == ["armed", "ddpfix_fw_rule"]
    assert res["failed"] and "connection broke during the change" in res["msg"] and "by itself 10 s" in res["msg"]


def test_confirmed_too_late_fails_and_nothing_changed_only_cancels() -> None:
    late = {"failed": True, "msg": "the change was confirmed too late: the automatic revert already ran (reverted: x)"}
    res = Node(cancel=late).run()
    assert res["failed"] and "confirmed too late" in res["msg"]
    node = Node(change={"changed": False})
    res = node.run()
    assert [s for s, _ in node.log] == ["armed", "ddpfix_fw_rule", "cancelled"] and not res.get("failed")


def test_check_mode_runs_only_the_change_and_firewalld_ufw_modules() -> None:
    node = Node()
    res = change.guarded_change(ARGS, node.call, node.reconnect, check_mode=True)
    assert [s for s, _ in node.log] == ["ddpfix_fw_rule"] and "diff" in res
    assert change.change_call({**ARGS, "backend": "firewalld"}, TAG) == (
        "ddpfix.cluster.ddpfix_fw_firewalld", {"changes": [], "cidr": CIDR, "zone": "trusted", "permanent": False})
    planned = [{"zone": "internal", "rich_rule": f'rule family="ipv4" source address="{CIDR}" accept'}]
    assert change.change_call({**ARGS, "backend": "firewalld", "firewalld_changes": planned}, TAG)[1]["changes"] == planned
    chains = [{"family": "inet", "table": "filter", "chain": "input"}]  # the plan's, passed on as they are
    assert change.change_call({**ARGS, "nft_chains": chains}, TAG)[1]["nft_chains"] == chains
    ufw = change.change_call({**ARGS, "backend": "ufw"}, TAG)
    assert ufw[1]["comment"] == TAG
    # first of ufw's rules (community.general.ufw: `ufw insert 1 ...`, or appended when ufw has none yet)
    assert (ufw[1]["insert"], ufw[1]["insert_relative_to"]) == (0, "first-ipv4")


def test_the_span_per_node_does_not_grow_with_the_node_count() -> None:
    """12 nodes one after another (forks = 1), 1 s per module call, a 10 s deadline: every node's span from its arm
    to its cancel is its own 2-3 s (a chain of tasks run host by host would give the first node 12 x 4 s)."""
    spans = []
    for _ in range(12):
        node = Node()
        node.run()
        spans.append(node.now)
    assert max(spans) <= 3.0


def _action(args: dict[str, Any]) -> Any:
    task = mock.MagicMock(args=args, check_mode=False, async_val=0)
    return change.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, mock.MagicMock(), None)


@pytest.mark.parametrize(("over", "msg"), [
    ({"timeout": 3}, "ddpfix_firewall_revert_timeout must be at least 5 s, got 3; nothing changed"),
    ({"run_id": 'x"; drop'}, "ddpfix_firewall_run_id must be"),
])
def test_bad_input_is_one_line_and_nothing_runs(over: dict[str, Any], msg: str) -> None:
    act = _action({**ARGS, **over})
    with mock.patch.object(act, "_execute_module") as run:
        res = act.run(task_vars={})
    assert res["failed"] and msg in res["msg"] and "\n" not in res["msg"]
    run.assert_not_called()


def test_a_revert_removes_its_runs_rules_from_every_iptables_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The input accept went to iptables-legacy (the node's auto choice: only the legacy INPUT blocks) while the
    planned egress accept went to OUTPUT of the default iptables: the revert used to look in the input's variant
    alone and left the egress accept of a change it reported as reverted. This run's tag is removed wherever it is,
    and nothing else."""
    guard = collection.module("ddpfix_fw_guard")
    saves = {
        "iptables-legacy-save": f'*filter\n:INPUT DROP [0:0]\n-A INPUT -s {CIDR} -m comment --comment "{TAG}" -j '
                                "ACCEPT\nCOMMIT\n",
        "iptables-save": f"*filter\n:OUTPUT DROP [0:0]\n-A OUTPUT -d {CIDR} -p tcp -m multiport --dports 29500 -m "
                         f'comment --comment "{TAG}" -j ACCEPT\n-A OUTPUT -d {CIDR} -p tcp -m multiport --dports '
                         "29500 -m comment --comment ddpfix-cluster -j ACCEPT\nCOMMIT\n"}
    ran: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        ran.append(argv)
        return (0, saves[argv[0]], "") if argv[0] in saves else (0, "", "")
    monkeypatch.setattr(guard, "_run", run)
    monkeypatch.setattr(guard.shutil, "which", lambda name: f"/usr/sbin/{name}")
    done = guard.revert({"backend": "iptables", "cidr": CIDR, "comment": TAG, "iptables": "iptables-legacy",
                         "zone": "trusted", "changes": []})
    assert [d.split(" ")[:3] for d in done] == [["iptables-legacy", "-D", "INPUT"], ["iptables", "-D", "OUTPUT"]]
    assert all(TAG in d for d in done)
