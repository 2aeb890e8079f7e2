"""The probe plan filter (roles/ddpfix_facts/filter_plugins/ddpfix_probe_plan.py): k*N connects, not N^2."""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import pytest
from conftest import FACTS, Sim, probe_plan_module

pp = probe_plan_module()


def _hostvars(n: int) -> tuple[dict[str, Any], list[str]]:
    """n nodes cloned from the recorded node1 (addresses 192.168.77.11.., probe ports 40001..)."""
    base = json.loads((FACTS / "clean3" / "node1.json").read_text())["node"]
    hv, order = {}, []
    for i in range(n):
        f = copy.deepcopy(base)
        name = f"node{i + 1}"
        addr = f"192.168.77.{11 + i}"
        f["hostname"] = f["fqdn"] = name
        f["cluster"]["address"] = addr
        f["probe"].update(address=addr, port=40001 + i)
        hv[name] = {"ansible_facts": {"ddpfix_node": f}}
        order.append(name)
    return hv, order


def _args(hv: dict[str, Any], order: list[str], me: str, peers: int, master: str = "node1") -> dict[str, Any]:
    return pp.ddpfix_probe_args(hv, me, order, master, 29500, peers)


def test_filter_is_registered() -> None:
    assert pp.FilterModule().filters()["ddpfix_probe_args"] is pp.ddpfix_probe_args


def test_each_node_dials_master_and_ring_successors() -> None:
    hv, order = _hostvars(5)
    a = _args(hv, order, "node4", peers=2)
    assert a["connect"] == [
        {"name": "node1", "address": "192.168.77.11", "port": 29500, "kind": "master"},
        {"name": "node5", "address": "192.168.77.15", "port": 40005, "kind": "peer"},
        {"name": "node1", "address": "192.168.77.11", "port": 40001, "kind": "peer"},  # wraps around the ring
    ]
    assert a["bind_address"] == "192.168.77.14" and a["bind_ifname"] == "eth0"
    assert a["names"] == ["node1", "node2", "node3", "node5"]
    assert a["route_to"] == ["192.168.77.11", "192.168.77.12", "192.168.77.13", "192.168.77.15"]


@pytest.mark.parametrize(("n", "k"), [(2, 1), (3, 2), (8, 2), (32, 3), (32, 1)])
def test_total_connects_is_k_plus_one_times_n(n: int, k: int) -> None:
    hv, order = _hostvars(n)
    plans = {h: _args(hv, order, h, peers=k) for h in order}
    kk = min(k, n - 1)
    assert sum(len(p["connect"]) for p in plans.values()) == (1 + kk) * n
    dialled = Counter(c["name"] for p in plans.values() for c in p["connect"] if c["kind"] == "peer")
    assert set(dialled.values()) == {kk}  # every node's probe listener is dialled by exactly k others
    assert all(c["name"] != h for h, p in plans.items() for c in p["connect"] if c["kind"] == "peer")
    assert sum(1 for p in plans.values() for c in p["connect"] if c["kind"] == "master") == n


def test_peers_capped_at_n_minus_one() -> None:
    hv, order = _hostvars(3)
    a = _args(hv, order, "node2", peers=10)
    assert [c["name"] for c in a["connect"] if c["kind"] == "peer"] == ["node3", "node1"]


def test_zero_peers_only_dials_the_master() -> None:
    hv, order = _hostvars(4)
    assert [c["kind"] for c in _args(hv, order, "node3", peers=0)["connect"]] == ["master"]


def test_unreachable_hosts_are_skipped() -> None:
    hv, order = _hostvars(5)
    hv["node3"] = {}  # unreachable: no facts
    del hv["node5"]  # or not in hostvars at all
    a = _args(hv, order, "node2", peers=2)
    assert [c["name"] for c in a["connect"] if c["kind"] == "peer"] == ["node4", "node1"]
    assert "node3" not in a["names"] and "192.168.77.13" not in a["route_to"]
    plans = {h: _args(hv, order, h, peers=1) for h in ("node1", "node2", "node4")}
    assert all(c["name"] in plans for p in plans.values() for c in p["connect"])


def test_unreachable_master_gives_no_master_connect() -> None:
    hv, order = _hostvars(3)
    hv["node1"] = {}
    a = _args(hv, order, "node2", peers=1)
    assert [c["kind"] for c in a["connect"]] == ["peer"] and a["connect"][0]["name"] == "node3"


def test_peer_without_probe_listener_is_not_dialled() -> None:
    hv, order = _hostvars(3)
    hv["node3"]["ansible_facts"]["ddpfix_node"]["probe"].update(port=None, pid=None, error="listener failed to start")
    a = _args(hv, order, "node2", peers=1)
    assert [c["kind"] for c in a["connect"]] == ["master"]


def test_recorded_clean_cluster_probes_match_the_plan(sim: Sim) -> None:
    """The clean fixtures' probe results dial exactly what the filter plans (the audit default: 2 peers)."""
    hv = {n: {"ansible_facts": {"ddpfix_node": d["node"]}} for n, d in sim.docs.items()}
    for n, d in sim.docs.items():
        a = _args(hv, list(sim.docs), n, peers=2)
        assert [(c["name"], c["port"], c["kind"]) for c in d["probe"]["connects"]] == \
            [(c["name"], c["port"], c["kind"]) for c in a["connect"]]
        assert sorted(d["probe"]["routes"]) == sorted(a["route_to"])


def test_hostile_peer_values_are_no_probe_targets() -> None:
    """A peer's hostname/address that is not a valid name/IP never reaches the probe (getaddrinfo, ip -batch)."""
    hv, order = _hostvars(3)
    f = hv["node2"]["ansible_facts"]["ddpfix_node"]
    f["hostname"] = "evil\nroute flush"
    f["fqdn"] = "a b {{ x }}"
    f["cluster"]["address"] = "192.168.77.12\nroute flush table main"
    f["probe"]["address"] = "192.168.77.12 x"
    args = pp.ddpfix_probe_args(hv, "node1", order, "node1", 29500, 2)
    assert args["names"] == ["node3"]
    assert args["route_to"] == ["192.168.77.13"]
    assert [c["name"] for c in args["connect"] if c["kind"] == "peer"] == ["node3"]


def test_only_live_nodes_are_dialled_facts_of_other_slices_still_resolved() -> None:
    """A slice of the sliced fact-cache pattern: node1..node3 have cached facts, only node3 and node4 run now.
    Their listeners are the only ones up: no connect to another slice's node (not even the master's port), but
    every node with facts is still resolved and routed to."""
    hv, order = _hostvars(4)
    a = pp.ddpfix_probe_args(hv, "node3", order, "node1", 29500, 2, ["node3", "node4"])
    assert a["connect"] == [{"name": "node4", "address": "192.168.77.14", "port": 40004, "kind": "peer"}]
    assert a["names"] == ["node1", "node2", "node4"]
    assert a["route_to"] == ["192.168.77.11", "192.168.77.12", "192.168.77.14"]
    assert pp.ddpfix_probe_args(hv, "node3", order, "node1", 29500, 2, order) == _args(hv, order, "node3", peers=2)
