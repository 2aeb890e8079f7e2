"""The interface that reaches every peer (issue 25.8) on the controller: the plan's choice (ddpfix.ifreach.choose,
plan.socket_nic), its `# why` comment in the env file (idempotent, ignored by the parsers and check --local), and
the trust boundary for probe.reach (factguard.guard_reach)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from unit_helpers import Sim, hostile

from ddpfix import clusterfile, ifreach, local
from ddpfix.factguard.reach import guard_reach
from ddpfix.model.net import is_ip, valid_ifname
from ddpfix.plan import env_write_needed, render_env
from ddpfix.rules import netif as netif_rules
from ddpfix.rules import reachability as reachability_rules

ISO = {"name": "iso0", "index": 2, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "operstate": "UP",
       "mtu": 1500, "kind": "veth", "addrs": [{"family": "inet", "local": "192.168.77.99", "prefixlen": 32}]}


def _entry(address: str, reached: list[str], failed: dict[str, str] | None = None, speed: int | None = 10000,
           device: bool = True) -> dict[str, Any]:
    return {"address": address, "speed": speed, "device": device, "reached": reached, "failed": failed or {}}


ISO_FAILS = {"iso0": _entry("192.168.77.99", [], {"node1": "timed out after 2.0s", "node2": "timed out after 2.0s"}),
             "eth0": _entry("192.168.77.13", ["node1", "node2"])}


def _iso_first(sim: Sim, reach: dict[str, Any] | None = ISO_FAILS) -> None:
    """node3 with iso0 (an isolated link holding a cluster address) before eth0: the current rule (the first
    interface with an address in the CIDR) makes iso0 its cluster interface."""
    sim.node("node3")["interfaces"].append(copy.deepcopy(ISO))
    sim.node("node3")["cluster"] = {"address": "192.168.77.99", "cidr": "192.168.77.0/24", "ifname": "iso0",
                                    "source": "cidr"}
    if reach is not None:
        sim.probe("node3")["reach"] = copy.deepcopy(reach)


def test_without_reach_evidence_the_current_rule_stays(sim: Sim) -> None:
    _iso_first(sim, None)
    p = sim.context().plan["node3"]
    assert (p.ifname, p.address, p.comments) == ("iso0", "192.168.77.99", {})


def test_the_plan_writes_the_interface_that_reached_every_peer_with_why(sim: Sim) -> None:
    _iso_first(sim)
    p = sim.context().plan["node3"]
    assert (p.ifname, p.address) == ("eth0", "192.168.77.13")
    assert p.env["GLOO_SOCKET_IFNAME"] == "eth0" and p.env["NCCL_SOCKET_IFNAME"] == "=eth0"
    why = "eth0 reached every probed peer (node1, node2); iso0 did not reach node1, node2"
    assert p.comments["GLOO_SOCKET_IFNAME"] == why
    assert f"# GLOO_SOCKET_IFNAME: {why}\nGLOO_SOCKET_IFNAME=eth0\n" in render_env(p)


def test_the_master_address_follows_the_masters_choice(sim: Sim) -> None:
    sim.node("node1")["interfaces"].append(copy.deepcopy(ISO))
    sim.node("node1")["cluster"] = {"address": "192.168.77.99", "cidr": "192.168.77.0/24", "ifname": "iso0",
                                    "source": "cidr"}
    sim.set_var(None, ddp_cluster_cidr="192.168.77.0/24")
    sim.probe("node1")["reach"] = {"iso0": ISO_FAILS["iso0"], "eth0": _entry("192.168.77.11", ["node1", "node2"])}
    plans = sim.context().plan
    assert {plans[n].env["MASTER_ADDR"] for n in plans} == {"192.168.77.11"}


def test_an_inventory_socket_ifname_is_kept(sim: Sim) -> None:
    _iso_first(sim)
    sim.set_var("node3", ddp_socket_ifname="iso0")
    assert sim.context().plan["node3"].ifname == "iso0"


@pytest.mark.parametrize(("reach", "want"), [
    # both reached every peer: the one in the cluster network, whatever its speed
    ({"mgmt0": _entry("10.9.0.3", ["node1"], speed=100000), "eth0": _entry("192.168.77.13", ["node1"])}, "eth0"),
    # both in the cluster network: the faster link
    ({"eth0": _entry("192.168.77.13", ["node1"]), "eth1": _entry("192.168.77.23", ["node1"], speed=25000)}, "eth1"),
    # equal speed (or unknown): the current rule's
    ({"eth1": _entry("192.168.77.23", ["node1"]), "eth0": _entry("192.168.77.13", ["node1"])}, "eth0"),
    ({"eth1": _entry("192.168.77.23", ["node1"], speed=None), "eth0": _entry("192.168.77.13", ["node1"], speed=None)},
     "eth0"),
])
def test_ties_cidr_then_speed_then_the_current_rule(reach: dict[str, Any], want: str) -> None:
    got = ifreach.choose(reach, "eth0", lambda a: a.startswith("192.168.77."), ["eth0", "eth1", "mgmt0"])
    assert got is not None and got[0] == want
    assert (got[1] == "") == (want == "eth0")  # no comment when nothing failed and the current rule stays


@pytest.mark.parametrize("reach", [
    None,
    {"eth0": _entry("192.168.77.13", ["node1"])},  # one candidate: nothing to compare
    {"iso0": _entry("192.168.77.99", [], {"node1": "x"}, device=False), "eth0": _entry("192.168.77.13", ["node1"])},
    {"iso0": _entry("192.168.77.99", [], {"node1": "x"}), "mgmt0": _entry("10.9.0.3", ["node1"])},  # none in CIDR
])
def test_evidence_that_decides_nothing(reach: dict[str, Any] | None) -> None:
    assert ifreach.choose(reach, "eth0", lambda a: a.startswith("192.168.77."), []) is None


def _written_env(sim: Sim) -> None:
    """Every node's env file as ddpfix writes it now (with the reach evidence)."""
    ctx = sim.context()
    for n, p in ctx.plan.items():
        sim.set_env_file(n, render_env(p))


def test_env_file_with_the_comment_is_up_to_date_and_clean(sim: Sim) -> None:
    _iso_first(sim)
    _written_env(sim)
    ctx = sim.context()
    ef = sim.node("node3")["env_file"]
    assert ef["values"]["GLOO_SOCKET_IFNAME"] == "eth0" and not any(k.startswith("#") for k in ef["values"])
    assert not env_write_needed(ef, ctx.plan["node3"])  # a second apply writes nothing
    assert render_env(ctx.plan["node3"]) == render_env(sim.context().plan["node3"])  # the same text each time
    ids = {(f.id, f.host) for f in sim.findings()}
    assert not {i for i, h in ids if h == "node3" and i.startswith(("env.", "netif."))}, ids


def test_check_local_keeps_the_audits_choice(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _iso_first(sim)
    _written_env(sim)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(clusterfile.build(sim.context())))
    cluster, doc = clusterfile.load(str(path))
    assert next(n for n in doc["nodes"] if n["name"] == "node3")["ifname"] == "eth0"
    answers = sim.probe("node3")["resolve"]
    monkeypatch.setattr(local.node_facts_module(), "resolve", lambda name: list(answers.get(name) or []))
    ctx = local.local_context(cluster, doc, "node3", copy.deepcopy(sim.node("node3")))  # no probe: no reach
    assert local.failures(local.run_local(ctx, "node3")) == []


def test_a_cluster_file_with_a_bad_ifname_is_refused(sim: Sim, tmp_path: Path) -> None:
    doc = clusterfile.build(sim.context())
    doc["nodes"][0]["ifname"] = "eth0;reboot"
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match=r"nodes\[0\]\.ifname 'eth0;reboot' is not an interface name"):
        clusterfile.load(str(path))


def test_hostile_reach_is_dropped_and_named() -> None:
    problems, got = guard_reach({
        "eth0;id": _entry("192.168.77.13", ["node1"]),
        "eth1": _entry("{{ 7*191 }}", ["node1"]),
        "eth2": {**_entry("192.168.77.23", ["node1", "$(id)"], {"node2\n": "x", "node3": "a\nFORGED"}),
                 "speed": "fast", "device": "yes"},
    })
    assert set(got) == {"eth2"}
    assert got["eth2"] == {"address": "192.168.77.23", "speed": None, "device": False, "reached": ["node1"],
                           "failed": {"node3": "a\\nFORGED"}}
    fields = {f for f, _, _ in problems}
    assert {"probe.reach", "probe.reach.eth1.address", "probe.reach.eth2.reached", "probe.reach.eth2.failed",
            "probe.reach.eth2.speed"} <= fields
    assert guard_reach("nope")[1] == {}


def test_hostile_reach_is_a_facts_invalid_finding(sim: Sim) -> None:
    sim.probe("node3")["reach"] = {"eth0": _entry("192.168.77.13", ["node1"]), "x/y": _entry("192.168.77.9", [])}
    found = [f for f in sim.findings() if f.id == reachability_rules.INVALID.id and f.host == "node3"]
    assert found and "probe.reach" in found[0].evidence and "x/y" in found[0].evidence


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ifname=hostile, address=hostile, peer=hostile, why=hostile)
def test_any_reach_value_is_validated(ifname: str, address: str, peer: str, why: str) -> None:
    _, got = guard_reach({ifname: _entry(address, [peer], {peer: why}), "eth0": _entry("10.0.0.1", [peer])})
    for name, e in got.items():
        assert valid_ifname(name) and is_ip(e["address"])
        for p in [*e["reached"], *e["failed"]]:
            assert "\n" not in p and "{" not in p and "$" not in p
        assert all("\n" not in w and "\x1b" not in w for w in e["failed"].values())


def test_unbound_reach_is_not_evaluated_never_a_pass(sim: Sim) -> None:
    from ddpfix.rules.engine import not_evaluated, run_checks

    _iso_first(sim, {"iso0": {**ISO_FAILS["iso0"], "device": False}, "eth0": ISO_FAILS["eth0"]})
    ctx = sim.context()
    findings = run_checks(ctx)
    assert not [f for f in findings if f.id == netif_rules.CANNOT_REACH_PEERS.id]
    (item,) = [i for i in not_evaluated(ctx, findings).get("node3", []) if i["id"] == netif_rules.CANNOT_REACH_PEERS.id]
    assert "iso0" in item["reason"] and "CAP_NET_RAW" in item["reason"]
