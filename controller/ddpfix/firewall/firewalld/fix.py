"""The firewalld fix: where the owner keeps it, proven on the model before it is planned (`plan_fix`)."""

from __future__ import annotations

import dataclasses
import ipaddress
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddpfix.firewall.firewalld.evaluate import egress_zone, evaluate, evaluate_egress, host_policies
from ddpfix.firewall.firewalld.model import Firewalld, Zone
from ddpfix.firewall.verdict import (
    Packet,
    iface_match,
)

#: The rich rules ddpfix adds: the cluster network only, nothing else about the packet.
RICH_FROM = 'rule family="ipv4" source address="{cidr}" accept'
RICH_TO = 'rule family="ipv4" destination address="{cidr}" accept'


@dataclass(frozen=True)
class Change:
    """One firewalld change: a source of a zone, or a rich rule of a zone or policy (runtime and permanent)."""

    kind: str  # "zone" | "policy"
    name: str
    source: str = ""
    rich_rule: str = ""
    why: str = ""

    def to_vars(self) -> dict[str, str]:
        return {self.kind: self.name, **({"source": self.source} if self.source else {"rich_rule": self.rich_rule})}

    @property
    def command(self) -> str:
        """What an operator would run to make it (permanent, then a reload)."""
        what = f"--add-source={self.source}" if self.source else f"--add-rich-rule={shlex.quote(self.rich_rule)}"
        return f"firewall-cmd --permanent --{self.kind}={self.name} {what} && firewall-cmd --reload"


@dataclass
class FixPlan:
    changes: list[Change] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


def _with(fw: Firewalld, changes: Iterable[Change]) -> Firewalld:
    """The firewalld state after `changes` (to prove they let the cluster through before planning them)."""
    zones, policies = dict(fw.zones), dict(fw.policies)
    for c in changes:
        if c.kind == "zone":
            name = c.name or "trusted"
            z = zones.get(name) or Zone(name, "ACCEPT" if name == "trusted" else "default")
            zones[name] = dataclasses.replace(
                z, sources=z.sources + ((c.source,) if c.source else ()),
                rich_rules=z.rich_rules + ((c.rich_rule,) if c.rich_rule else ()))
        elif c.name in policies:
            p = policies[c.name]
            policies[c.name] = dataclasses.replace(p, rich_rules=(*p.rich_rules, c.rich_rule))
    return dataclasses.replace(fw, zones=zones, policies=policies)


def _owner(kind: str, name: str) -> str:
    return f"owner: firewalld, /etc/firewalld/{kind.replace('policy', 'policie')}s/{name}.xml"


def _overlaps(a: str, cidr: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool | None:
    try:
        n = ipaddress.ip_network(a, strict=False)
        return n.version == cidr.version and n.overlaps(cidr)
    except (TypeError, ValueError):
        return None  # ipset:NAME, a MAC address


def ingress_zones(fw: Firewalld, cidr: str, iface: str | None) -> tuple[list[tuple[str, str]], str | None]:
    """Where packets from the cluster network land: [(zone, the source that binds it)] for every zone a source of
    which overlaps the cluster network (ZONE_CONFLICT: a network bound to one zone cannot be added to another), and
    the zone the cluster interface is bound to (None: unbound, or bound to the default zone, as NetworkManager binds
    every interface it manages)."""
    net = ipaddress.ip_network(cidr, strict=False)
    bound = [(n, s) for n in sorted(fw.zones) for s in fw.zones[n].sources if _overlaps(s, net)]
    izone = None
    if iface is not None:
        izone = next((n for n in sorted(fw.zones) if any(iface_match(i, iface) for i in fw.zones[n].interfaces)),
                     None)
    if izone is not None and izone == fw.default_zone:
        izone = None  # NetworkManager binds every NIC to the default zone: no choice about the cluster's traffic
    return bound, izone


def plan_fix(fw: Firewalld, cidr: str, *, node: str, iface: str | None, own: str | None, peers: Iterable[str],
             ports: Iterable[int], zone: str | None = None, ingress: bool = True,
             egress: bool = False) -> FixPlan:
    """Where and how firewalld on `node` must change so that the cluster network reaches `ports` (ingress) and the
    node reaches its peers' `ports` (egress), decided from its facts:

    - ingress: a zone the cluster network (or a network containing or inside it) is a source of, or the zone other
      than the default one that the cluster interface is bound to, gets a rich rule accepting the cluster network
      (never a conflicting binding); otherwise the cluster network becomes a source of `zone` (None: the role's
      `ddpfix_firewall_zone`, trusted), as ddpfix always did.
    - egress: each policy from HOST that drops or rejects a connect to a peer gets a rich rule accepting the
      cluster network as destination.

    Each plan is proven on the model (the changes applied, every sampled packet accepted); what they cannot let
    through (a deny rich rule of a lower priority, a direct rule) is refused, naming the zone, policy or rule, its
    owner and the command an operator would run."""
    out = FixPlan()
    peers, ports = [p for p in peers if p], sorted(set(ports))
    if ingress:
        bound, izone = ingress_zones(fw, cidr, iface)
        targets = list(dict.fromkeys(n for n, _ in bound))
        net = ipaddress.ip_network(cidr, strict=False)
        covered = any(ipaddress.ip_network(s, strict=False).supernet_of(net)  # type: ignore[arg-type]
                      for _, s in bound if _overlaps(s, net))
        if not covered and izone is not None:
            targets.append(izone)
        for n in dict.fromkeys(targets):
            if fw.zones[n].target != "ACCEPT":
                why = ("source " + ", ".join(s for z, s in bound if z == n)) if any(z == n for z, _ in bound) \
                    else f"interface {iface}"
                out.changes.append(Change("zone", n, rich_rule=RICH_FROM.format(cidr=cidr), why=why))
        if not covered and izone is None:  # "": the role's ddpfix_firewall_zone (trusted)
            out.changes.append(Change("zone", zone or "", source=cidr, why="no zone holds the cluster network"))
        after = _with(fw, out.changes)
        for src in peers:
            for port in ports:
                pkt = Packet.of(src, port, iface, dst=own)
                v = evaluate(after, pkt)
                if v.verdict != "accept" or v.undecided:
                    cause = "; ".join(v.undecided) or v.evidence
                    z = next((c for c in out.changes), None)
                    fix = Change(z.kind if z else "zone", (z.name if z else zone) or "trusted",
                                 rich_rule=f'rule priority="-32768" family="ipv4" source address="{cidr}" accept')
                    out.refusals.append(
                        f"{node}: firewalld still refuses TCP {src} -> {port} after ddpfix's change ({cause}; "
                        f"{_owner(fix.kind, fix.name)}): ddpfix does not override it; an operator would run: "
                        f"{fix.command}")
                    out.changes = [c for c in out.changes if c.kind != "zone"]
                    break
            if out.refusals:
                break
    if egress and own:
        fixes: list[Change] = []
        for dst in peers:
            for port in ports:
                pkt = Packet.of(own, port, iface, dst=dst)
                v = evaluate_egress(_with(fw, fixes), pkt, iface)
                if v.verdict == "accept" and not v.undecided:
                    continue
                pol = next((p for p in host_policies(fw, egress_zone(fw, pkt.dst, iface))
                            if v.evidence.startswith(f"firewalld policy {p.name!r}")), None)
                if pol is None or v.undecided:
                    cause = "; ".join(v.undecided) or v.evidence
                    rule = f"ipv4 filter OUTPUT -1 -d {cidr} -j ACCEPT"
                    out.refusals.append(
                        f"{node}: egress TCP {own} -> {dst}:{port} refused by {cause} (owner: firewalld, "
                        "/etc/firewalld/direct.xml): ddpfix does not change direct rules; an operator would run: "
                        f"firewall-cmd --permanent --direct --add-rule {rule} && firewall-cmd --reload")
                    return out
                fixes.append(Change("policy", pol.name, rich_rule=RICH_TO.format(cidr=cidr),
                                    why=f"policy {pol.name} ({pol.target}) restricts what the node sends"))
                v2 = evaluate_egress(_with(fw, fixes), pkt, iface)
                if v2.verdict != "accept" or v2.undecided:
                    fix = dataclasses.replace(fixes[-1], rich_rule=(
                        f'rule priority="-32768" family="ipv4" destination address="{cidr}" accept'))
                    out.refusals.append(
                        f"{node}: egress TCP {own} -> {dst}:{port} still refused by {v2.evidence} after ddpfix's "
                        f"change ({_owner('policy', pol.name)}): ddpfix does not override it; an operator would run: "
                        f"{fix.command}")
                    return out
        out.changes += list(dict.fromkeys(fixes))
    return out
