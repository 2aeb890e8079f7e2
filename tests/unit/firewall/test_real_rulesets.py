"""Issue 34: the evaluator's and the fixer's decisions on real rulesets from public sources (tests/fixtures/rulesets,
each file citing its source), as ddpfix's collector read them once loaded the way their owner loads them at boot
(record.sh, in a network namespace)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from unit_helpers import ROOT

from ddpfix import firewall as evaluator
from ddpfix.ansible import collection
from ddpfix.firewall.ingressfix import plan_ingress
from ddpfix.remediate import firewall_backend
from ddpfix.rules.firewall import active_firewalls, ufw_managed

RULESETS = ROOT / "tests" / "fixtures" / "rulesets"
fw = collection.module_utils("ddpfix_fw")
PEER, MASTER_PORT = "192.168.83.12", 29500
CIDR = "192.168.83.0/24"


def planned(st: dict[str, Any]) -> tuple[list[tuple[str, str, str]], str]:
    """The controller's choice of chains (issue 38): the audit's packets, from two peers, evaluated."""
    ports = [MASTER_PORT, *evaluator.sample_ports(st, 32768, 60999, 5)]
    return plan_ingress(st, CIDR, own="192.168.83.11", sources=[PEER, "192.168.83.13"], ports=ports, iface="eth0")


def recorded(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((RULESETS / "recorded" / f"{name}.json").read_text())
    return out


def test_every_ruleset_cites_its_source_and_is_recorded() -> None:
    files = [p for p in RULESETS.iterdir() if p.is_file() and p.name != "record.sh" and p.suffix != ".ipset"]
    assert len(files) >= 2
    for p in files:
        head = p.read_text()[:1500]
        assert "Source" in head and "Adapted" in head, p.name
        if p.suffix in (".rules", ".nft"):
            assert (RULESETS / "recorded" / f"{p.name}.json").is_file(), p.name


def test_legacy_kubeadm_node_blocks_in_the_legacy_tables_and_is_fixed_there() -> None:
    st = recorded("kubeadm-iptables-services.legacy.rules")
    v = evaluator.evaluate(st, PEER, MASTER_PORT, iface="eth0")
    assert not v.allowed and v.decided and v.layer == "iptables-legacy"
    assert firewall_backend(st, "auto", {v.layer}) == "iptables-legacy"
    assert firewall_backend(st, "auto", set()) == "iptables-legacy"  # a failed probe alone
    assert active_firewalls(st) == ["iptables"]
    # ddpfix's line at the top of INPUT of the save file: kube-proxy's, flannel's and Docker's chains untouched
    text = (RULESETS / "kubeadm-iptables-services.legacy.rules").read_text()
    new, why = fw.iptables_persisted(text, "192.168.83.0/24")
    assert why == "" and new is not None
    added = [ln for ln in new.splitlines() if ln not in text.splitlines()]
    assert added == ["-A INPUT -s 192.168.83.0/24 -m comment --comment ddpfix-cluster -j ACCEPT"]
    fixed = dict(st, iptables_legacy=fw.iptables_persisted(st["iptables_legacy"], "192.168.83.0/24")[0])
    assert evaluator.evaluate(fixed, PEER, MASTER_PORT, iface="eth0").allowed
    assert not evaluator.evaluate(fixed, "198.51.100.7", MASTER_PORT, iface="eth0").allowed


def test_native_table_named_like_iptables_nft_is_fixed_in_its_own_chains() -> None:
    """`table ip filter` with INPUT/FORWARD/OUTPUT written by hand: iptables-save says the table is incompatible,
    so it is nftables.service's; the fix goes into its INPUT chain."""
    st = recorded("gentoo-ip-filter-uppercase.nft")
    assert "incompatible" in st["iptables"]
    v = evaluator.evaluate(st, PEER, MASTER_PORT, iface="eth0")
    assert not v.allowed and v.layer == "nftables" and "INPUT policy drop" in v.evidence
    assert firewall_backend(st, "auto", {v.layer}) == "nftables"
    owned = fw.nft_iptables_owned(st["nft"], fw.iptables_nft_tables(st["iptables"]),
                                  fw.iptables_nft_tables(st["ip6tables"]))
    assert owned == set()
    assert fw.nft_blocking_input_chains(st["nft"], owned) == [("ip", "filter", "INPUT")]
    assert planned(st) == ([("ip", "filter", "INPUT")], "")  # the controller's choice, by the evaluator
    # what the persist module sees (the config alone, loaded in an empty ruleset): the same chain
    assert fw.nft_blocking_input_chains(st["nft"]) == [("ip", "filter", "INPUT")]


def test_iptables_nft_tables_are_left_to_the_iptables_backend() -> None:
    """iptables-nft's table (iptables-save prints it as its own; its rules hold `xt` matches): never an nft fix."""
    fx = ROOT / "tests" / "unit" / "fixtures" / "firewall"
    ruleset = json.loads((fx / "ipt_cluster.nft.json").read_text())
    ipt = (fx / "ipt_cluster.iptables-save").read_text()
    assert fw.iptables_nft_tables(ipt) == {"filter"}
    owned = fw.nft_iptables_owned(ruleset, fw.iptables_nft_tables(ipt), None)
    assert ("ip", "filter") in owned and fw.nft_blocking_input_chains(ruleset, owned) == []
    assert fw.nft_iptables_owned(ruleset, None, None) >= {("ip", "filter")}  # the xt matches alone tell


@pytest.mark.parametrize("text, tables", [
    ("# Table `filter' is incompatible, use 'nft' tool.\n", set()),
    ("# Table `filter' contains incompatible base-chains, use 'nft' tool to list them.\n*filter\n:INPUT ACCEPT [0:0]\n"
     "COMMIT\n", set()),
    ("*nat\nCOMMIT\n*filter\nCOMMIT\n", {"nat", "filter"}),
    ("", set()),
])
def test_iptables_nft_tables(text: str, tables: set[str]) -> None:
    assert fw.iptables_nft_tables(text) == tables


def test_rate_limit_meter_ahead_of_an_accept_may_drop_never_a_certain_drop() -> None:
    """Issue 34 item 4: `ct state new add @rate_limit { ip saddr limit rate over 2000/minute } drop` drops only
    sources over the rate: ahead of the DDP ports' accept it makes them "may drop" (undecided), never refused."""
    st = recorded("michns-rate-limits.nft")
    meter = "nft inet filter input: ct state new add @rate_limit { ip saddr limit rate over 2000/minute } drop"
    for port in (MASTER_PORT, 40000):
        v = evaluator.evaluate(st, PEER, port, iface="eth0")
        assert v.allowed and meter in v.undecided, (port, v)
    v = evaluator.evaluate(st, PEER, 22, iface="eth0")  # accepted before any meter: decided
    assert v.allowed and v.decided
    v = evaluator.evaluate(st, PEER, 443, iface="eth0")  # a meter's accept, then the policy: may be accepted
    assert not v.allowed and any("meter sni_limit" in u for u in v.undecided)
    v = evaluator.evaluate(st, PEER, 8080, iface="eth0")  # refused by a plain drop whatever the meters do
    assert not v.allowed and v.decided and "{ 23, 80, 8080 } drop" in v.evidence


@pytest.mark.parametrize("stmt", [
    {"set": {"op": "add", "elem": {"payload": {"protocol": "ip", "field": "saddr"}}, "set": "@rl",
             "stmt": [{"limit": {"rate": 2000, "per": "minute", "inv": True}}]}},
    {"meter": {"name": "m", "key": {"payload": {"protocol": "ip", "field": "saddr"}},
               "stmt": {"limit": {"rate": 10, "per": "second"}}}},
    {"quota": {"val": 10, "val_unit": "mbytes", "inv": True}},
    {"ct count": {"val": 50}},
])
def test_conditional_statements_are_undecided(stmt: dict[str, Any]) -> None:
    ruleset = {"nftables": [
        {"chain": {"family": "inet", "table": "t", "name": "in", "type": "filter", "hook": "input", "prio": 0,
                   "policy": "accept"}},
        {"rule": {"family": "inet", "table": "t", "chain": "in", "handle": 2, "expr": [stmt, {"drop": None}]}}]}
    v = evaluator.evaluate({"nft": ruleset}, PEER, MASTER_PORT)
    assert v.allowed and len(v.undecided) == 1
    plain = {"set": {"op": "add", "elem": {"payload": {"protocol": "ip", "field": "saddr"}}, "set": "@seen"}}
    ruleset["nftables"][1]["rule"]["expr"] = [plain, {"drop": None}]  # a plain set add always goes on: a drop
    assert not evaluator.evaluate({"nft": ruleset}, PEER, MASTER_PORT).allowed


def test_iptables_hashlimit_limit_recent_may_drop() -> None:
    """The iptables equivalents (-m hashlimit / limit / recent), in the legacy tables: undecided, not refused."""
    st = recorded("syn-flood-hashlimit.legacy.rules")
    v = evaluator.evaluate(st, PEER, MASTER_PORT, iface="eth0")
    assert v.layer == "iptables-legacy" and any("--hashlimit-upto" in u for u in v.undecided), v
    v = evaluator.evaluate(st, PEER, 22, iface="eth0")
    assert {"--hashlimit-upto", "--limit 30/min"} <= {k for k in ("--hashlimit-upto", "--limit 30/min")
                                                     if any(k in u for u in v.undecided)}, v
    v = evaluator.evaluate(st, PEER, 443, iface="eth0")  # no accept for it: refused whatever the meters do
    assert not v.allowed and v.decided


#: Every recorded ruleset: what the evaluator says of the master port from a peer (accepted / refused, "may" when
#: a rule it cannot decide could turn it), the layer, and where the fix goes (the backend, and for nftables the
#: chains that get ddpfix's rule).
EXPECTED = {
    "alemonmk-nixos-egress.nft": ("refused", "nftables", "nftables", [("inet", "global", "input")]),
    "anydot-fail2ban-ipset.legacy.rules": ("accepted", "iptables-legacy", None, None),
    "docker-kube-linuxkit.nft.rules": ("may", "iptables", None, None),  # kube-proxy's mark drop only
    "elmasy-stateful-webserver.nft": ("refused", "nftables", "nftables", [("inet", "filter", "input")]),
    "gentoo-ip-filter-uppercase.nft": ("refused", "nftables", "nftables", [("ip", "filter", "INPUT")]),
    "honeynet-ssh-recent.nft.rules": ("refused", "iptables", "iptables", None),
    "kubeadm-iptables-services.legacy.rules": ("refused", "iptables-legacy", "iptables-legacy", None),
    "michns-rate-limits.nft": ("may", "nftables", None, None),
    "syn-flood-hashlimit.legacy.rules": ("may", "iptables-legacy", None, None),
    "wiki-priorities.nft": ("refused", "nftables", "nftables", [("inet", "filter", "input")]),
}
#: Where the node-side fallback's text check (a chain with any drop/reject rule) picks more than the evaluator: the
#: `services` chain drops only http, never the cluster's ports, so the controller leaves it alone.
TEXT_CHAINS = {"wiki-priorities.nft": [("inet", "filter", "services"), ("inet", "filter", "input")]}


#: The ufw hosts (ufw's own rules file, or an operator's ufw commands; loaded by ufw itself, record.sh): the master
#: port from a peer, and whether ufw's rules already allow everything from the cluster network. The fix is ufw's
#: (`ufw allow from CIDR`, through community.general.ufw: ufw writes user.rules and reloads its chains), never an
#: iptables line ufw would drop at its next reload.
UFW_EXPECTED = {
    "chaifeng-ufw-docker.ufw.sh": "refused",  # OpenSSH and another private /28 only; Docker's chains around it
    "dacha-private-nets.ufw.rules": "accepted",  # everything from 192.168.0.0/16: nothing to fix
    "homelab-limit-ssh.ufw.rules": "refused",  # `ufw limit` on SSH, REJECTs of single sources, web and mail ports
    "vps-openssh.ufw.rules": "refused",
}
#: The firewalld shapes (tests/fixtures/rulesets/firewalld, judged in test_real_rulesets_firewalld_lab.py)
FIREWALLD_SHAPES = ("internal-bound.sh", "egress-host-any.sh", "direct-output-drop.sh")


def test_the_corpus_is_the_expected_one() -> None:
    assert sorted(p.name[:-5] for p in (RULESETS / "recorded").glob("*.json")) == sorted(EXPECTED | UFW_EXPECTED)
    assert all((RULESETS / "firewalld" / name).is_file() for name in FIREWALLD_SHAPES)
    assert len(EXPECTED) + len(UFW_EXPECTED) + len(FIREWALLD_SHAPES) >= 15  # issue 34 item 3


@pytest.mark.parametrize("name", sorted(UFW_EXPECTED))
def test_ufw_ruleset_verdict_and_fix(name: str) -> None:
    st = recorded(name)
    assert not st["unread"] and not st["errors"]
    assert ufw_managed(st) and ufw_managed({"iptables_legacy": st["iptables"]})
    # the plan: through ufw wherever its chains are in the blocking tables (an operator's ddp_firewall=iptables too)
    for configured in ("auto", "iptables"):
        assert firewall_backend(st, configured, {"iptables"}) == "ufw"
    assert firewall_backend(st, "auto", set()) == "ufw"  # a failed probe alone
    # ufw on the nft variant, the block in the legacy tables (kube-proxy on iptables-legacy): not ufw's to fix
    assert firewall_backend(dict(st, iptables_legacy="*filter\n:INPUT DROP [0:0]\nCOMMIT\n"), "auto",
                            {"iptables-legacy"}) == "iptables-legacy"
    v = evaluator.evaluate(st, PEER, MASTER_PORT, iface="eth0")
    assert ("accepted" if v.allowed else "refused", v.layer, v.decided) == (UFW_EXPECTED[name], "iptables", True), v
    assert not evaluator.evaluate(st, "198.51.100.7", MASTER_PORT, iface="eth0").allowed
    cidr = "192.168.83.0/24"
    if name.endswith(".ufw.rules"):  # what the role reads (ufw's rules file): already allowed, or not
        user_rules = (RULESETS / name).read_text()
        assert fw.ufw_allows(user_rules, cidr) == (UFW_EXPECTED[name] == "accepted")
        added = user_rules.replace("### END RULES ###", f"### tuple ### allow any any 0.0.0.0/0 any {cidr} in "
                                   f"comment=6464706669780a\n-A ufw-user-input -s {cidr} -j ACCEPT\n\n"
                                   "### END RULES ###")
        assert fw.ufw_allows(added, cidr) and not fw.ufw_allows(added, "10.9.0.0/16")
    # `ufw allow from CIDR` appends to ufw-user-input (ufw reloads its chains): the peers accepted, nobody else
    live = st["iptables"].replace("COMMIT", f"-A ufw-user-input -s {cidr} -j ACCEPT\nCOMMIT", 1)
    fixed = dict(st, iptables=live)
    assert evaluator.evaluate(fixed, PEER, MASTER_PORT, iface="eth0").allowed
    assert evaluator.evaluate(fixed, PEER, 40000, iface="eth0").allowed
    assert not evaluator.evaluate(fixed, "198.51.100.7", MASTER_PORT, iface="eth0").allowed


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_ruleset_verdict_and_fix(name: str) -> None:
    verdict, layer, backend, chains = EXPECTED[name]
    st = recorded(name)
    assert not ufw_managed(st)  # Docker's, kube-proxy's, fail2ban's chains are no ufw
    assert not st["unread"] and not st["errors"]
    v = evaluator.evaluate(st, PEER, MASTER_PORT, iface="eth0")
    got = "may" if v.undecided else "accepted" if v.allowed else "refused"
    assert (got, v.layer) == (verdict, layer), v
    if backend is None:  # nothing certainly refuses the master port: nothing to fix
        return
    assert firewall_backend(st, "auto", {layer}) == backend
    owned = fw.nft_iptables_owned(st["nft"], fw.iptables_nft_tables(st["iptables"]),
                                  fw.iptables_nft_tables(st["ip6tables"]))
    assert planned(st) == (chains, "") if chains else not planned(st)[0]
    # the node-side fallback (the role without the controller) picks by text: a chain with any drop rule
    assert fw.nft_blocking_input_chains(st["nft"], owned) == TEXT_CHAINS.get(name, chains or [])
    if backend.startswith("iptables"):  # the save file gets ddpfix's line and nothing else
        text = (RULESETS / name).read_text()
        new, why = fw.iptables_persisted(text, "192.168.83.0/24")
        assert why == "" and new is not None
        assert [ln for ln in new.splitlines() if ln not in text.splitlines()] == [
            "-A INPUT -s 192.168.83.0/24 -m comment --comment ddpfix-cluster -j ACCEPT"]
        live = fw.iptables_persisted(st["iptables_legacy" if layer == "iptables-legacy" else "iptables"],
                                     "192.168.83.0/24")[0]
        fixed = dict(st, **{"iptables_legacy" if layer == "iptables-legacy" else "iptables": live})
        assert evaluator.evaluate(fixed, PEER, MASTER_PORT, iface="eth0").allowed
        assert not evaluator.evaluate(fixed, "198.51.100.7", MASTER_PORT, iface="eth0").allowed


def test_an_nft_block_ddpfix_cannot_fix_is_refused_naming_owner_and_command() -> None:
    """Issue 34 item 5: the nftables backend picked, but no native input base chain that refuses the cluster would
    take ddpfix's rule (here iptables-nft claims the table): refused before anything changes, not "applied, not
    effective"."""
    st = recorded("gentoo-ip-filter-uppercase.nft")
    assert planned(st) == ([("ip", "filter", "INPUT")], "")  # its own INPUT chain takes the rule
    claimed = dict(st, iptables="*filter\n:INPUT DROP [0:0]\nCOMMIT\n")  # iptables-nft-save prints the table
    chains, why = planned(claimed)
    assert chains == []
    assert why.startswith("firewall not changed: the blocking rule is in a table ddpfix does not own as nftables")
    assert "ip filter" in why and "iptables -I INPUT -s 192.168.83.0/24 -j ACCEPT" in why


def test_a_chain_that_refuses_only_other_ports_takes_no_rule_and_a_prerouting_drop_is_refused() -> None:
    """Issue 38: the chains are the evaluator's, proven with ddpfix's accept in place. A chain whose drops never
    match the cluster's packets is left alone; a refusal ddpfix's input accept cannot get ahead of (a prerouting
    chain) refuses the node's firewall before anything changes."""
    st = recorded("wiki-priorities.nft")
    assert planned(st) == ([("inet", "filter", "input")], "")
    pre = {"nftables": [*st["nft"]["nftables"],
                        {"table": {"family": "ip", "name": "raw"}},
                        {"chain": {"family": "ip", "table": "raw", "name": "pre", "type": "filter",
                                   "hook": "prerouting", "prio": -300, "policy": "drop"}}]}
    chains, why = planned(dict(st, nft=pre, nft_text=None))
    assert chains == [] and "still refused with ddpfix's accept at the top of inet filter input" in why
    assert "nft ip raw pre policy drop" in why
    nothing = {"nftables": [i for i in st["nft"]["nftables"] if "rule" not in i and "chain" not in i]}
    chains, why = planned(dict(st, nft=nothing, nft_text=None))  # the block is elsewhere: nothing to insert into
    assert chains == [] and "no nftables input base chain refuses the cluster's packets" in why
