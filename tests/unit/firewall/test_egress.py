"""Issue 34 (egress, nftables and iptables): a node's own output-hook chains / iptables OUTPUT refuse its connects to
its peers: the audit says so on that node (the egress finding), the plan puts an accept of TCP to the cluster
CIDR on the master port and ephemeral range at the top of the chain that refuses it (proven by the same evaluator),
and refuses what it does not change. Inputs: the real NixOS table of tests/fixtures/rulesets (alemonmk-nixos-egress,
its source cited there), the real kubeadm legacy tables, and the recorded iptables-save format."""

from __future__ import annotations

import json
from typing import Any

from unit_helpers import ROOT, Sim

from ddpfix.ansible import collection
from ddpfix.firewall import egressfix
from ddpfix.firewall.ruleset import Ruleset
from ddpfix.firewall.verdict import Packet
from ddpfix.remediate import build_plan
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import reachability as reachability_rules
from ddpfix.rules.context import Context, HostFacts
from ddpfix.rules.engine import not_evaluated, run_checks

RULESETS = ROOT / "tests" / "fixtures" / "rulesets"
fw = collection.module_utils("ddpfix_fw")
CIDR = "192.168.77.0/24"


def nixos(private: str = "10.0.0.0/8", iface: str = "eth0") -> dict[str, Any]:
    """The recorded NixOS table (output: `oifname "eth0" ip saddr/daddr 10.0.0.0/8 drop`), its private network
    and uplink optionally replaced (as the lab loads it: the cluster's private network on its interface)."""
    st: dict[str, Any] = json.loads((RULESETS / "recorded" / "alemonmk-nixos-egress.nft.json").read_text())
    addr, plen = private.split("/")
    text = json.dumps(st).replace('"addr": "10.0.0.0", "len": 8', f'"addr": "{addr}", "len": {plen}')
    text = text.replace("10.0.0.0/8", private).replace('\\"eth0\\"', f'\\"{iface}\\"').replace(
        '"right": "eth0"', f'"right": "{iface}"')
    out: dict[str, Any] = json.loads(text)
    return out


def out(src: str, dst: str, port: int, iface: str | None = "eth0") -> Packet:
    return Packet.of(src, port, iface, dst=dst, out=True)


def test_nixos_output_chain_refuses_the_private_network_on_its_uplink() -> None:
    rs = Ruleset(nixos())
    v = rs.evaluate(out("10.0.0.11", "10.0.0.12", 29500))
    assert not v.allowed and v.decided and v.layer == "nftables"
    assert v.evidence == 'nft inet global output: oifname "eth0" ip saddr 10.0.0.0/8 drop'
    assert rs.evaluate(out("10.0.0.11", "10.0.0.12", 29500, "eth1")).allowed  # another interface: its policy
    unknown = rs.evaluate(out("10.0.0.11", "10.0.0.12", 29500, None))  # which interface: not known
    assert unknown.undecided and not unknown.decided
    # the input side is unchanged by the output chain (its own verdict: policy drop)
    assert not rs.evaluate(Packet.of("10.0.0.12", 29500, "eth0")).allowed


def test_iptables_output_of_either_backend_is_walked() -> None:
    st: dict[str, Any] = json.loads((RULESETS / "recorded" / "kubeadm-iptables-services.legacy.rules.json").read_text())
    rs = Ruleset(st)
    # kube-proxy's OUTPUT: KUBE-FIREWALL drops only marked packets (a mark ddpfix does not model): never a block
    v = rs.evaluate(out("192.168.83.11", "192.168.83.12", 29500))
    assert v.allowed and any("KUBE-FIREWALL" in u or "mark" in u for u in v.undecided), v
    # an iptables-services style OUTPUT REJECT tail in the same legacy tables: refused, with the rule as evidence
    legacy = st["iptables_legacy"].replace("-A OUTPUT -j KUBE-FIREWALL\n", "-A OUTPUT -j KUBE-FIREWALL\n"
                                           "-A OUTPUT -o lo -j ACCEPT\n"
                                           "-A OUTPUT -j REJECT --reject-with icmp-host-prohibited\n")
    rs = Ruleset(dict(st, iptables_legacy=legacy))
    v = rs.evaluate(out("192.168.83.11", "192.168.83.12", 29500))
    assert not v.allowed and v.layer == "iptables-legacy" and "filter OUTPUT #4: -A OUTPUT -j REJECT" in v.evidence
    assert rs.evaluate(out("192.168.83.11", "192.168.83.12", 29500, "lo")).allowed
    plan = egressfix.plan_egress(dict(st, iptables_legacy=legacy), "192.168.83.0/24", node="n1", own="192.168.83.11",
                                 peers=["192.168.83.12"], master_port=29500, ranges=[(32768, 60999)], iface="eth0",
                                 backend="iptables-legacy")
    assert plan.refusals == [] and [c.to_vars() for c in plan.changes] == [
        {"backend": "iptables-legacy", "family": "", "table": "filter", "chain": "OUTPUT", "ports": "29500,32768-60999"}]
    fixed, _ = fw.iptables_persisted(legacy, "192.168.83.0/24", line=fw.iptables_egress_line(
        "192.168.83.0/24", fw.egress_ports("29500,32768-60999")))
    assert ("-A OUTPUT -d 192.168.83.0/24 -p tcp -m multiport --dports 29500,32768:60999 -m comment --comment "
            "ddpfix-cluster -j ACCEPT") in fixed
    assert fw.iptables_has_egress(fixed, "192.168.83.0/24") and not fw.iptables_has_egress(legacy, "192.168.83.0/24")
    rs = Ruleset(dict(st, iptables_legacy=fixed))
    assert rs.evaluate(out("192.168.83.11", "192.168.83.12", 40000)).allowed
    assert not rs.evaluate(out("192.168.83.11", "192.168.83.12", 22)).allowed  # only the DDP ports
    assert not rs.evaluate(out("192.168.83.11", "198.51.100.7", 29500)).allowed  # only the cluster


def test_plan_inserts_one_accept_in_the_refusing_chain_and_keeps_the_rest() -> None:
    st = nixos("192.168.0.0/16")
    plan = egressfix.plan_egress(st, CIDR, node="node2", own="192.168.77.12", peers=["192.168.77.11"],
                                 master_port=29500, ranges=[(32768, 60999)], iface="eth0", backend="nftables")
    assert plan.refusals == []
    assert [c.to_vars() for c in plan.changes] == [
        {"backend": "nftables", "family": "inet", "table": "global", "chain": "output", "ports": "29500,32768-60999"}]
    rs = Ruleset(egressfix.with_changes(st, plan.changes, CIDR))
    assert rs.evaluate(out("192.168.77.12", "192.168.77.11", 29500)).allowed
    assert rs.evaluate(out("192.168.77.12", "192.168.77.11", 60999)).allowed
    assert not rs.evaluate(out("192.168.77.12", "192.168.254.34", 29500)).allowed  # outside the cluster: dropped
    assert not rs.evaluate(out("192.168.77.12", "192.168.77.11", 22)).allowed  # not a DDP port: dropped
    # the node side renders the same rule (the snippet the persist module writes)
    line = fw.nft_egress_line("inet", "global", "output", CIDR, fw.egress_ports("29500,32768-60999"))
    assert line == ('insert rule inet global output ip daddr 192.168.77.0/24 tcp dport { 29500, 32768-60999 } '
                    'accept comment "ddpfix-cluster"')


def test_a_drop_in_a_jumped_to_chain_is_fixed_in_its_base_chain_named_by_the_evaluator() -> None:
    """The refusing base chain comes from the evaluator (Verdict.chain), never from parsing its evidence text: a
    drop in a regular chain the output chain jumps to puts the accept at the top of that base chain."""
    def rule(chain: str, *expr: dict[str, Any]) -> dict[str, Any]:
        return {"rule": {"family": "inet", "table": "guard", "chain": chain, "handle": 9, "expr": list(expr)}}
    daddr = {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                       "right": {"prefix": {"addr": "192.168.77.0", "len": 24}}}}
    st = {"nft": {"nftables": [
        {"table": {"family": "inet", "name": "guard", "handle": 1}},
        {"chain": {"family": "inet", "table": "guard", "name": "out_policy", "handle": 2, "type": "filter",
                   "hook": "output", "prio": 0, "policy": "accept"}},
        {"chain": {"family": "inet", "table": "guard", "name": "to_lan", "handle": 3}},
        rule("out_policy", {"jump": {"target": "to_lan"}}),
        rule("to_lan", daddr, {"drop": None})]}}
    v = Ruleset(st).evaluate(out("192.168.77.12", "192.168.77.11", 29500))
    assert not v.allowed and v.layer == "nftables" and v.chain == ("inet", "guard", "out_policy"), v
    plan = egressfix.plan_egress(st, CIDR, node="node2", own="192.168.77.12", peers=["192.168.77.11"],
                                 master_port=29500, ranges=[(32768, 60999)], iface="eth0", backend="nftables")
    assert plan.refusals == [] and [(c.table, c.chain) for c in plan.changes] == [("guard", "out_policy")]
    assert Ruleset(egressfix.with_changes(st, plan.changes, CIDR)).evaluate(
        out("192.168.77.12", "192.168.77.11", 29500)).allowed
    assert Ruleset(st).evaluate(out("192.168.77.12", "198.51.100.7", 29500)).chain is None  # accepted: no chain


def test_plan_refuses_ufw_and_foreign_backends_naming_the_rule_and_command() -> None:
    st = nixos("192.168.0.0/16")
    plan = egressfix.plan_egress(st, CIDR, node="node2", own="192.168.77.12", peers=["192.168.77.11"],
                                 master_port=29500, ranges=[(32768, 60999)], iface="eth0", backend="iptables")
    assert plan.changes == [] and len(plan.refusals) == 1
    why = plan.refusals[0]
    assert 'nft inet global output: oifname "eth0" ip saddr 192.168.0.0/16 drop' in why
    assert "nft insert rule <family> <table> <output chain> ip daddr 192.168.77.0/24 tcp dport" in why
    ufw = ("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT DROP [0:0]\n:ufw-before-output - [0:0]\n"
           "-A OUTPUT -j ufw-before-output\nCOMMIT\n")
    plan = egressfix.plan_egress({"iptables": ufw}, CIDR, node="node2", own="192.168.77.12", peers=["192.168.77.11"],
                                 master_port=29500, ranges=[(32768, 60999)], iface="eth0", backend="iptables")
    assert plan.changes == [] and "ufw manages these chains" in plan.refusals[0]
    assert "ufw allow out to 192.168.77.0/24 proto tcp port 29500" in plan.refusals[0]


def test_port_spec_merges_and_bounds() -> None:
    assert egressfix.port_spec(29500, [(32768, 60999), (32768, 60999)]) == "29500,32768-60999"
    assert egressfix.port_spec(40000, [(32768, 60999)]) == "32768-60999"
    assert egressfix.port_spec(1, [(10 * i, 10 * i + 1) for i in range(1, 8)]) is None


def _ctx(sim: Sim) -> Context:
    hosts = {n: HostFacts(n, node=d["node"], probe=d["probe"], collected_at=d["collected_at"])
             for n, d in sim.docs.items()}
    return Context(sim.cluster(), hosts)


def test_audit_and_plan_on_the_recorded_cluster(sim: Sim) -> None:
    """node2 loads the NixOS table with the cluster's private network on its cluster interface: the audit says
    egress-blocked on node2 (and its input chain blocks the peers), the plan fixes both in that table."""
    st = nixos("192.168.0.0/16", sim.node("node2")["cluster"]["ifname"])
    sim.node("node2")["firewall"] = {**sim.node("node2")["firewall"], **{k: st[k] for k in ("nft", "nft_text")}}
    ctx = _ctx(sim)
    findings = run_checks(ctx)
    eg = [f for f in findings if f.id == firewall_rules.EGRESS_BLOCKED.id]
    assert [f.host for f in eg] == ["node2"], findings
    assert "nft inet global output" in eg[0].evidence and eg[0].var("layer") == "nftables"
    plans, refusals = build_plan(ctx, findings)
    assert refusals == []
    p = plans["node2"]
    assert p.firewall == "nftables" and p.ingress and p.to_vars()["egress"] == [
        {"backend": "nftables", "family": "inet", "table": "global", "chain": "output",
         "ports": "29500,32768-60999"}]
    # the input chain the audit's evaluator found refusing the peers takes the ingress accept (issue 38)
    assert p.to_vars()["nft_chains"] == [{"family": "inet", "table": "global", "chain": "input"}]
    assert not plans["node1"].egress and plans["node1"].firewall == "none" and not plans["node1"].nft_chains


def test_egress_only_leaves_input_alone_and_undecided_is_not_evaluated(sim: Sim) -> None:
    ifname = sim.node("node3")["cluster"]["ifname"]
    drop = {"nftables": [
        {"table": {"family": "inet", "name": "t"}},
        {"chain": {"family": "inet", "table": "t", "name": "out", "type": "filter", "hook": "output", "prio": 0,
                   "policy": "accept"}},
        {"rule": {"family": "inet", "table": "t", "chain": "out", "handle": 2, "expr": [
            {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": ifname}}, {"drop": None}]}}]}
    sim.node("node3")["firewall"] = {**sim.node("node3")["firewall"], "nft": drop, "nft_text": None}
    ctx = _ctx(sim)
    findings = run_checks(ctx)
    assert {(f.id, f.host) for f in findings if f.id.startswith("firewall.")} == {
        (firewall_rules.EGRESS_BLOCKED.id, "node3")}
    plans, refusals = build_plan(ctx, findings)
    assert refusals == [] and plans["node3"].firewall == "nftables" and not plans["node3"].ingress
    assert plans["node3"].egress[0]["chain"] == "out"
    assert plans["node3"].nft_chains == []  # egress only: no input chain planned
    # a rule the evaluator does not model ahead of the drop: not evaluated on node3, neither a pass nor a block
    drop["nftables"][2]["rule"]["expr"].insert(0, {"match": {"op": "==", "left": {"meta": {"key": "mark"}},
                                                            "right": 1}})
    drop["nftables"][2]["rule"]["expr"][0], drop["nftables"][2]["rule"]["expr"][1] = (
        drop["nftables"][2]["rule"]["expr"][1], drop["nftables"][2]["rule"]["expr"][0])
    ctx = _ctx(sim)  # node3's own probes connected to every peer: they decide it
    findings = run_checks(ctx)
    assert not [f for f in findings if f.id == firewall_rules.EGRESS_BLOCKED.id]
    assert firewall_rules.EGRESS_BLOCKED.id not in {x["id"] for x in not_evaluated(ctx, findings).get("node3", [])}
    sim.probe("node3")["connects"] = []  # not probed: not evaluated, with the rule
    ctx = _ctx(sim)
    findings = run_checks(ctx)
    assert not [f for f in findings if f.id == firewall_rules.EGRESS_BLOCKED.id]
    ne = {x["id"]: x["reason"] for x in not_evaluated(ctx, findings).get("node3", [])}
    assert "undecided" in ne[firewall_rules.EGRESS_BLOCKED.id] and "meta" in ne[firewall_rules.EGRESS_BLOCKED.id]
    assert not [f for f in findings if f.id == reachability_rules.INCOMPLETE.id and f.host == "node3"]


def test_a_privileged_source_port_match_never_matches_a_dialer() -> None:
    """`tcp sport 22 accept` (replies of the node's sshd) never matches the node's own connects, whose source port
    is an unprivileged one; `tcp sport 2000` may: undecided, as in iptables (`--sport`)."""
    chain = {"chain": {"family": "inet", "table": "t", "name": "o", "type": "filter", "hook": "output", "prio": 0,
                       "policy": "drop"}}

    def rule(right: Any) -> dict[str, Any]:
        return {"rule": {"family": "inet", "table": "t", "chain": "o", "handle": 3, "expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "sport"}}, "right": right}},
            {"accept": None}]}}
    for right, decided in ((22, True), ({"set": [22, {"range": [80, 443]}]}, True), (2000, False)):
        v = Ruleset({"nft": {"nftables": [chain, rule(right)]}}).evaluate(out("10.0.0.1", "10.0.0.2", 29500))
        assert not v.allowed and v.decided == decided, (right, v)


def test_node_side_checks_every_planned_change_before_any_command() -> None:
    """The plan reaches the node as data: each change is checked against its grammar and passed as argv."""
    ok = {"backend": "nftables", "family": "inet", "table": "global", "chain": "output", "ports": "29500,32768-60999"}
    assert fw.egress_change(ok, CIDR) == ("nftables", "inet", "global", "output", [(29500, 29500), (32768, 60999)])
    assert fw.egress_change({"backend": "iptables-legacy", "chain": "OUTPUT", "ports": "29500"}, CIDR)[3] == "OUTPUT"
    for bad in ({**ok, "chain": "output; flush ruleset"}, {**ok, "chain": "output\n"}, {**ok, "ports": "29500\n"}, {**ok, "table": "a b"}, {**ok, "family": "ip6"},
                {**ok, "table": "firewalld"}, {**ok, "ports": "0-70000"}, {**ok, "ports": "1,2,3,4,5,6,7,8"},
                {**ok, "ports": "22 accept"}, {"backend": "iptables", "chain": "INPUT", "ports": "1"}, "x"):
        try:
            fw.egress_change(bad, CIDR)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")
    # the live check finds ddpfix's accept (any run's tag) only ahead of the drop
    rule = egressfix._nft_rule(egressfix.EgressChange("nftables", "inet", "t", "o", "29500"), CIDR, [(29500, 29500)])
    drop = {"rule": {"family": "inet", "table": "t", "chain": "o", "expr": [{"drop": None}]}}
    rule["rule"]["comment"] = "ddpfix-cluster:run1"
    assert fw.nft_has_egress({"nftables": [rule, drop]}, ("inet", "t", "o"), CIDR)
    assert not fw.nft_has_egress({"nftables": [drop, rule]}, ("inet", "t", "o"), CIDR)
    assert not fw.nft_has_egress({"nftables": [rule, drop]}, ("inet", "t", "o"), "192.168.78.0/24")


def test_controller_and_node_agree_on_the_nft_names_they_pass() -> None:
    """A table/chain name comes from the node's own ruleset (hostile input) and ends up as an argument of `nft insert
    rule`: the controller's plan and the node-side module accept exactly nft's identifiers, never an option word."""
    good = ("input", "INPUT", "filter", "_x", ".k", "DOCKER-USER", "ufw-user-input", "a" * 64)
    bad = ("-f", "-c", "--file", "0abc", "a b", "in\nput", "$(id)", "{{ 7*191 }}", "x;y", "a/b", "", "a" * 65)
    for name in good:
        assert egressfix._NAME.fullmatch(name) and fw.NFT_NAME.fullmatch(name), name
    for name in bad:
        assert not egressfix._NAME.fullmatch(name) and not fw.NFT_NAME.fullmatch(name), name
