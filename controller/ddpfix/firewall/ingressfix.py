"""The ingress fix for native nftables (issue 38): which input base chains get ddpfix's `ip saddr CIDR accept`,
decided from the node's facts by the same evaluator the audit uses (`ddpfix.firewall.nftables`).

The packets are the audit's (`ddpfix.rules.firewall`): each peer's cluster address to the master port (on the
master) and to the sampled ports of the node's ephemeral range. The chains are the ip/inet base chains on the input
hook that refuse one of them, or could (a rule the evaluator does not model stands before the accept), tables that
firewalld or iptables-nft own left out (their own backends change them). The plan is proven before anything runs:
the evaluator is asked again with ddpfix's accept at the top of those chains, and every packet must be accepted;
when no such chain exists or the proof fails (a prerouting chain refuses, a name ddpfix does not pass to nft, more
than MAX_CHAINS chains) the node's firewall is refused before any change, naming the rule, its owner and the command
an operator would run. The role (`ddpfix_fw_rule`, `ddpfix_fw_persist`) inserts into exactly these chains.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from ddpfix import firewall
from ddpfix.ansible.collection import module_utils
from ddpfix.firewall import nftables as nft
from ddpfix.firewall.egressfix import _NAME, MAX_CHAINS
from ddpfix.firewall.verdict import Packet

Chain = tuple[str, str, str]  # (family, table, chain)


def _accept(chain: Chain, cidr: str) -> dict[str, Any]:
    """ddpfix's ingress accept (`ip saddr CIDR accept`) as `nft -j` lists it."""
    net = ipaddress.ip_network(cidr, strict=False)
    fam, table, name = chain
    return {"rule": {"family": fam, "table": table, "chain": name, "comment": "ddpfix-cluster", "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                   "right": {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}}},
        {"accept": None}]}}


def _unfixable(evidence: str, cidr: str, owned: Sequence[tuple[str, str]], why: str) -> str:
    return (f"firewall not changed: {evidence} is in a table ddpfix does not own as nftables ("
            f"{', '.join(' '.join(k) for k in sorted(owned)) or why}); "
            f"add the accept where its owner keeps it (iptables-nft: iptables -I INPUT -s {cidr} -j ACCEPT and "
            f"its save file; a native table: nft insert rule <family> <table> <chain> ip saddr {cidr} accept in "
            "the file nftables.service loads)")


def plan_ingress(state: Mapping[str, Any], cidr: str, *, own: str | None, sources: Sequence[str],
                 ports: Sequence[int], iface: str | None, evidence: str = "the blocking rule") -> tuple[
                     list[Chain], str]:
    """The input base chains that take ddpfix's accept so that every source reaches every port through the node's
    native nftables, or ([], why not)."""
    fw = module_utils("ddpfix_fw")
    raw = state.get("nft") or {}
    owned = fw.nft_iptables_owned(raw, fw.iptables_nft_tables(state.get("iptables")),
                                  fw.iptables_nft_tables(state.get("ip6tables")))
    skip = owned | set(fw.SKIP_NFT_TABLES)
    rs = firewall.Ruleset(state)
    if rs.nft is None:
        return [], _unfixable(evidence, cidr, sorted(owned), "no nftables rule set was read")
    dst = own if own and rs.uses_dst else None
    packets = [Packet.of(s, p, iface, dst=dst) for s in sources for p in ports]
    chains = nft.refusing_input_chains(rs.nft, packets, skip)
    if not chains and not nft.refusing_input_chains(rs.nft, packets, set(fw.SKIP_NFT_TABLES)):
        return [], (f"firewall not changed: no nftables input base chain refuses the cluster's packets as the audit "
                    f"evaluates them, so an accept there would not lift the block ({evidence}): look at the other "
                    "layers and at host-external firewalls (security groups)")
    if not chains:
        return [], _unfixable(evidence, cidr, sorted(owned), "no native input base chain refuses the cluster")
    bad = [" ".join(c) for c in chains if c[0] not in ("ip", "inet") or not all(_NAME.fullmatch(x) for x in c[1:])]
    if bad:
        return [], (f"firewall not changed: the refusing chain {bad[0]!r} is not one ddpfix passes to nft (family "
                    f"ip/inet, plain names); add `ip saddr {cidr} accept` at its top by hand")
    if len(chains) > MAX_CHAINS:
        return [], (f"firewall not changed: more than {MAX_CHAINS} input base chains refuse the cluster ("
                    f"{', '.join(' '.join(c) for c in chains[:3])}, ...)")
    fixed = nft.Ruleset.of(nft.with_rules_first(raw, [_accept(c, cidr) for c in chains]), None)
    for pkt in packets:
        r = nft.evaluate_without(fixed, pkt, skip)
        if r is not None and r.verdict != "accept":
            return [], (f"firewall not changed: TCP {pkt.src} -> {pkt.dport} is still refused with ddpfix's accept "
                        f"at the top of {', '.join(' '.join(c) for c in chains)}, by {r.evidence} (a prerouting "
                        f"chain, or a rule ddpfix does not model); add `ip saddr {cidr} accept` ahead of it by hand")
    return chains, ""


def ingress_fix(ctx: Any, name: str, facts: Mapping[str, Any], evidence: str) -> tuple[list[dict[str, str]], str]:
    """remediate's call: the chains of node `name` that take ddpfix's accept (as the role's
    `ddpfix_firewall_nft_chains`: {family, table, chain}), or why its nftables is not changed. The packets are the
    audit's: the first peers' cluster addresses to the master port (on the master) and the ephemeral range's samples."""
    state = facts.get("firewall") or {}
    if not ctx.cidr:
        return [], ""
    own = ctx.plan[name].address
    candidates = [a for n, _ in ctx.audited() if (a := ctx.plan[n].address)][: ctx.thresholds.max_sources + 1]
    sources = [a for a in candidates if a != own][: ctx.thresholds.max_sources] or ([own] if own else [])
    lo, hi = (facts.get("sysctl") or {}).get("ip_local_port_range", [32768, 60999])
    ports = firewall.sample_ports(state, int(lo), int(hi), ctx.thresholds.peer_port_samples)
    if name == ctx.cluster.master:
        ports = [ctx.cluster.master_port, *ports]
    chains, why = plan_ingress(state, ctx.cidr, own=own, sources=sources, ports=ports,
                               iface=(facts.get("cluster") or {}).get("ifname"), evidence=evidence)
    return [{"family": f, "table": t, "chain": c} for f, t, c in chains], why
