"""remediate's "the fix did not take effect" list: planned fixable findings that the re-audit still reports."""

from __future__ import annotations

from unit_helpers import Sim, nodeinfo, recorded

from ddpfix.remediate import HostPlan, build_plan, not_effective
from ddpfix.rules import env as env_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import time as time_rules


def test_a_finding_still_open_after_its_fix_is_not_effective(sim: Sim) -> None:
    sim.node("node3")["time"]["chrony_tracking"] = nodeinfo().parse_chronyc_tracking(recorded("chronyc-unreachable.csv"))
    before = sim.findings()
    plans, _ = build_plan(sim.context(), before)
    assert plans["node3"].time
    stuck = not_effective(before, before, plans)  # the re-audit found the same: chronyd never read the drop-in
    assert [(f.id, f.host) for f in stuck] == [(time_rules.UNSYNCHRONIZED.id, "node3")]
    assert not_effective(before, [f for f in before if f.id != time_rules.UNSYNCHRONIZED.id], plans) == []
    assert not_effective(before, before, plans, failed=["node3"]) == []  # a failed host is reported as failed
    assert not_effective(before, before, plans, only={env_rules.MISSING.id}) == []  # not asked for
    assert not_effective(before, before, {"node3": HostPlan()}) == []  # nothing was run there
    assert all(f.id != env_rules.MISSING.id for f in not_effective(before, before, plans))  # info: not a failure


def test_blocked_node_whose_firewall_was_not_read_gets_a_note_not_a_change(sim: Sim) -> None:
    import json

    from unit_helpers import firewall_fixture

    st = json.loads(firewall_fixture("nonroot_collect.json"))
    sim.node("node3")["firewall"] = st
    sim.node("node3")["unread"] = list(st["unread"])
    c = next(c for c in sim.probe("node1")["connects"] if c["name"] == "node3")
    c.update(ok=False, error="connection refused (ECONNREFUSED)")
    plans, _ = build_plan(sim.context(), sim.findings())
    assert plans["node3"].firewall == "none"
    assert any("could not be read (ip6tables, iptables, nft" in n for n in plans["node3"].notes), plans["node3"].notes


def test_memlock_low_plans_the_limits_role_on_that_node_only(sim: Sim) -> None:
    from unit_helpers import _fabric

    _fabric(sim)
    sim.node("node2")["fabric"]["memlock"] = {"soft": 65536, "hard": 65536, "source": "ssh session"}
    plans, _ = build_plan(sim.context(), sim.findings())
    assert {n: p.limits for n, p in plans.items()} == {"node1": False, "node2": True, "node3": False}
    assert plans["node2"].to_vars()["limits"] is True and not HostPlan(limits=True).empty
    only, _ = build_plan(sim.context(), sim.findings(), only={hosts_rules.PEER_MISMATCH.id})
    assert not any(p.limits for p in only.values())
