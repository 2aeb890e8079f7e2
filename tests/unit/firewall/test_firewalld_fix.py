"""Where ddpfix fixes firewalld (issue 34): the zone that already holds the cluster network, the zone the cluster
interface is bound to, the policy from HOST that restricts egress; refusals for what it must not override. The
firewalld states are the recorded ones (tests/unit/fixtures/firewall/fwdpol_*.json: firewalld 1.3.3, recorded by
record-fwd-policy.sh; fwd_dbus.json by record.sh)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.firewall import firewalld as fwd
from ddpfix.firewall.firewalld import fix as fwfix
from ddpfix.firewall.verdict import Packet
from ddpfix.inventory.contract import check_role_var, role_var_specs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "firewall"
CIDR = "192.168.83.0/24"
PORTS = [29500, 32768, 46883, 60999]


def recorded(name: str) -> fwd.Firewalld:
    return fwd.Firewalld.of(json.loads((FIX / name).read_text())["firewalld"])


@pytest.fixture(params=["fwdpol_dbus.json", "fwdpol_cli.json"])
def pol(request: pytest.FixtureRequest) -> fwd.Firewalld:
    return recorded(request.param)


def test_policies_and_direct_rules_read_alike_over_dbus_and_cli() -> None:
    assert recorded("fwdpol_dbus.json").policies == recorded("fwdpol_cli.json").policies
    d = recorded("fwdpol_cli.json")
    assert d.policies["egress-lockdown"].target == "REJECT" and d.policies["egress-lockdown"].ingress_zones == ("HOST",)
    assert [r.text for r in d.direct_rules] == ["ipv4 filter OUTPUT 0 -d 203.0.113.0/24 -j DROP"]


def test_bound_zone_gets_a_rich_rule_never_a_conflicting_source(pol: fwd.Firewalld) -> None:
    """192.168.83.0/24 is a source of `internal` (ssh, mdns, samba-client, dhcpv6-client): blocked there; the fix is
    a rich rule in `internal`, not the source in `trusted` (firewalld's ZONE_CONFLICT)."""
    v = fwd.evaluate(pol, Packet.of("192.168.83.12", 29500, "eth0", dst="192.168.83.11"))
    assert v.verdict == "reject" and "zone 'internal' (source 192.168.83.0/24)" in v.evidence
    plan = fwd.plan_fix(pol, CIDR, node="node1", iface="eth0", own="192.168.83.11", peers=["192.168.83.12"],
                        ports=PORTS)
    assert plan.refusals == []
    assert [c.to_vars() for c in plan.changes] == [
        {"zone": "internal", "rich_rule": 'rule family="ipv4" source address="192.168.83.0/24" accept'}]
    after = fwfix._with(pol, plan.changes)
    assert all(fwd.evaluate(after, Packet.of("192.168.83.12", p, "eth0")).verdict == "accept" for p in PORTS)
    # outside the cluster network: still what the user's zones say
    assert fwd.evaluate(after, Packet.of("10.9.9.9", 29500, "eth0")).verdict == "reject"
    assert fwd.evaluate(after, Packet.of("192.168.83.12", 22, "eth0")).verdict == "accept"


@pytest.mark.parametrize(("source", "expect"), [("192.168.0.0/16", ["internal"]),
                                                ("192.168.83.0/26", ["internal", ""])])
def test_a_network_containing_or_inside_the_cluster_network(pol: fwd.Firewalld, source: str,
                                                            expect: list[str]) -> None:
    """A wider source: its zone alone gets the rule; a narrower one: its zone, and the rest of the cluster network
    becomes a source of the configured zone ("": eth0 is bound to the default zone public, as NetworkManager binds
    it, which is no choice about the cluster's traffic)."""
    z = dataclasses.replace(pol.zones["internal"], sources=(source,))
    fw = dataclasses.replace(pol, zones={**pol.zones, "internal": z})
    plan = fwd.plan_fix(fw, CIDR, node="n", iface="eth0", own="192.168.83.11", peers=["192.168.83.12"],
                        ports=PORTS)
    assert [c.name for c in plan.changes] == expect and not plan.refusals


def test_cluster_interface_bound_to_a_zone() -> None:
    fw = recorded("fwd_dbus.json")  # eth1 bound to internal (record.sh)
    plan = fwd.plan_fix(fw, CIDR, node="n", iface="eth1", own="192.168.83.11", peers=["192.168.83.12"], ports=PORTS)
    assert [(c.kind, c.name, c.rich_rule) for c in plan.changes] == [
        ("zone", "internal", 'rule family="ipv4" source address="192.168.83.0/24" accept')]


def test_nothing_bound_the_cluster_network_becomes_a_source_of_the_configured_zone(pol: fwd.Firewalld) -> None:
    fw = dataclasses.replace(pol, zones={"public": pol.zones["public"]})
    for iface in ("eth9", "eth0"):  # not bound; bound to the default zone (public)
        plan = fwd.plan_fix(fw, CIDR, node="n", iface=iface, own="192.168.83.11", peers=["192.168.83.12"],
                            ports=PORTS)
        assert [c.to_vars() for c in plan.changes] == [{"zone": "", "source": CIDR}]


def test_egress_policy_gets_a_destination_rule(pol: fwd.Firewalld) -> None:
    pkt = Packet.of("192.168.83.11", 29500, "eth0", dst="192.168.83.12")
    v = fwd.evaluate_egress(pol, pkt, "eth0")
    assert v.verdict == "reject" and v.evidence.startswith("firewalld policy 'egress-lockdown'")
    assert fwd.evaluate_egress(pol, Packet.of("192.168.83.11", 22, "eth0", dst="192.168.83.12"), "eth0").verdict \
        == "accept"
    plan = fwd.plan_fix(pol, CIDR, node="n", iface="eth0", own="192.168.83.11", peers=["192.168.83.12"],
                        ports=PORTS, ingress=False, egress=True)
    assert [c.to_vars() for c in plan.changes] == [
        {"policy": "egress-lockdown", "rich_rule": 'rule family="ipv4" destination address="192.168.83.0/24" accept'}]
    after = fwfix._with(pol, plan.changes)
    assert fwd.evaluate_egress(after, pkt, "eth0").verdict == "accept"
    # elsewhere the policy still rejects
    assert fwd.evaluate_egress(after, Packet.of("192.168.83.11", 29500, "eth0", dst="172.16.0.1"),
                               "eth0").verdict == "reject"


def test_a_direct_output_rule_is_refused_by_name(pol: fwd.Firewalld) -> None:
    fw = dataclasses.replace(pol, direct_rules=(fwd.DirectRule("ipv4", "filter", "OUTPUT", 0,
                                                               ("-d", "192.168.83.0/24", "-j", "DROP")),))
    plan = fwd.plan_fix(fw, CIDR, node="node1", iface="eth0", own="192.168.83.11", peers=["192.168.83.12"],
                        ports=PORTS, ingress=False, egress=True)
    assert plan.changes == [] and len(plan.refusals) == 1
    r = plan.refusals[0]
    assert "ipv4 filter OUTPUT 0 -d 192.168.83.0/24 -j DROP" in r and "/etc/firewalld/direct.xml" in r
    assert "firewall-cmd --permanent --direct --add-rule ipv4 filter OUTPUT -1 -d 192.168.83.0/24 -j ACCEPT" in r


def test_a_deny_rule_of_a_lower_priority_is_refused_with_the_command(pol: fwd.Firewalld) -> None:
    deny = 'rule priority="-100" family="ipv4" source address="192.168.83.0/24" reject'
    z = dataclasses.replace(pol.zones["internal"], rich_rules=(deny,))
    fw = dataclasses.replace(pol, zones={**pol.zones, "internal": z})
    plan = fwd.plan_fix(fw, CIDR, node="node1", iface="eth0", own="192.168.83.11", peers=["192.168.83.12"],
                        ports=PORTS)
    assert plan.changes == [] and len(plan.refusals) == 1
    r = plan.refusals[0]
    assert deny in r and "/etc/firewalld/zones/internal.xml" in r and "firewall-cmd --permanent --zone=internal" in r


@pytest.mark.parametrize("value", ["trusted --add-source=0.0.0.0/0", "../../../etc/shadow", "a;b $(id)",
                                   "x" * 18, "", "tr\u00fcsted"])
def test_hostile_zone_names_refused_before_any_contact(value: str) -> None:
    with pytest.raises(DdpfixError) as exc:
        check_role_var("node1", "ddpfix_firewall_zone", value, role_var_specs()["ddpfix_firewall_zone"])
    msg = str(exc.value)
    assert exc.value.code == ExitCode.INVALID_INPUT and "\n" not in msg
    assert msg.startswith(f"ddpfix_firewall_zone of node1 {value!r}") and "firewalld zone name" in msg


@pytest.mark.parametrize(("var", "value"), [("ddpfix_verify_python", "python3; id"),
                                            ("ddpfix_verify_python", "docker run x"),
                                            ("ddpfix_verify_nproc", "1 --foo"),
                                            ("ddpfix_verify_override", {"X=1; id #": "1"})])
def test_other_inputs_that_reach_a_command_refused(var: str, value: object) -> None:
    with pytest.raises(DdpfixError) as exc:
        check_role_var("node1", var, value, role_var_specs()[var])
    assert exc.value.code == ExitCode.INVALID_INPUT and var in str(exc.value)


@pytest.mark.parametrize("value", ["trusted", "internal", "my_zone-2", "x" * 17])
def test_zone_names_accepted(value: str) -> None:
    check_role_var("node1", "ddpfix_firewall_zone", value, role_var_specs()["ddpfix_firewall_zone"])
    check_role_var("node1", "ddpfix_verify_override", {"NNODES": "2", "MASTER_ADDR": "10.0.0.1"},
                   role_var_specs()["ddpfix_verify_override"])


SHAPES = Path(__file__).resolve().parents[2] / "fixtures" / "rulesets" / "firewalld"


def _direct(name: str) -> tuple[fwd.DirectRule, ...]:
    """The `--direct --add-rule` lines of a shape file as firewalld lists them."""
    out = []
    for ln in (SHAPES / name).read_text().splitlines():
        if "--direct --add-rule " in ln:
            r = fwd.DirectRule.of(ln.split("--add-rule ", 1)[1])
            assert r is not None, ln
            out.append(r)
    return tuple(out)


def test_published_direct_output_rules_block_egress_and_are_refused(pol: fwd.Firewalld) -> None:
    """tests/fixtures/rulesets/firewalld/direct-output-drop.sh (a published egress lock-down with direct rules):
    established replies and http/dns pass, a connect to a peer hits the priority-99 DROP; ddpfix refuses by name."""
    fw = dataclasses.replace(pol, policies={}, direct_rules=_direct("direct-output-drop.sh"))
    ok = fwd.evaluate_egress(fw, Packet.of("192.168.83.11", 80, "eth0", dst="192.168.83.12"), "eth0")
    assert ok.verdict == "accept" and "--dport 80" in ok.evidence
    v = fwd.evaluate_egress(fw, Packet.of("192.168.83.11", 29500, "eth0", dst="192.168.83.12"), "eth0")
    assert v.verdict == "drop" and v.evidence == "firewalld direct rule: ipv4 filter OUTPUT 99 -j DROP"
    plan = fwd.plan_fix(fw, CIDR, node="node1", iface="eth0", own="192.168.83.11", peers=["192.168.83.12"],
                        ports=PORTS, ingress=False, egress=True)
    assert not plan.changes and "ipv4 filter OUTPUT 99 -j DROP" in plan.refusals[0]
