"""ddpfix.rolling: a rolling prober's dials to later nodes (forks below the number of nodes) read from those nodes'
listener records, on the recorded clean cluster (tests/fixtures/facts/clean3, node1..3 at 192.168.77.11-13) made
rolling: node1 started first, so its ring peers node2 and node3 are later and its dials to them are `deferred`."""

from __future__ import annotations

from typing import Any

import pytest
from unit_helpers import Sim

from ddpfix.audit import probe_rounds
from ddpfix.matrix import connectivity_matrix
from ddpfix.rolling import fold_rolling
from ddpfix.rules import probes as probes_rules

ADDR = {"node1": "192.168.77.11", "node2": "192.168.77.12", "node3": "192.168.77.13"}


def _rolling(sim: Sim, heard: dict[str, dict[str, str]]) -> None:
    """node1 rolling: its dials to node2 and node3 deferred; node2 and node3 with listener records: `heard`
    {listener: {dialer: source address}} (peer kind), each planning the connects of its two ring predecessors."""
    p1 = sim.probe("node1")
    deferred = [{k: c[k] for k in ("name", "address", "port", "kind")} for c in p1["connects"] if c["kind"] == "peer"]
    p1.update(connects=[c for c in p1["connects"] if c["kind"] == "master"], deferred=deferred, dial_until=200.0)
    planned = {"node2": ["node1", "node3"], "node3": ["node2", "node1"]}
    for n in ("node2", "node3"):
        sim.probe(n).update(inbound_from={"peer": heard.get(n, {})}, inbound_planned={"peer": planned[n]},
                            expected_inbound={"peer": 2}, up_at=150.0, inbound_sources={"peer": []})
    for n in ADDR:
        sim.node(n)["probe"]["mode"] = "rolling" if n != "node3" else "inline"


def _connect(ctx: Any, dialer: str, target: str) -> dict[str, Any] | None:
    return next((c for c in ctx.hosts[dialer].probe.get("connects") or [] if c["name"] == target), None)


@pytest.fixture
def sim() -> Sim:
    return Sim()


def test_a_dial_seen_by_the_later_listener_is_a_pass_and_one_it_missed_is_the_timeout_verdict(sim: Sim) -> None:
    """node2's listener saw node1's connect (from node1's cluster address): a pass, observed at the listener;
    node3's saw none within its window: the verdict of a timed-out dial, on node1 (the dialer), said so."""
    _rolling(sim, {"node2": {"node1": ADDR["node1"], "node3": ADDR["node3"]}, "node3": {"node2": ADDR["node2"]}})
    ctx = sim.context()
    ok = _connect(ctx, "node1", "node2")
    assert ok is not None and ok["ok"] and ok["observed"] == "listener" and ok["source"] == ADDR["node1"]
    bad = _connect(ctx, "node1", "node3")
    assert bad is not None and not bad["ok"] and "observed at the listener" in bad["error"]
    found = [f for f in sim.findings() if f.id == probes_rules.PEER_UNREACHABLE.id]
    assert [(f.host, "node3" in f.message) for f in found] == [("node1", True)], found
    assert "observed at the listener" in found[0].evidence
    cells = connectivity_matrix(ctx)["cells"]
    assert cells["node1"]["node2"]["state"] == "ok" and cells["node1"]["node3"]["state"] == "timeout"
    rounds = probe_rounds(ctx)
    assert rounds["rounds"] == 1 and rounds["rolling"] == ["node1", "node2"] and rounds["observed"] == 2
    assert rounds["unobserved"] == 0


def test_a_target_without_a_record_leaves_the_dial_not_evaluated(sim: Sim) -> None:
    """node3 unreachable (no record) and node2's listener up only after node1's prober stopped dialling: neither
    dial is a pass or a block; the matrix says unknown and the report counts them."""
    _rolling(sim, {})
    sim.probe("node2")["up_at"] = 250.0  # after node1's dial_until (200)
    sim.set_unreachable("node3", "unreachable")
    ctx = sim.context()
    assert _connect(ctx, "node1", "node2") is None and _connect(ctx, "node1", "node3") is None
    why = {u["name"]: u["why"] for u in ctx.hosts["node1"].probe["unobserved"]}
    assert "stopped dialling" in why["node2"] and "no record" in why["node3"]
    assert not [f for f in sim.findings() if f.id.startswith("probe.") and f.host == "node1"]
    cells = connectivity_matrix(ctx)["cells"]
    assert cells["node1"]["node2"]["state"] == "unknown" and cells["node1"]["node3"]["state"] == "unknown"
    assert probe_rounds(ctx)["unobserved"] == 2


def test_a_node_record_speaks_only_for_connects_to_itself_from_the_dialers_own_address(sim: Sim) -> None:
    """Hostile records: node2 names node1's connect from node3's address (not node1's): no pass; node3 names
    node1 but never planned node1's connect: not evaluated; a record naming a dial to another node (node2 speaking
    for node1 -> node3) is never read: only the target's own record counts."""
    _rolling(sim, {"node2": {"node1": ADDR["node3"]}, "node3": {"node1": ADDR["node1"]}})
    sim.probe("node2")["inbound_from"]["master"] = {"node1": ADDR["node1"]}  # no master dial of node1 was deferred
    sim.probe("node3")["inbound_planned"] = {"peer": ["node2"]}
    ctx = sim.context()
    to2 = _connect(ctx, "node1", "node2")
    assert to2 is not None and not to2["ok"] and "not the dialer's" in to2["error"]
    assert _connect(ctx, "node1", "node3") is None
    assert [u["name"] for u in ctx.hosts["node1"].probe["unobserved"]] == ["node3"]
    assert [c["kind"] for c in ctx.hosts["node1"].probe["connects"]] == ["master", "peer"]


def test_hosts_without_deferred_dials_are_left_as_they_are(sim: Sim) -> None:
    ctx = sim.context()
    hosts = dict(ctx.hosts)
    assert all(fold_rolling(hosts)[n] is hosts[n] for n in hosts)
    assert probe_rounds(ctx) == {"rounds": 1, "detached": [], "rolling": [], "observed": 0, "unobserved": 0}


def test_the_reach_probe_of_a_rolling_dialer_counts_a_later_peer_only_where_its_listener_saw_the_address(
        sim: Sim) -> None:
    """node1 with two candidate interfaces: its own (eth0) reached node2 and failed node3 as the listeners saw;
    eth1 (10.9.0.1) reached node2, whose listener saw a connect from 10.9.0.1, and says nothing of node3."""
    _rolling(sim, {"node2": {"node1": ADDR["node1"]}})
    sim.probe("node2")["inbound_sources"] = {"peer": [ADDR["node1"], "10.9.0.1"]}
    sim.probe("node1")["reach"] = {
        "eth0": {"address": ADDR["node1"], "speed": None, "device": True, "reached": [], "failed": {}},
        "eth1": {"address": "10.9.0.1", "speed": None, "device": True, "reached": [], "failed": {}}}
    reach = sim.context().hosts["node1"].probe["reach"]
    assert reach["eth0"]["reached"] == ["node2"] and list(reach["eth0"]["failed"]) == ["node3"]
    assert reach["eth1"]["reached"] == ["node2"] and reach["eth1"]["failed"] == {}
