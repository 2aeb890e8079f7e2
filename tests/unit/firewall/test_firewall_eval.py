"""Unit tests for the controller's firewall evaluator (controller/ddpfix/firewall/).

All fixtures under fixtures/firewall/ were recorded from the real tools in
throwaway network namespaces by fixtures/firewall/record.sh (iptables 1.8.9
nf_tables, nftables 1.0.6, firewalld 1.3.3 with its own dbus-daemon). The
node-side collector that produces them is tested in test_firewall_collect.py.
"""
import copy
import json
import os

import pytest
from unit_helpers import FIREWALL_FIXTURES

from ddpfix import firewall as fw
from ddpfix.ansible import collection
from ddpfix.firewall import firewalld

FIX = str(FIREWALL_FIXTURES)
node = collection.module_utils("ddpfix_firewall")  # parse_list_all: the collector's firewall-cmd text parser


def read(name):
    with open(os.path.join(FIX, name)) as fh:
        return fh.read()


def state(ipt=None, nft=None, nft_text=None, firewalld=None):
    return {"schema": fw.SCHEMA, "firewalld": firewalld,
            "iptables": read(ipt) if ipt else None, "iptables_legacy": None, "ip6tables": None,
            "nft": json.loads(read(nft)) if nft else None,
            "nft_text": read(nft_text) if nft_text else None, "errors": []}


@pytest.fixture
def ipt():
    """iptables-nft ruleset as seen by BOTH iptables-save and nft -j (double-count case)."""
    return state("ipt_cluster.iptables-save", "ipt_cluster.nft.json", "ipt_cluster.nft.txt")


@pytest.fixture
def nft():
    return state(None, "nft_inet.json", "nft_inet.txt")


@pytest.fixture(params=["fwd_dbus.json", "fwd_cli.json"])
def fwd(request):
    """firewalld 1.3.3 state collected by collect() via D-Bus and via firewall-cmd."""
    return json.loads(read(request.param))


def ok(st, src, port, iface="eth0", **kw):
    return fw.evaluate(st, src, port, iface=iface, **kw)


# --------------------------------------------------------------------------- iptables

def test_ipt_multiport_range_from_cluster_cidr_accepted(ipt):
    r = ok(ipt, "10.10.1.1", 40000)
    assert r.allowed and r.layer == "iptables" and r.explicit
    assert r.evidence == ("iptables filter INPUT #5: -A INPUT -s 10.10.0.0/16 -p tcp -m conntrack "
                             "--ctstate NEW -m multiport --dports 29500,32768:60999 -j ACCEPT")


def test_ipt_source_outside_cidr_hits_policy_drop(ipt):
    r = ok(ipt, "10.11.1.1", 29500)
    assert not r.allowed and r.verdict == "drop"
    assert r.evidence == "iptables filter INPUT policy DROP"


def test_ipt_established_only_rule_does_not_admit_new(ipt):
    # rule #3: -p tcp --dport 29400 -m conntrack --ctstate ESTABLISHED -j ACCEPT
    r = ok(ipt, "10.10.1.1", 29400)
    assert r.allowed is False and r.evidence == "iptables filter INPUT policy DROP"


def test_ipt_not_lo_interface(ipt):
    r = ok(ipt, "192.0.2.1", 22, iface="eth0")
    assert r.allowed and "#4: -A INPUT ! -i lo -p tcp -m tcp --dport 22 -j ACCEPT" in r.evidence
    assert "#1: -A INPUT -i lo -j ACCEPT" in ok(ipt, "127.0.0.1", 22, iface="lo").evidence
    # unknown interface = some non-loopback interface: "! -i lo" matches
    assert ok(ipt, "192.0.2.1", 22, iface=None).allowed


def test_ipt_user_chain_jump_accept(ipt):
    r = ok(ipt, "10.20.1.1", 29500, iface="eth0")
    assert r.allowed
    assert r.evidence == ("iptables filter CLUSTER #3: -A CLUSTER -p tcp -m tcp --dport 29500 -j ACCEPT "
                             "(via INPUT #6)")
    r = ok(ipt, "10.20.1.1", 45000, iface="eth0")  # multiport range a:b inside the user chain
    assert r.allowed and "CLUSTER #4" in r.evidence


def test_ipt_user_chain_interface_restriction(ipt):
    assert not ok(ipt, "10.20.1.1", 29500, iface="eth1").allowed  # jump is "-i eth0" only


def test_ipt_user_chain_return_falls_through_to_policy(ipt):
    r = ok(ipt, "10.20.9.1", 29500)  # CLUSTER #1: -s 10.20.9.0/24 -j RETURN
    assert not r.allowed and r.evidence == "iptables filter INPUT policy DROP"


def test_ipt_return_then_later_reject_rule(ipt):
    r = ok(ipt, "10.20.1.1", 55000)  # CLUSTER does not accept 55000, back in INPUT the REJECT hits
    assert r.verdict == "reject"
    assert r.evidence == ("iptables filter INPUT #10: -A INPUT -p tcp -m tcp --dport 32768:60999 "
                             "-j REJECT --reject-with icmp-port-unreachable")


def test_ipt_goto_chain_end_uses_builtin_policy(ipt):
    assert ok(ipt, "10.30.1.1", 29500).allowed  # LOGDROP #1 accepts 29500
    r = ok(ipt, "10.30.1.1", 23)  # -g LOGDROP: end of LOGDROP does not return into INPUT
    assert not r.allowed and r.evidence == "iptables filter INPUT policy DROP"
    # but a rule *before* the goto still applies
    assert ok(ipt, "10.30.1.1", 22).allowed


def test_ipt_unknown_match_before_the_drop_is_undecided(ipt):
    r = ok(ipt, "192.0.2.1", 8080)  # -m recent --rcheck ... -j ACCEPT, then the DROP policy
    assert not r.allowed and not r.decided  # dropped only if the recent list does not hold the source
    assert len(r.undecided) == 1 and "-m recent --rcheck" in r.undecided[0]
    assert r.evidence == "iptables filter INPUT policy DROP"


def test_ipt_policy_accept_vs_drop_and_reject_rules():
    st = state("ipt_reject.iptables-save")
    d = ok(st, "10.1.1.1", 29500)
    assert d.verdict == "drop" and d.evidence.endswith("-A INPUT -p tcp -m tcp --dport 29500 -j DROP")
    rj = ok(st, "10.1.1.1", 33000)
    assert rj.verdict == "reject" and "#2:" in rj.evidence
    a = ok(st, "10.1.1.1", 22)
    assert a.allowed and not a.explicit and a.evidence == "iptables filter INPUT policy ACCEPT"


def test_ipt_parse_and_options_edge_cases():
    text = "\n".join([
        "*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]",
        "[5:300] -A INPUT -p udp -m udp --dport 29500 -j DROP",
        "-A INPUT -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -m iprange --src-range 10.0.0.1-10.0.0.9 -j DROP",
        "-A INPUT -p tcp -m tcp ! --syn -j DROP",
        "-A INPUT -i eth+ -p tcp -m tcp --dport 1024: -m comment --comment \"hi there\" -j REJECT",
        "COMMIT"])
    st = {"iptables": text}
    assert ok(st, "10.0.0.5", 29500).verdict == "drop"  # SYN + iprange
    assert ok(st, "10.0.0.50", 29500, iface="eth1").verdict == "reject"  # eth+ wildcard, 1024:
    assert ok(st, "10.0.0.50", 29500, iface="ib0").allowed
    assert ok(st, "10.0.0.50", 80, iface="eth1").allowed
    assert ok(st, "10.0.0.50", 29500, iface="eth1", proto="udp").verdict == "drop"


# --------------------------------------------------------------------------- nftables

def test_nft_named_set_prefix_and_range(nft):
    for src in ("10.10.1.1", "192.168.5.10"):
        r = ok(nft, src, 29500)
        assert r.allowed, r
        assert r.evidence == "nft inet filter input: meta l4proto { tcp, udp } th dport 29500 ip saddr @cluster accept"
    r = ok(nft, "192.168.5.21", 29500)
    assert not r.allowed and r.evidence == "nft inet filter input policy drop"


def test_nft_prefix_and_port_range(nft):
    assert ok(nft, "10.20.1.1", 40000).allowed
    assert not ok(nft, "10.21.1.1", 40000).allowed


def test_nft_not_prefix_anonymous_set_with_range_reject(nft):
    r = ok(nft, "11.1.1.1", 8050)
    assert r.verdict == "reject"
    assert "ip saddr != 10.0.0.0/8 tcp dport { 80, 443, 8000-8100 } reject with tcp reset" in r.evidence
    assert ok(nft, "10.1.1.1", 8050).verdict == "drop"  # inside 10/8: falls to policy drop


def test_nft_ct_state_established_only_and_comparison(nft):
    r = ok(nft, "10.1.1.1", 443)  # ct state established,related accept must not admit NEW
    assert r.verdict == "drop" and 'tcp dport < 1024 log prefix "low " drop' in r.evidence
    assert ok(nft, "10.1.1.1", 22).allowed  # ct state { new, untracked } tcp dport 22 accept


def test_nft_iifname_wildcard_and_vmap_jump_return(nft):
    assert ok(nft, "10.1.1.1", 9000, iface="eth1").allowed  # vmap -> jump svc -> accept
    r = ok(nft, "10.1.1.1", 9001, iface="eth1")  # svc returns -> policy drop
    assert r.evidence == "nft inet filter input policy drop"
    r = ok(nft, "10.1.1.1", 9000, iface="eth2")
    assert "iifname vmap" in r.evidence and r.verdict == "drop"
    r = ok(nft, "10.10.1.1", 29500, iface="wlan0")  # iifname != "eth*" drop
    assert r.verdict == "drop" and 'iifname != "eth*"' in r.evidence


def test_nft_all_base_chains_ordered_by_hook_and_priority(nft):
    r = ok(nft, "10.10.7.7", 29500)  # accepted by inet filter input, dropped in ip guard prerouting
    assert not r.allowed and r.evidence == "nft ip guard pre: ip saddr @blocked drop"
    assert len(r.layers) == 1


def test_nft_unknown_interface_is_reported(nft):
    r = ok(nft, "10.10.1.1", 29500, iface=None)
    assert r.allowed and not r.decided  # dropped if the (unknown) interface is not eth*
    assert any('iifname != "eth*"' in n for n in r.undecided)


def test_nft_ipv6_source_skips_ip_tables(nft):
    r = fw.evaluate(nft, "2001:db8::1", 22, iface="eth0")
    assert r.allowed and "tcp dport 22" in r.evidence
    assert fw.evaluate(nft, "2001:db8::1", 29500, iface="eth0").verdict == "drop"


# --------------------------------------------------------------------------- double counting

def test_iptables_nft_table_not_double_counted(ipt):
    r = ok(ipt, "10.10.1.1", 29500)
    assert r.allowed and [lr.layer for lr in r.layers] == ["iptables"]
    assert not r.notes
    # without the iptables-save text the same table is evaluated from nft -j, where
    # the conntrack/multiport xt matches are opaque (so the guard is what keeps it clean)
    only_nft = dict(ipt, iptables=None)
    r = ok(only_nft, "10.10.1.1", 29500)
    assert not r.allowed and r.layer == "nftables" and not r.decided
    assert any("ip saddr 10.10.0.0/16 ct state new tcp dport { 29500, 32768-60999 }" in n for n in r.undecided)


def test_legacy_iptables_does_not_hide_nft_tables(ipt):
    st = dict(ipt, iptables=ipt["iptables"].replace("(nf_tables)", "(legacy)"))
    r = ok(st, "10.10.1.1", 29500)
    assert [lr.layer for lr in r.layers] == ["iptables", "nftables"]


# --------------------------------------------------------------------------- firewalld

def test_firewalld_trusted_source_zone_accepts_everything(fwd):
    r = ok(fwd, "10.10.1.1", 45678)
    assert r.allowed and r.layer == "firewalld"
    assert r.evidence == "firewalld zone 'trusted' (source 10.10.0.0/16): target ACCEPT"


def test_firewalld_drop_source_zone_beats_interface_zone(fwd):
    r = ok(fwd, "10.99.1.1", 22)
    assert r.verdict == "drop" and "zone 'drop' (source 10.99.0.0/16): target DROP" in r.evidence


def test_firewalld_port_in_interface_zone(fwd):
    r = ok(fwd, "10.1.1.1", 29500)
    assert r.allowed and r.evidence == \
        "firewalld zone 'public' (default zone; interface eth0): port 29500/tcp"


def test_firewalld_port_missing_rejected_with_zone_evidence(fwd):
    r = ok(fwd, "10.1.1.1", 40000)
    assert r.verdict == "reject"
    assert r.evidence.startswith("firewalld zone 'public' (default zone; interface eth0): target default, "
                                    "40000/tcp not in ports [29500/tcp] / services [")
    for svc in ("ssh", "dhcpv6-client", "http"):
        assert svc in r.evidence


def test_firewalld_service_port(fwd):
    assert "service http (80/tcp)" in ok(fwd, "10.1.1.1", 80).evidence
    r = ok(fwd, "10.1.1.1", 22, iface="eth1")
    assert r.allowed and r.evidence.startswith("firewalld zone 'internal' (interface eth1): service ssh")
    assert not ok(fwd, "10.1.1.1", 80, iface="eth1").allowed  # http only in public


def test_firewalld_default_zone_fallback(fwd):
    for iface in ("eth2", None):
        r = ok(fwd, "10.1.1.1", 29500, iface=iface)
        assert r.allowed and "(default zone; interface %s)" % (iface or "unknown") in r.evidence


def test_firewalld_rich_rules(fwd):
    r = ok(fwd, "10.20.6.5", 40000)
    assert r.allowed and 'rich rule: rule family="ipv4" source address="10.20.0.0/16" port port="32768-60999"' \
        in r.evidence
    r = ok(fwd, "10.20.5.5", 40000)  # deny rich rules are evaluated before allow rich rules
    assert r.verdict == "reject" and 'source address="10.20.5.0/24"' in r.evidence
    r = ok(fwd, "8.8.8.8", 29400)  # source NOT address
    assert r.verdict == "drop" and "source NOT address" in r.evidence
    assert ok(fwd, "10.8.8.8", 29400).verdict == "reject"  # inside 10/8: not dropped, just not open
    r = ok(fwd, "10.40.1.1", 443)  # rich rule referring to a service
    assert r.allowed and 'service name="https"' in r.evidence
    assert not ok(fwd, "10.41.1.1", 443).allowed


def test_firewalld_limited_rich_rule_is_unknown(fwd):
    r = ok(fwd, "10.50.1.1", 8080, iface="eth1")
    assert not r.allowed and not r.decided and any("limit" in n for n in r.undecided)


def test_firewalld_loopback(fwd):
    assert ok(fwd, "127.0.0.1", 12345, iface="lo").allowed


def test_firewalld_plus_iptables_layer_both_must_accept(fwd):
    r = ok(fwd, "10.10.1.1", 40001)  # trusted zone accepts, iptables-nft rule drops
    assert r.verdict == "drop" and r.layer == "iptables"
    assert [lr.layer for lr in r.layers] == ["firewalld", "iptables"]  # firewalld's nft table skipped


CROSS = [(s, p, i) for s in ("10.10.1.1", "10.99.1.1", "10.1.1.1", "10.20.5.5", "10.20.6.5", "8.8.8.8",
                             "10.40.1.1", "10.50.1.1")
         for p in (22, 80, 443, 8080, 29400, 29500, 32768, 40000, 40001, 60999, 61000)
         for i in ("eth0", "eth1", "eth2", "lo")]


def test_firewalld_zone_model_agrees_with_its_generated_nft_ruleset(fwd):
    """The zone model and the nft evaluation of firewalld's own table must agree."""
    raw = dict(fwd, firewalld=None)
    for src, port, iface in CROSS:
        a, b = ok(fwd, src, port, iface=iface), ok(raw, src, port, iface=iface)
        if "limit" in " ".join(a.undecided):
            continue  # the zone model reports the limited rule as unknown, nft has no limit stmt here
        assert a.allowed == b.allowed, (src, port, iface, a.evidence, b.evidence)


def test_firewalld_dbus_and_cli_collection_equivalent():
    a, b = json.loads(read("fwd_dbus.json")), json.loads(read("fwd_cli.json"))
    assert a["firewalld"]["source"] == "dbus" and b["firewalld"]["source"] == "cli"
    for src, port, iface in CROSS:
        assert ok(a, src, port, iface=iface).allowed == ok(b, src, port, iface=iface).allowed


def test_firewalld_zone_drifting_old_versions(fwd):
    st = copy.deepcopy(fwd)
    st["firewalld"]["zones"]["work"] = dict(st["firewalld"]["zones"]["internal"], interfaces=[],
                                           sources=["10.60.0.0/16"], rich_rules=[])
    assert not ok(st, "10.60.1.1", 29500).allowed  # 1.x: source zone is final
    st["firewalld"].update(version="0.8.2", allow_zone_drifting=True)
    r = ok(st, "10.60.1.1", 29500)  # drifts from 'work' into the interface zone 'public'
    assert r.allowed and "zone 'public'" in r.evidence


def test_parse_list_all_zones_text():
    zones = node.parse_list_all(read("fwd.list-all-zones.txt"))
    pub = zones["public"]
    assert pub["target"] == "default" and pub["interfaces"] == ["eth0"] and ["29500", "tcp"] in pub["ports"]
    assert len(pub["rich_rules"]) == 4 and all(r.startswith("rule family=") for r in pub["rich_rules"])
    assert zones["trusted"]["target"] == "ACCEPT" and zones["trusted"]["sources"] == ["10.10.0.0/16"]
    assert zones["block"]["target"] == "%%REJECT%%"


def test_parse_rich_rule():
    r = firewalld.parse_rich('rule priority="-5" family="ipv4" source NOT address="10.0.0.0/8" '
                       'log prefix="x" level="info" limit value="1/m" port port="1-2" protocol="tcp" accept')
    assert r is not None
    assert r.priority == -5 and r.family == "ipv4" and r.action == "accept" and not r.limit
    assert [e.kind for e in r.elements] == ["source", "port"] and r.elements[0].negated


# --------------------------------------------------------------------------- world_open

def test_world_open_positive_iptables(ipt):
    ev = fw.world_open(ipt, 29600, "10.0.0.0/8", iface="eth0")
    assert ev and "203.0.113.7" in ev and "-A INPUT -p tcp -m tcp --dport 29600 -j ACCEPT" in ev


def test_world_open_positive_firewalld_port(fwd):
    ev = fw.world_open(fwd, 29500, "10.0.0.0/8", iface="eth0")
    assert ev and "zone 'public'" in ev and "port 29500/tcp" in ev


def test_world_open_positive_nft(nft):
    ev = fw.world_open(nft, 22, "10.0.0.0/8", iface="eth0")
    assert ev and "tcp dport 22 accept" in ev


def test_world_open_negative_cidr_restricted(ipt, nft, fwd):
    assert fw.world_open(ipt, 29500, "10.0.0.0/8", iface="eth0") is None
    assert fw.world_open(ipt, (32768, 60999), "10.0.0.0/8", iface="eth0") is None
    assert fw.world_open(nft, 29500, "10.0.0.0/8", iface="eth0") is None
    assert fw.world_open(fwd, (32768, 60999), "10.0.0.0/8", iface="eth0") is None


def test_world_open_not_flagged_for_policy_accept_or_no_firewall():
    assert fw.world_open(state("ipt_reject.iptables-save"), 22, "10.0.0.0/8") is None
    assert fw.world_open({}, 29500, "10.0.0.0/8") is None


def test_world_open_range_found_inside_range():
    st = state("ipt_reject.iptables-save")
    st["iptables"] = st["iptables"].replace(
        "-A INPUT -p tcp -m tcp --dport 29500 -j DROP",
        "-A INPUT -p tcp -m tcp --dport 41234 -j ACCEPT\n-A INPUT -p tcp -m tcp --dport 29500 -j DROP")
    ev = fw.world_open(st, (32768, 60999), "10.0.0.0/8")
    assert ev and ev.startswith("41234/tcp from 203.0.113.7")


# --------------------------------------------------------------------------- misc

def test_no_firewall_at_all():
    empty_nft = {"nftables": [json.loads(read("nft_inet.json"))["nftables"][0]]}  # metainfo only
    for st in ({}, dict(state("ipt_empty.iptables-save"), nft=empty_nft),
               {"iptables": read("nft_inet.iptables-save"), "nft": None}):
        r = ok(st, "10.1.1.1", 29500)
        assert (r.allowed, r.layer, r.verdict, r.evidence) == (True, None, "accept", "no active firewall rules")


def test_ports_blocked_and_sample_ports(ipt):
    pts = fw.sample_ports(ipt, 32768, 60999)
    assert pts[0] == 32768 and pts[-1] == 60999
    assert {39999, 40000, 50000, 50001} <= set(pts)
    blocked = dict(fw.ports_blocked(ipt, "10.20.1.1", pts, iface="eth0"))
    assert 32768 in blocked and 60999 in blocked and 50001 in blocked
    assert 40000 not in blocked and 50000 not in blocked
    assert blocked[32768].verdict == "reject"
    assert fw.ports_blocked(ipt, "10.10.1.1", pts, iface="eth0") == []


def test_nft_evidence_without_text_falls_back_to_json(nft):
    r = ok(dict(nft, nft_text=None), "10.20.1.1", 40000)
    assert r.allowed and r.evidence.startswith("nft inet filter input: [") and "32768" in r.evidence


# --------------------------------------------------------------------------- Rulesets (one parse per distinct rule set)

def test_rulesets_share_equal_rules_despite_timestamps_and_counters(ipt):
    other = copy.deepcopy(ipt)
    other["iptables"] = other["iptables"].replace("23:34:09", "23:59:59").replace(":INPUT DROP [0:0]",
                                                                                  ":INPUT DROP [812:90210]")
    other["nft_text"] = other["nft_text"].replace("counter packets 0 bytes 0", "counter packets 7 bytes 420", 1)
    other["nft"]["nftables"][-1] = dict(other["nft"]["nftables"][-1])  # JSON: compared through the text
    other["errors"] = ["ip6tables-save: rc=1 boom"]  # not a rule
    rs = fw.Rulesets()
    a, b = rs.get(ipt), rs.get(other)
    assert a[0] == b[0] and a[1] is b[1] and len(rs.all) == 1
    assert "counter packets" not in ok(other, "10.20.1.1", 29500, iface="eth1").evidence  # evidence never shows them


def test_rulesets_keep_different_rules_apart(ipt, nft):
    changed = dict(ipt, iptables=ipt["iptables"].replace("--dport 29600 -j ACCEPT", "--dport 29601 -j ACCEPT"))
    no_text = dict(nft, nft_text=None)
    no_text2 = dict(no_text, nft={"nftables": [*nft["nft"]["nftables"][:-1], {"rule": {"family": "inet"}}]})
    rs = fw.Rulesets()
    ids = [rs.get(s)[0] for s in (ipt, changed, nft, no_text, no_text2, {})]
    assert len(set(ids)) == 6
    assert rs.get(copy.deepcopy(changed))[0] == ids[1]
    assert rs.all[ids[1]].evaluate(fw.Packet.of("1.2.3.4", 29600, "eth0")).verdict == "drop"
