"""`verify` judges with the audit's decisions (one place each): chrony synchronised, the cluster NIC, the managed
block, and the lab's env files come from the plan's code."""

from __future__ import annotations

from typing import Any

import pytest

from ddpfix.lab.plan import plan_lab
from ddpfix.plan import cluster_nic, managed_block, node_env, plan_cluster
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import time as time_rules
from ddpfix.rules.context import Thresholds
from ddpfix.verify import endstate as verify


@pytest.mark.parametrize("case", ["synced", "leap", "no-ref-answer", "offset", "no-chronyd"])
def test_verify_chrony_check_agrees_with_the_audit(sim: Any, case: str) -> None:
    name = "node2"
    t = sim.node(name)["time"]
    t["daemons"] = ["chronyd"]
    t["chrony_tracking"] = dict(t.get("chrony_tracking") or {}, synchronised=True, system_offset=0.001,
                                leap_status="Normal", ref_name="node1")
    if case == "leap":
        t["chrony_tracking"].update(synchronised=False, leap_status="Not synchronised")
    elif case == "no-ref-answer":
        t["chrony_tracking"] = None
    elif case == "offset":
        t["chrony_tracking"]["system_offset"] = 0.5
    elif case == "no-chronyd":
        t["daemons"] = ["systemd-timesyncd"]
    ctx = sim.context(Thresholds())
    audit_says_unsynced = any(f.id == time_rules.UNSYNCHRONIZED.id and f.host == name for f in sim.findings())
    check = verify.chrony_check(name, dict(ctx.audited())[name], ctx.thresholds.max_offset_s)
    assert check.ok is (case == "synced")
    if case != "no-chronyd":
        assert check.ok is not audit_says_unsynced
    if case == "leap":
        assert "leap status 'Not synchronised'" in check.detail


def test_cluster_nic_one_rule(sim: Any) -> None:
    f = sim.node("node1")
    addr = sim.iface("node1")["addrs"][0]["local"]
    assert cluster_nic(f, address=addr) == "eth0"
    cidr = sim.inventory["_meta"]["hostvars"]["node1"].get("ddp_cluster_cidr") or f["cluster"]["cidr"]
    assert cluster_nic(f, cidr=cidr) == "eth0"
    assert cluster_nic(f, cidr="203.0.113.0/24") is None and cluster_nic(f) is None
    plans = plan_cluster(sim.cluster(), {n: d["node"] for n, d in sim.docs.items()})
    assert plans["node1"].ifname == "eth0"


def test_managed_block_is_the_env_files_block() -> None:
    text = ("127.0.0.1 localhost\n# BEGIN ddpfix managed block\n# note\n10.0.0.1\tnode1\n# END ddpfix managed block\n"
            "10.9.9.9 other\n")
    assert managed_block(text) == "# note\n10.0.0.1\tnode1\n"
    assert managed_block("127.0.0.1 localhost\n") == ""


def test_lab_env_files_are_the_plans() -> None:
    plan = plan_lab("envcheck", nodes=3, subnet="192.168.250.0/24")
    n = plan.nodes[1]
    env = plan.env_for(n, MASTER_PORT="1")
    assert env == {**node_env(str(plan.master.address), plan.master_port, 3, 1, 1, n.ifname), "MASTER_PORT": "1"}
    assert env["TP_SOCKET_IFNAME"] == n.ifname and env["NCCL_SOCKET_IFNAME"] == f"={n.ifname}"


@pytest.mark.parametrize("fault", [False, True])
def test_verify_hostname_check_is_the_audits(sim: Any, fault: bool) -> None:
    """verify's "hostname not on loopback" reads the audit's hosts_rules.HOSTNAME_LOOPBACK (no second look through
    testinfra), shown with what the node resolved its hostname to."""
    if fault:
        sim.set_hosts_file("node2", "127.0.0.1\tlocalhost\n127.0.1.1\tnode2\n")
        sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    ids = {f.id for f in sim.findings() if f.host == "node2"}
    check = verify.hostname_check("node2", sim.node("node2"), ids)
    assert check.ok is not fault and check.ok is (hosts_rules.HOSTNAME_LOOPBACK.id not in ids)
    assert check.detail == ("node2 -> 127.0.1.1" if fault else "node2 -> 192.168.77.12")
    assert not verify.hostname_check("node2", {**sim.node("node2"), "resolve_self": {}}, set()).ok  # not resolved
