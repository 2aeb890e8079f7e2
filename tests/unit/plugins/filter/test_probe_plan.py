"""The probe plan filter (plugins/filter/ddpfix_probe_plan.py): from the inventory alone, k*N connects, not N^2,
and each node's input O(k) targets plus the expected name->address map."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from unit_helpers import Sim, probe_plan_module

pp = probe_plan_module()


def _plan(n: int, me: str, peers: int = 2, play: list[str] | None = None, master: str = "node1") -> dict[str, Any]:
    order = [f"node{i}" for i in range(1, n + 1)]
    addrs = {h: f"192.168.77.{10 + i}" for i, h in enumerate(order, 1)}
    return pp.ddpfix_probe_plan(play or order, me, order, addrs, master, 29500, peers, 45678)


def test_filter_is_registered() -> None:
    assert pp.FilterModule().filters()["ddpfix_probe_plan"] is pp.ddpfix_probe_plan


def test_each_node_dials_master_and_ring_successors() -> None:
    p = _plan(4, "node3")
    assert [(t["name"], t["address"], t["port"], t["kind"]) for t in p["targets"]] == [
        ("node1", "192.168.77.11", 29500, "master"), ("node4", "192.168.77.14", 45678, "peer"),
        ("node1", "192.168.77.11", 45678, "peer")]
    assert p["expect_peers"] == 2 and p["expect_master"] == 0 and p["self_address"] == "192.168.77.13"
    assert p["expected"] == {"node1": "192.168.77.11", "node2": "192.168.77.12", "node4": "192.168.77.14"}
    assert _plan(4, "node1")["expect_master"] == 4


@pytest.mark.parametrize("n,k", [(2, 2), (3, 2), (8, 2), (16, 3), (50, 2)])
def test_total_connects_is_k_plus_one_times_n(n: int, k: int) -> None:
    plans = {f"node{i}": _plan(n, f"node{i}", peers=k) for i in range(1, n + 1)}
    kk = min(k, n - 1)
    assert sum(len(p["targets"]) for p in plans.values()) == (1 + kk) * n
    dialled = Counter(t["name"] for p in plans.values() for t in p["targets"] if t["kind"] == "peer")
    assert set(dialled.values()) == {kk}
    # what each listener waits for is what the others dial
    assert all(plans[h]["expect_peers"] == c for h, c in dialled.items())
    assert plans["node1"]["expect_master"] == sum(1 for p in plans.values() for t in p["targets"] if t["kind"] == "master")


def test_zero_peers_only_dials_the_master() -> None:
    assert [t["kind"] for t in _plan(3, "node2", peers=0)["targets"]] == ["master"]


def test_limit_rings_over_the_play_hosts_only() -> None:
    """--limit: hosts outside the play are neither dialled nor awaited; without the master, no master connect."""
    p = _plan(5, "node3", play=["node2", "node3", "node5"])
    assert [t["name"] for t in p["targets"]] == ["node5", "node2"]
    assert p["expect_peers"] == 2 and set(p["expected"]) == {"node2", "node5"}


def test_hostile_names_are_not_resolved_and_names_without_an_ip_expect_nothing() -> None:
    order = ["node1", "evil\nroute flush", "node3"]
    p = pp.ddpfix_probe_plan(order, "node1", order, {"node3": "node3.example"}, "node1", 29500, 2, 45678)
    assert p["expected"] == {"node3": ""}
    assert [t["address"] for t in p["targets"] if t["name"] == "node3"] == ["node3.example"]


def test_recorded_clean_cluster_probes_match_the_plan(sim: Sim) -> None:
    """The clean fixtures' probe results dial the same peers and kinds as the plan (the audit default: 2 peers)."""
    order = list(sim.docs)
    for n, d in sim.docs.items():
        p = pp.ddpfix_probe_plan(order, n, order, {}, order[0], 29500, 2, 45678)
        assert [(c["name"], c["kind"]) for c in d["probe"]["connects"]] == [(t["name"], t["kind"]) for t in p["targets"]]


def test_hosts_outside_the_play_are_reported_by_two_play_hosts_each() -> None:
    """Under --limit nobody dials a node outside the play; its /etc/hosts lines (the names remediate keeps for it in
    the hosts block) are asked of two of the play's hosts each, round-robin: O(N) lines in all."""
    play = ["node2", "node5", "node7"]
    plans = {me: _plan(8, me, play=play) for me in play}
    outside = [f"192.168.77.{10 + i}" for i in (1, 3, 4, 6, 8)]
    counts = Counter(a for p in plans.values() for a in p["hosts_addresses"])
    assert counts == dict.fromkeys(outside, 2)
    assert all(not _plan(8, me)["hosts_addresses"] for me in ("node1", "node4"))  # no --limit: nothing extra
    assert _plan(8, "node3", play=play)["hosts_addresses"] == []  # not in the play


def test_probe_port_is_moved_off_the_master_port() -> None:
    order = ["node1", "node2", "node3"]
    plans = [pp.ddpfix_probe_plan(order, h, order, {}, "node1", 45678, 2, 45678) for h in order]
    assert {p["port"] for p in plans} == {45679}
    assert [t["port"] for t in plans[1]["targets"]] == [45678, 45679, 45679]


# ------------------------------------------------------------------ management + data network (cluster addresses)


@pytest.mark.parametrize(("addresses", "cidr", "later"), [
    ({"node1": "192.168.77.11", "node2": "192.168.77.12"}, "192.168.77.0/24", False),  # one network
    ({"node1": "192.168.77.11", "node2": "192.168.77.12"}, "", False),  # the CIDR comes from the master's NIC
    ({"node1": "192.168.77.11", "node2": "192.168.77.12"}, "10.77.0.0/24", True),  # SSH on a management network
    ({"node1": "10.77.0.11", "node2": "192.168.77.12"}, "10.77.0.0/24", True),  # one node outside
    ({"node1": "", "node2": "10.77.0.12"}, "10.77.0.0/24", True),  # dialled by name: resolved where?
    ({"n1.example.com": None}, "10.77.0.0/24", True),
    ({"node1": "fd00::11"}, "10.77.0.0/24", True),  # another family
])
def test_probes_wait_for_the_facts_when_the_inventory_addresses_are_not_in_the_cluster_network(
        addresses: dict[str, Any], cidr: str, later: bool) -> None:
    assert pp.ddpfix_probe_needs_facts(addresses, cidr) is later


def test_cluster_addresses_come_from_each_nodes_facts_and_nodes_without_one_are_left_out() -> None:
    def node(address: Any) -> dict[str, Any]:
        return {"ansible_facts": {"ddpfix_node": {"cluster": {"address": address, "ifname": "data0"}}}}

    hostvars = {"node1": node("10.77.0.11"), "node2": node(None), "node3": node("{{ 7*7 }}"), "node4": {},
                "node5": node("10.77.0.15")}
    got = pp.ddpfix_cluster_addresses(["node1", "node2", "node3", "node4", "node5", "gone"], hostvars)
    assert got == {"node1": "10.77.0.11", "node5": "10.77.0.15"}
    # the plan over them: peers dial cluster addresses; a node without one is not in the ring
    p = pp.ddpfix_probe_plan([h for h in ["node1", "node2", "node5"] if h in got], "node5",
                             ["node1", "node2", "node5"], got, "node1", 29500, 2, 45678)
    assert [(t["name"], t["address"]) for t in p["targets"]] == [
        ("node1", "10.77.0.11"), ("node1", "10.77.0.11")]
    assert p["sources"]["peer"] == [{"name": "node1", "address": "10.77.0.11"}]
    assert pp.FilterModule().filters()["ddpfix_cluster_addresses"] is pp.ddpfix_cluster_addresses


def test_facts_follow_up_play_only_for_clusters_that_can_need_it() -> None:
    """ddpfix_facts_more decides once per play whether the facts role's follow-up (second probe round, collect of
    detached probers) can be needed on any node: the audit playbook's follow-up play matches no host otherwise."""
    more = pp.FilterModule().filters()["ddpfix_facts_more"]
    order = ["n1", "n2", "n3", "n4"]
    addrs = {h: f"10.0.0.{i}" for i, h in enumerate(order, 1)}
    one_net = {"order": order, "addresses": addrs, "cluster_cidr": "10.0.0.0/24", "probe_from_facts": False}
    assert not more(one_net, 4) and not more(one_net, 50)
    assert more(one_net, 3)  # forks below the nodes: probers run detached, the follow-up collects them
    assert not more(one_net, 3, False)  # no probes (facts only): nothing to collect, no second round
    assert more({**one_net, "probe_from_facts": True}, 50)  # management network for SSH: a second round
    derived = {k: v for k, v in one_net.items() if k != "probe_from_facts"}  # the CLI's extra var has no such key
    assert not more(derived, 4) and more({**derived, "cluster_cidr": "10.9.0.0/24"}, 4)
    # no extra var: the first task's result, registered on the play's hosts (the first one that has it)
    hostvars = {"other": {}, "n1": {"ddpfix_audit_cluster": one_net}}
    assert not more(None, 4, True, ["other", "n1"], hostvars) and more(None, 3, True, ["other", "n1"], hostvars)
    # no view at all (--list-hosts, or the first task did not run): the follow-up decides per node
    assert more(None, 4, True, ["other"], hostvars) and more(None, 4, True, [], {})
    assert more(one_net, "not a number")
    # each half of the follow-up on its own (the audit playbook's two plays)
    assert more(one_net, 3, True, (), None, "collect") and not more(one_net, 3, True, (), None, "cluster")
    mgmt = {**one_net, "probe_from_facts": True}
    assert more(mgmt, 50, True, (), None, "cluster") and not more(mgmt, 50, True, (), None, "collect")
    assert more(mgmt, 3, True, (), None, "cluster") and more(mgmt, 3, True, (), None, "collect")
    # the role's defaults hidden from the play (a user's ansible.cfg: private_role_vars = True): probe and forks
    # undefined at the play, read from the facts task's plan registered on the hosts; a string as `| bool` reads it
    planned = {"n1": {"__ddpfix_facts_plan": {"data": {"probe": False, "forks": 50}}}}
    assert not more(mgmt, None, None, ["other", "n1"], planned, "cluster")
    assert more(mgmt, None, None, ["n1"], {"n1": {"__ddpfix_facts_plan": {"data": {"probe": True}}}}, "cluster")
    assert more(mgmt, None, None, [], {}, "cluster")  # no plan anywhere: probes on, as the role's default
    assert not more(mgmt, 50, "false", (), None, "cluster") and more(mgmt, 50, "yes", (), None, "cluster")
    # the audit playbook includes the role in its follow-up (its defaults undefined where the hosts are templated):
    # the view's own facts_plan (the cluster task's) says what the facts play used; no host's variables are read
    no_hosts: dict[str, Any] = {}
    assert more({**mgmt, "facts_plan": {"probe": True, "forks": 50}}, None, None, ["n1"], no_hosts, "cluster")
    assert not more({**mgmt, "facts_plan": {"probe": False, "forks": 50}}, None, None, ["n1"], planned, "cluster")
    assert more({**one_net, "facts_plan": {"probe": True, "forks": 3}}, None, None, [], {}, "collect")
    assert not more({**one_net, "facts_plan": {"probe": True, "forks": 50}}, None, None, [], {}, "collect")


@pytest.mark.parametrize("n,k,play_order", [(2, 1, None), (3, 2, None), (5, 2, None), (8, 3, None),
                                              (6, 2, [3, 1, 6, 2, 5, 4])])
def test_the_last_host_to_meet_a_rolling_listener_is_marked_closes(n: int, k: int,
                                                                   play_order: list[int] | None) -> None:
    """`closes` on a target: this host is the latest in play order of those whose probe meets the target's after the
    target started (the target dials it, or it dials the target), so that target's rolling prober ends with this
    host's dial (its task waits for the listener to close). Checked against every plan of the cluster; a target
    whose last meeting host does not dial it (only dialled by it) has no such mark anywhere."""
    order = [f"node{i}" for i in range(1, n + 1)]
    play = [f"node{i}" for i in play_order] if play_order else order
    addrs = {h: f"192.168.77.{10 + i}" for i, h in enumerate(order, 1)}
    plans = {h: pp.ddpfix_probe_plan(play, h, order, addrs, "node1", 29500, k, 45678) for h in play}
    pos = {h: i for i, h in enumerate(play)}
    for h in play:
        meets = {t["name"] for t in plans[h]["targets"]} | {x for x in play if any(
            t["name"] == h for t in plans[x]["targets"])}
        later = [x for x in meets - {h} if pos[x] > pos[h]]
        last = max(later, key=pos.__getitem__) if later else None
        marked = {x for x in play for t in plans[x]["targets"] if t["name"] == h and t.get("closes")}
        dials_h = last is not None and any(t["name"] == h for t in plans[last]["targets"])
        assert marked == ({last} if dials_h else set()), (h, last, marked)
        if dials_h:  # every target entry of that host for h (master and peer port) is marked
            assert all(t.get("closes") for t in plans[last]["targets"] if t["name"] == h)
    # the master's listener is met by every host: its last one in play order closes it
    assert any(t.get("closes") for t in plans[play[-1]]["targets"] if t["name"] == "node1") or play[-1] == "node1"


def _facts_plan(**over: Any) -> dict[str, Any]:
    order = ["node1", "node2", "node3", "node4"]
    plan: dict[str, Any] = {
        "hosts": order, "order": order, "addresses": {h: f"192.168.77.{10 + i}" for i, h in enumerate(order, 1)},
        "master": "node1", "master_address": "192.168.77.11", "master_port": 29500, "cluster_cidr": "192.168.77.0/24",
        "env_path": "/etc/ddpfix/ddp.env", "lock_path": "/run/ddpfix.lock", "lock_holder": {"run_id": "r1"},
        "lock_stale_minutes": 20, "nofile_path": "", "profile": False, "probe": True, "probe_from_facts": False,
        "peers": 2, "port": 45678, "timeout": 2.0, "wait": 8.0, "hold": 19.0, "forks": 4}
    plan.update(over)
    return plan


def test_facts_args_are_the_plays_decisions_with_each_nodes_probe_plan() -> None:
    """The facts task's play-wide arguments, decided once for the play: each node's is one filter call, with its own
    probe plan (as the per-argument templates gave it); the node's own variables are added as the task hands them."""
    plan = _facts_plan()
    assert pp.FilterModule().filters()["ddpfix_facts_args"] is pp.ddpfix_facts_args
    args = pp.ddpfix_facts_args(plan, "node3")
    probe = pp.ddpfix_probe_plan(plan["hosts"], "node3", plan["order"], plan["addresses"], "node1", 29500, 2, 45678)
    assert args == {
        "master_address": "192.168.77.11", "master_port": 29500, "is_master": False, "cluster_cidr": "192.168.77.0/24",
        "env_path": "/etc/ddpfix/ddp.env", "lock_path": "/run/ddpfix.lock", "lock_holder": {"run_id": "r1"},
        "lock_stale_minutes": 20, "nofile_path": "", "profile": False,
        "probe": {**probe, "timeout": 2.0, "wait": 8.0, "hold": 19.0, "detach": False}}
    assert pp.ddpfix_facts_args(plan, "node1")["is_master"] is True
    assert not {"python", "socket_ifname", "launcher_units", "sysfs_root", "dev_root", "fi_info"} & set(args)
    # the node's own values, from the same template (the facts task's one template per node), come along as they are
    own = {"python": "/opt/py/bin/python", "socket_ifname": "ens5", "launcher_units": ["train.service"],
           "sysfs_root": "/sys", "dev_root": "/dev", "fi_info": ""}
    assert pp.ddpfix_facts_args(plan, "node3", own) == {**args, **own}
    # forks below the play's hosts: the probers outlive their tasks (rolling)
    assert pp.ddpfix_facts_args(_facts_plan(forks=2), "node3")["probe"]["detach"] is True
    # no probe in this task: probes off, or they wait for the facts (second round at the cluster addresses)
    assert pp.ddpfix_facts_args(_facts_plan(probe=False), "node3")["probe"] is None
    assert pp.ddpfix_facts_args(_facts_plan(probe_from_facts=True), "node3")["probe"] is None


def test_the_cluster_tasks_packed_lists_give_the_same_arguments() -> None:
    """The cluster task hands the hosts, rank order and addresses along as one string (`probe_inputs`,
    `pack_probe_inputs`): every node's arguments are those the lists themselves give, on the view-and-plan layout
    the audit play uses (the plan under `facts_plan`), with the view's lists still there."""
    plan = _facts_plan(forks=2)
    view = {k: plan[k] for k in ("order", "addresses", "master", "master_port", "cluster_cidr", "env_path",
                                 "probe_from_facts")}
    settings = {k: v for k, v in plan.items() if k not in view}
    packed = pp.pack_probe_inputs(plan["hosts"], plan["order"], plan["addresses"])
    assert isinstance(packed, str) and pp.unpack_probe_inputs(packed) == (plan["hosts"], plan["order"],
                                                                            plan["addresses"])
    for me in plan["hosts"]:
        want = pp.ddpfix_facts_args(plan, me)
        assert pp.ddpfix_facts_args({**view, "facts_plan": {**settings, "probe_inputs": packed}}, me) == want
    # the packed lists are the ones read: a view whose own lists differ does not change the plan
    other = {**view, "order": list(reversed(plan["order"])), "facts_plan": {**settings, "probe_inputs": packed}}
    assert pp.ddpfix_facts_args(other, "node3") == pp.ddpfix_facts_args(plan, "node3")
