"""Unit tests for roles/ddpfix_firewall/module_utils/ddpfix_fw.py: what ddpfix persists, finds and reverts."""

from __future__ import annotations

import os

from ddpfix import collection
from ddpfix.remediate import firewall_backend

HERE = os.path.dirname(__file__)
fw = collection.module_utils("ddpfix_fw")

CIDR = "192.168.77.0/24"
LINE = f"-A INPUT -s {CIDR} -m comment --comment ddpfix-cluster -j ACCEPT"

RULES_V4 = """# saved by hand
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
COMMIT
*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:f2b-sshd - [0:0]
-A INPUT -p tcp -m tcp --dport 22 -j f2b-sshd
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
"""


def test_iptables_line_goes_to_top_of_filter_input_and_nothing_else_changes() -> None:
    new, why = fw.iptables_persisted(RULES_V4, CIDR)
    assert why == ""
    lines = new.splitlines()
    assert lines.index(LINE) == lines.index(":f2b-sshd - [0:0]") + 1
    assert [ln for ln in lines if ln != LINE] == RULES_V4.splitlines()
    again, why = fw.iptables_persisted(new, CIDR)
    assert again is None and why == ""  # idempotent


def test_iptables_file_without_filter_table_is_not_touched() -> None:
    new, why = fw.iptables_persisted("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n", CIDR)
    assert new is None and "*filter" in why


def test_iptables_tagged_finds_only_ddpfix_rules() -> None:
    save = RULES_V4.replace(":f2b-sshd - [0:0]\n", ":f2b-sshd - [0:0]\n" + LINE + "\n"
                            "-A INPUT -p tcp -m tcp --dport 22 -m comment --comment ddpfix-cluster -j DROP\n"
                            '-A INPUT -s 10.0.0.0/8 -m comment --comment "ddpfix-cluster-not" -j ACCEPT\n')
    assert fw.iptables_tagged(save) == [
        fw.iptables_rule(CIDR),
        ["-p", "tcp", "-m", "tcp", "--dport", "22", "-m", "comment", "--comment", "ddpfix-cluster", "-j", "DROP"],
    ]
    assert fw.iptables_tagged("*nat\nCOMMIT\n") == []


def test_iptables_blocks_tells_which_variant_holds_the_blocking_rules() -> None:
    assert fw.iptables_blocks(RULES_V4)  # policy DROP
    reject = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 1:2 -j REJECT --reject-with tcp-reset\nCOMMIT\n"
    assert fw.iptables_blocks(reject)
    assert not fw.iptables_blocks("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n-A FORWARD -j DROP\nCOMMIT\n")
    assert not fw.iptables_blocks("")


def test_iptables_variant_binaries() -> None:
    assert fw.iptables_bins("legacy") == ("iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore")
    assert fw.iptables_bins("nft")[2] == "iptables-nft-restore"
    assert fw.iptables_bins("auto") == ("iptables", "iptables-save", "iptables-restore")


def _chain(fam, table, name, hook=None, policy=None):
    c = {"family": fam, "table": table, "name": name}
    if hook:
        c.update(hook=hook, type="filter", prio=0, policy=policy or "accept")
    return {"chain": c}


def _rule(fam, table, chain, handle, expr, comment=None):
    r = {"family": fam, "table": table, "chain": chain, "handle": handle, "expr": expr}
    if comment:
        r["comment"] = comment
    return {"rule": r}


RULESET = {"nftables": [
    _chain("inet", "filter", "input", "input", "drop"),
    _chain("inet", "hostfw", "input", "input", "accept"),
    _rule("inet", "hostfw", "input", 4, [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                                                   "right": 23}}, {"reject": None}]),
    _chain("inet", "kube-proxy", "filter-input", "input", "accept"),
    _rule("inet", "kube-proxy", "filter-input", 5, [{"jump": {"target": "services"}}]),
    _chain("inet", "docker-like", "input", "input", "accept"),
    _chain("ip", "filter", "INPUT", "input", "drop"),  # iptables-nft
    _chain("inet", "firewalld", "filter_INPUT", "input", "drop"),
    _chain("ip6", "filter6", "input", "input", "drop"),
    _rule("inet", "filter", "input", 9, [{"accept": None}], "ddpfix-cluster"),
    _rule("ip", "filter", "DOCKER-USER", 10, [{"xt": {"type": "match", "name": "physdev"}}, {"return": None}]),
]}


def test_nft_blocking_chains_are_native_input_chains_that_drop() -> None:
    assert fw.nft_blocking_input_chains(RULESET) == [("inet", "filter", "input"), ("inet", "hostfw", "input")]


def test_nft_tagged_rules_by_comment() -> None:
    assert fw.nft_tagged(RULESET) == [("inet", "filter", "input", 9)]


def test_nft_snippet_holds_only_ddpfix_rule() -> None:
    text = fw.nft_snippet([("inet", "filter", "input")], CIDR)
    rules = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert rules == [f'insert rule inet filter input ip saddr {CIDR} accept comment "ddpfix-cluster"']


def test_include_block_appended_once_and_replaced_in_place() -> None:
    main = "#!/usr/sbin/nft -f\nflush ruleset\ntable inet filter {\n}"
    one = fw.with_include(main, "/etc/nftables.d/ddpfix.nft")
    assert one.startswith(main + "\n") and one.endswith(
        '# BEGIN ddpfix managed block\ninclude "/etc/nftables.d/ddpfix.nft"\n# END ddpfix managed block\n')
    assert fw.with_include(one, "/etc/nftables.d/ddpfix.nft") == one
    moved = fw.with_include(one, "/etc/nftables/ddpfix.nft")
    assert moved.count("include") == 1 and 'include "/etc/nftables/ddpfix.nft"' in moved


def test_backend_follows_the_iptables_variant_that_blocks() -> None:
    assert firewall_backend({}, "auto", {"iptables-legacy"}) == "iptables-legacy"
    assert firewall_backend({}, "iptables", {"iptables-legacy"}) == "iptables-legacy"
    assert firewall_backend({}, "iptables", {"iptables", "iptables-legacy"}) == "iptables"
    assert firewall_backend({}, "auto", {"nftables"}) == "nftables"
