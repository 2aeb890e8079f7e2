"""The egress fix for nftables and iptables (issue 34): where ddpfix lets a node's own connects to its peers out,
decided from the node's facts by the same evaluator the audit uses (`ddpfix.firewall`).

A connect from the node's cluster address to a peer's master port / ephemeral range that the node's own firewall
refuses gets one accept per refusing base chain: TCP to the cluster CIDR on those ports only, at the top of the
base chain that refuses it (an nft output-hook chain of the table that holds it, iptables OUTPUT of the backend
that holds it), so ahead of the drop whether the drop is that chain's rule, its policy or a chain it jumps to. The
plan is proven here before anything runs: the evaluator is asked again with the planned rules in place, chain after
chain, until every connect is accepted; when that does not happen, or the refusing chain is one ddpfix does not
change (firewalld's, ufw's, IPv6), the node's firewall is refused before any change, naming the rule, its owner
and the command an operator would run. The role (`ddpfix_fw_rule`, `ddpfix_fw_persist`) carries the plan out: the
live rule, then the owner's file (the include of the nft config, the distribution's iptables save file).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpfix.ansible.collection import module_utils
from ddpfix.firewall import nftables as nft
from ddpfix.firewall.ruleset import Ruleset
from ddpfix.firewall.verdict import Packet, Verdict

#: Base chains one node's plan may change before it is refused (every table/hook/priority that refuses adds one).
MAX_CHAINS = 8
#: The nft table/chain names ddpfix passes on (the node-side modules check the same grammar).
_NAME = re.compile(r"[A-Za-z_.][A-Za-z0-9_.-]{0,63}")  # nft's identifiers: never an option word (`-f`)
#: Distinct port ranges the accept names (iptables multiport takes 15 ports, a range counting two).
MAX_RANGES = 6


@dataclass(frozen=True)
class EgressChange:
    """One accept ddpfix adds: TCP to the cluster CIDR on `ports` ('29500,32768-60999') at the top of `chain`."""

    backend: str  # nftables | iptables | iptables-legacy
    family: str  # nft: ip | inet; iptables: ""
    table: str
    chain: str
    ports: str

    def to_vars(self) -> dict[str, str]:
        return {"backend": self.backend, "family": self.family, "table": self.table, "chain": self.chain,
                "ports": self.ports}


@dataclass
class EgressPlan:
    changes: list[EgressChange] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


def port_spec(master_port: int, ranges: Iterable[tuple[int, int]]) -> str | None:
    """'MASTER,LO-HI,...': the master port and the peers' ephemeral ranges, merged; None when more than MAX_RANGES."""
    spans = sorted({(int(master_port), int(master_port)), *((int(a), int(b)) for a, b in ranges)})
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if len(merged) > MAX_RANGES:
        return None
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in merged)


def _nft_rule(c: EgressChange, cidr: str, ports: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The planned nft rule as `nft -j` lists it (to ask the evaluator about it)."""
    net = ipaddress.ip_network(cidr, strict=False)
    dports = [p if p == q else {"range": [p, q]} for p, q in ports]
    return {"rule": {"family": c.family, "table": c.table, "chain": c.chain, "comment": "ddpfix-cluster", "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                   "right": {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}}},
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                   "right": {"set": dports}}},
        {"accept": None}]}}


def with_changes(state: Mapping[str, Any], changes: Sequence[EgressChange], cidr: str) -> dict[str, Any]:
    """The node's firewall facts as they would read with the planned accepts at the top of their chains."""
    fw = module_utils("ddpfix_fw")
    out = dict(state)
    for c in changes:
        ports = fw.egress_ports(c.ports)
        if c.backend == "nftables":
            out["nft"] = nft.with_rules_first(out.get("nft"), [_nft_rule(c, cidr, ports)])
            out.pop("nft_text", None)  # evidence falls back to the JSON
        else:
            key = "iptables_legacy" if c.backend == "iptables-legacy" else "iptables"
            text, _ = fw.iptables_persisted(str(out.get(key) or ""), cidr,
                                            line=fw.iptables_egress_line(cidr, ports))
            out[key] = text if text is not None else out.get(key)
    return out


def _unfixable(v: Verdict, node: str, cidr: str, ports: str, why: str) -> str:
    """A refusal: the rule and its owner, why not, and what an operator would run."""
    nft_ports = ports.replace(",", ", ")
    ipt_ports = ports.replace("-", ":")
    return (f"{node}: egress to {cidr} refused by {v.evidence} ({v.layer}): {why}; an operator would add, ahead of "
            f"the drop: `nft insert rule <family> <table> <output chain> ip daddr {cidr} tcp dport {{ {nft_ports} }} "
            f"accept` in the file nftables.service loads, or `iptables -I OUTPUT -d {cidr} -p tcp -m multiport "
            f"--dports {ipt_ports} -j ACCEPT` and the distribution's save file (ufw: `ufw allow out to {cidr} proto "
            f"tcp port {ipt_ports.split(',')[0]}` for each port)")


def plan_egress(state: Mapping[str, Any], cidr: str, *, node: str, own: str, peers: Sequence[str],
                master_port: int, ranges: Iterable[tuple[int, int]], iface: str | None,
                backend: str) -> EgressPlan:
    """The accepts that let `node` (cluster address `own`) reach every peer on the master port and the ephemeral
    ranges through its own nftables / iptables (`backend`: the layer the node's plan changes), or the refusal."""
    plan = EgressPlan()
    ports = port_spec(master_port, ranges)
    ranges = list(ranges)
    probe_ports = sorted({int(master_port), *(p for a, b in ranges for p in (a, (a + b) // 2, b))})
    if ports is None:
        plan.refusals.append(f"{node}: egress not changed: the peers' ephemeral ranges are more than {MAX_RANGES} "
                             "distinct ranges (make ip_local_port_range the same on every node)")
        return plan
    packets = [Packet.of(own, p, iface, dst=d, out=True) for d in peers for p in probe_ports]
    fw = module_utils("ddpfix_fw")
    owned = fw.nft_iptables_owned(state.get("nft") or {}, fw.iptables_nft_tables(state.get("iptables")),
                                  fw.iptables_nft_tables(state.get("ip6tables")))
    while True:
        rs = Ruleset(with_changes(state, plan.changes, cidr))
        v = next((v for p in packets if not (v := rs.evaluate(p)).allowed and v.decided), None)
        if v is None:
            return plan
        change, why = _change_for(v, state, owned, ports)
        if change is not None and change.backend != backend:
            why, change = f"it is in {change.backend} while this node's firewall fix goes to {backend}", None
        elif change is not None and change in plan.changes:
            change, why = None, ("still refused with ddpfix's accept at the top of that chain (a later hook or "
                                 "priority, or a rule ddpfix does not model)")
        elif len(plan.changes) >= MAX_CHAINS:
            change, why = None, f"more than {MAX_CHAINS} chains refuse it"
        if change is None:  # nothing of this node's firewall is changed
            return EgressPlan([], [_unfixable(v, node, cidr, ports, why)])
        plan.changes.append(change)


def _change_for(v: Verdict, state: Mapping[str, Any], owned: set[tuple[str, str]],
                ports: str) -> tuple[EgressChange | None, str]:
    """The accept that would let the refused connect `v` out, or (None, why ddpfix does not change that chain)."""
    if v.layer == "nftables":
        where = v.chain  # the evaluator's (family, table, base chain): the first hop when a jump refused it
        if where is None:
            return None, "the evaluator named no refusing nftables chain"
        fam, table, chain = where
        if fam not in ("ip", "inet"):
            return None, f"table {fam} {table} is not an IPv4 table ddpfix changes"
        if not all(_NAME.fullmatch(x) for x in (table, chain)):
            return None, f"the table/chain name {table!r}/{chain!r} is not one ddpfix passes to nft"
        if (fam, table) in owned:
            return None, f"table {fam} {table} is iptables-nft's (its OUTPUT chain is changed through iptables)"
        return EgressChange("nftables", fam, table, chain, ports), ""
    if v.layer in ("iptables", "iptables-legacy"):
        text = str(state.get("iptables_legacy" if v.layer == "iptables-legacy" else "iptables") or "")
        if "ufw-" in text:
            return None, "ufw manages these chains (ddpfix does not edit ufw's rules files)"
        return EgressChange(v.layer, "", "filter", "OUTPUT", ports), ""
    return None, f"ddpfix does not change {v.layer} egress here"


def egress_fix(ctx: Any, name: str, facts: Mapping[str, Any], backend: str) -> tuple[list[dict[str, str]], list[str]]:
    """remediate's call: the egress changes of node `name` (as the role's `ddpfix_firewall_egress`), or refusals."""
    own = ctx.plan[name].address
    if not own or not ctx.cidr:
        return [], []
    peers = [a for n, _ in ctx.audited() if n != name and (a := ctx.plan[n].address)][: ctx.thresholds.max_sources]
    ranges = {tuple(int(x) for x in (f.get("sysctl") or {}).get("ip_local_port_range", [32768, 60999]))
              for _, f in ctx.audited()}
    plan = plan_egress(facts.get("firewall") or {}, ctx.cidr, node=name, own=own, peers=peers,
                       master_port=ctx.cluster.master_port, ranges=sorted(ranges),  # type: ignore[arg-type]
                       iface=(facts.get("cluster") or {}).get("ifname"), backend=backend)
    return [c.to_vars() for c in plan.changes], plan.refusals
