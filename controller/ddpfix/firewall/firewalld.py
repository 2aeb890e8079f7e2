"""The firewalld zone model: pick the zone(s) firewalld would use for the packet, then walk its rich rules, ports,
services, protocols and target like firewalld's generated rules do."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpfix.firewall.verdict import (
    Action,
    LayerResult,
    Packet,
    iface_match,
    in_net,
    in_ports,
    tri_and,
)

Pairs = tuple[tuple[str, str], ...]


def _strs(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else ()


def _pairs(v: Any) -> Pairs:
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple((str(x[0]), str(x[1])) for x in v if isinstance(x, (list, tuple)) and len(x) == 2)


@dataclass(frozen=True)
class Zone:
    name: str
    target: str = "default"  # "default", "ACCEPT", "DROP", "%%REJECT%%"
    interfaces: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    ports: Pairs = ()
    protocols: tuple[str, ...] = ()
    source_ports: Pairs = ()
    rich_rules: tuple[str, ...] = ()
    ingress_priority: int = 0

    @classmethod
    def of(cls, name: str, d: Mapping[str, Any]) -> Zone:
        try:
            prio = int(d.get("ingress_priority") or 0)
        except (TypeError, ValueError):
            prio = 0
        return cls(name, str(d.get("target") or "default"), _strs(d.get("interfaces")), _strs(d.get("sources")),
                   _strs(d.get("services")), _pairs(d.get("ports")), _strs(d.get("protocols")),
                   _pairs(d.get("source_ports")), _strs(d.get("rich_rules")), prio)


@dataclass(frozen=True)
class Service:
    ports: Pairs = ()
    protocols: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    """A firewalld policy (firewalld >= 0.9): traffic from its ingress zones to its egress zones (`HOST`: the node
    itself, `ANY`: every zone). Target CONTINUE passes the packet on to the next policy."""

    name: str
    target: str = "CONTINUE"  # CONTINUE, ACCEPT, DROP, REJECT
    priority: int = -1
    ingress_zones: tuple[str, ...] = ()
    egress_zones: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    ports: Pairs = ()
    protocols: tuple[str, ...] = ()
    rich_rules: tuple[str, ...] = ()

    @classmethod
    def of(cls, name: str, d: Mapping[str, Any]) -> Policy:
        try:
            prio = int(str(d.get("priority") if d.get("priority") is not None else -1))
        except (TypeError, ValueError):
            prio = -1
        return cls(name, str(d.get("target") or "CONTINUE"), prio, _strs(d.get("ingress_zones")),
                   _strs(d.get("egress_zones")), _strs(d.get("services")), _pairs(d.get("ports")),
                   _strs(d.get("protocols")), _strs(d.get("rich_rules")))

    def as_zone(self) -> Zone:
        """The policy's rules as a zone's (same elements, same order); CONTINUE is no verdict."""
        target = "default" if self.target == "CONTINUE" else self.target
        return Zone(self.name, target, services=self.services, ports=self.ports,
                    protocols=self.protocols, rich_rules=self.rich_rules)


@dataclass(frozen=True)
class DirectRule:
    """A firewalld direct rule (`firewall-cmd --direct --get-all-rules`): iptables arguments in a chain."""

    ipv: str
    table: str
    chain: str
    priority: int
    args: tuple[str, ...]

    @classmethod
    def of(cls, v: Any) -> DirectRule | None:
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError:
                return None
            v = [*v[:4], v[4:]] if len(v) >= 4 else v
        if not isinstance(v, (list, tuple)) or len(v) != 5:
            return None
        try:
            prio = int(v[3])
        except (TypeError, ValueError):
            return None
        args = tuple(str(a) for a in v[4]) if isinstance(v[4], (list, tuple)) else tuple(shlex.split(str(v[4])))
        return cls(str(v[0]), str(v[1]), str(v[2]), prio, args)

    @property
    def text(self) -> str:
        return f"{self.ipv} {self.table} {self.chain} {self.priority} {shlex.join(self.args)}"


@dataclass(frozen=True)
class Firewalld:
    """The ``firewalld`` part of the node's firewall facts."""

    running: bool = True
    version: str | None = None
    default_zone: str | None = None
    allow_zone_drifting: bool = False
    zones: dict[str, Zone] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    policies: dict[str, Policy] = field(default_factory=dict)
    direct_rules: tuple[DirectRule, ...] = ()

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Firewalld:
        zones: Mapping[Any, Any] = d["zones"] if isinstance(d.get("zones"), Mapping) else {}
        services: Mapping[Any, Any] = d["services"] if isinstance(d.get("services"), Mapping) else {}
        policies: Mapping[Any, Any] = d["policies"] if isinstance(d.get("policies"), Mapping) else {}
        direct = d["direct_rules"] if isinstance(d.get("direct_rules"), list) else []
        return cls(bool(d.get("running", True)), None if d.get("version") is None else str(d.get("version")),
                   None if d.get("default_zone") is None else str(d.get("default_zone")),
                   bool(d.get("allow_zone_drifting")),
                   {str(n): Zone.of(str(n), z) for n, z in zones.items() if isinstance(z, Mapping)},
                   {str(n): Service(_pairs(s.get("ports")), _strs(s.get("protocols")), _strs(s.get("includes")))
                    for n, s in services.items() if isinstance(s, Mapping)},
                   {str(n): Policy.of(str(n), x) for n, x in policies.items() if isinstance(x, Mapping)},
                   tuple(r for r in (DirectRule.of(x) for x in direct) if r is not None))

    @property
    def active(self) -> bool:
        return self.running and bool(self.zones)


@dataclass
class Element:
    """One element of a rich rule (source, destination, port, protocol, service, ...) and its attributes."""

    kind: str
    negated: bool = False
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class RichRule:
    raw: str
    family: str | None = None
    priority: int = 0
    elements: list[Element] = field(default_factory=list)
    action: str | None = None
    limit: bool = False  # a limited action decides only sometimes


def parse_rich(rule: str) -> RichRule | None:
    """'rule family="ipv4" source NOT address="…" port port="…" protocol="tcp" accept' -> RichRule;
    None if the string cannot be tokenised."""
    try:
        toks = shlex.split(rule)
    except ValueError:
        return None
    r = RichRule(rule)
    cur: Element | None = None
    last: str | None = None
    for t in toks:
        k, eq, v = t.partition("=")
        k = k.lower()
        if eq:
            if cur is not None:
                cur.attrs[k] = v
            elif k == "family":
                r.family = v
            elif k == "priority":
                try:
                    r.priority = int(v)
                except ValueError:
                    return None
        elif k == "rule":
            cur = None
        elif k == "not":
            if cur is not None:
                cur.negated = True
        elif k == "limit":
            r.limit = r.limit or last == "action"
            cur = Element("limit")
        elif k in ("accept", "reject", "drop", "mark"):
            r.action, cur, last = k, Element("action"), "action"
        else:
            cur, last = Element(k), k
            if k not in ("log", "audit", "nflog"):
                r.elements.append(cur)
    return r


def service_ports(fw: Firewalld, name: str,
                  seen: set[str] | None = None) -> tuple[list[tuple[str, str]], list[str]] | None:
    """-> (ports [(p, proto)], protocols) of a service incl. its includes, or None if its definition is unknown."""
    seen = seen or set()
    svc = fw.services.get(name)
    if svc is None:
        return None
    if name in seen:
        return [], []
    seen.add(name)
    ports, protos = list(svc.ports), list(svc.protocols)
    for inc in svc.includes:
        sub = service_ports(fw, inc, seen)
        if sub:
            ports += sub[0]
            protos += sub[1]
    return ports, protos


def _rich_match(fw: Firewalld, r: RichRule, pkt: Packet) -> bool | None:
    if r.family and r.family != f"ipv{pkt.family}":
        return False
    res: list[bool | None] = []
    for e in r.elements:
        if e.kind in ("source", "destination"):
            if "address" not in e.attrs:
                res.append(None)  # mac= / ipset=
                continue
            if e.kind == "destination" and pkt.dst is None:
                res.append(None)
                continue
            m = in_net(pkt.src if e.kind == "source" else pkt.dst, e.attrs["address"])
            res.append(None if m is None else m != e.negated)
        elif e.kind == "port":
            res.append(e.attrs.get("protocol") == pkt.proto and in_ports(pkt.dport, e.attrs.get("port"), "-"))
        elif e.kind == "protocol":
            res.append(e.attrs.get("value") == pkt.proto)
        elif e.kind == "service":
            sp = service_ports(fw, e.attrs.get("name") or "")
            res.append(None if sp is None else
                       any(q == pkt.proto and in_ports(pkt.dport, p, "-") for p, q in sp[0]) or pkt.proto in sp[1])
        elif e.kind in ("icmp-block", "icmp-type"):
            res.append(False)
        else:  # source-port, forward-port, masquerade, tcp-mss-clamp ...
            res.append(None)
    return tri_and(res)


def _version_lt(v: str | None, ref: tuple[int, int]) -> bool:
    try:
        return tuple(int(x) for x in str(v).split(".")[:2]) < ref
    except ValueError:
        return False


def evaluate(fw: Firewalld, pkt: Packet) -> LayerResult:
    """Zone model: select zone(s) like firewalld, walk rich rules / ports / services / target."""
    zones, notes = fw.zones, []
    if pkt.iface == "lo":
        return LayerResult("firewalld", "accept", True, "firewalld accepts all traffic on loopback (iifname lo)")
    chosen: list[tuple[str | None, str]] = []
    maybe_zones: list[tuple[str, str]] = []  # source zones ahead of the chosen one whose source is not known (ipset:)
    for name in sorted(zones, key=lambda n: (zones[n].ingress_priority, n)):
        for s in zones[name].sources:
            m = in_net(pkt.src, s)
            if m is None and not chosen:
                maybe_zones.append((name, s))
            elif m is None:
                notes.append(f"zone {name!r} source {s} not evaluated (after the chosen zone)")
            elif m and not chosen:
                chosen.append((name, f"source {s}"))
    izone: tuple[str | None, str] | None = None
    if pkt.iface is not None:
        for name in sorted(zones):
            if any(iface_match(i, pkt.iface) for i in zones[name].interfaces):
                izone = (name, f"interface {pkt.iface}")
                break
    dz = fw.default_zone
    if izone is None:
        izone = (dz, "default zone; interface {}".format(pkt.iface if pkt.iface else "unknown"))
    elif izone[0] == dz:
        izone = (dz, "default zone; " + izone[1])
    drifting = fw.allow_zone_drifting and _version_lt(fw.version, (1, 0))
    if not chosen or drifting:
        chosen.append(izone)
    maybe: list[tuple[Action, str]] = []  # rich rules met that the evaluator cannot decide: (action, rule)
    for i, (zname, why) in enumerate(chosen):
        z = zones.get(zname) if zname is not None else None
        if z is None:
            notes.append(f"zone {zname!r} not collected")
            continue
        verdict, explicit, ev = _eval_zone(fw, z, why, pkt, notes, maybe)
        if verdict is None and i + 1 < len(chosen) and z.target == "default":
            notes.append(f"AllowZoneDrifting: {ev}")
            continue
        return _settled(fw, pkt, verdict or "reject", explicit, ev, notes, maybe, maybe_zones)
    return _settled(fw, pkt, "reject", False, "firewalld: no zone matched", notes, maybe, maybe_zones)


def _settled(fw: Firewalld, pkt: Packet, verdict: Action, explicit: bool, ev: str, notes: list[str],
             maybe: list[tuple[Action, str]], maybe_zones: list[tuple[str, str]]) -> LayerResult:
    """The layer's result: a rich rule met before the deciding one that the evaluator cannot decide, and whose
    action would turn around whether the packet is accepted, makes it undecided, as does a source zone ahead of the
    chosen one whose source (an ipset) the evaluator cannot match and whose verdict differs; the others are
    notes."""
    flip = [f"firewalld rich rule: {r}" for a, r in maybe if (a == "accept") != (verdict == "accept")]
    for name, src in maybe_zones:
        zv, _, _ = _eval_zone(fw, fw.zones[name], f"source {src}", pkt, [], [])
        if ((zv or "reject") == "accept") != (verdict == "accept"):
            flip.append(f"firewalld zone {name!r} source {src} (the packet may come from it)")
        else:
            notes.append(f"zone {name!r} source {src} not evaluated (cannot change this verdict)")
    notes = notes + [f"rich rule not evaluated (cannot change this verdict): {r}" for a, r in maybe
                     if (a == "accept") == (verdict == "accept")]
    return LayerResult("firewalld", verdict, explicit, ev, tuple(dict.fromkeys(notes)), tuple(dict.fromkeys(flip)))


def _action(a: str | None) -> Action:
    return "accept" if a == "accept" else "drop" if a == "drop" else "reject"


def _eval_zone(fw: Firewalld, z: Zone, why: str, pkt: Packet, notes: list[str],
               maybe: list[tuple[Action, str]], kind: str = "zone") -> tuple[Action | None, bool, str]:
    head = f"firewalld {kind} {z.name!r} ({why})"
    parsed = [(x, parse_rich(x)) for x in z.rich_rules]
    notes.extend(f"unparsable rich rule {x!r}" for x, r in parsed if r is None)
    terminal = [r for _, r in parsed if r is not None and r.action in ("accept", "reject", "drop")]
    pre = sorted([r for r in terminal if r.priority < 0], key=lambda r: r.priority)
    post = sorted([r for r in terminal if r.priority > 0], key=lambda r: r.priority)
    zero = [r for r in terminal if r.priority == 0]
    deny = [r for r in zero if r.action != "accept"]
    allow = [r for r in zero if r.action == "accept"]

    def walk(rules: list[RichRule]) -> tuple[Action | None, bool, str] | None:
        for r in rules:
            m = _rich_match(fw, r, pkt)
            if m and r.limit:
                m = None
            if m is None:
                maybe.append((_action(r.action), r.raw))
            elif m:
                return _action(r.action), True, f"{head}: rich rule: {r.raw}"
        return None
    hit = walk(pre) or walk(deny) or walk(allow)
    if hit:
        return hit
    for p, q in z.ports:
        if q == pkt.proto and in_ports(pkt.dport, p, "-"):
            return "accept", True, f"{head}: port {p}/{q}"
    for s in z.services:
        sp = service_ports(fw, s)
        if sp is None:
            notes.append(f"service {s!r} definition not collected")
            continue
        for p, q in sp[0]:
            if q == pkt.proto and in_ports(pkt.dport, p, "-"):
                return "accept", True, f"{head}: service {s} ({p}/{q})"
        if pkt.proto in sp[1]:
            return "accept", True, f"{head}: service {s} (protocol {pkt.proto})"
    if pkt.proto in z.protocols:
        return "accept", True, f"{head}: protocol {pkt.proto}"
    if z.source_ports:
        notes.append(f"zone {z.name!r} source-ports not evaluated")
    hit = walk(post)
    if hit:
        return hit
    t = z.target or "default"
    miss = "{}/{} not in ports [{}] / services [{}]".format(
        pkt.dport, pkt.proto, ", ".join("/".join(p) for p in z.ports), ", ".join(z.services))
    ev = f"{head}: target {t}, {miss}"
    if t == "ACCEPT":
        return "accept", True, f"{head}: target ACCEPT"
    if t == "DROP":
        return "drop", True, ev
    if t in ("%%REJECT%%", "REJECT"):
        return "reject", True, ev
    return None, False, ev  # default: rejected by firewalld's filter_INPUT tail


def port_marks(fw: Firewalld) -> set[int]:
    """Port numbers the zones' ports, rich rules and services mention."""
    marks: set[int] = set()
    for z in fw.zones.values():
        for spec in [p for p, _ in z.ports] + list(z.rich_rules):
            marks.update(int(x) for x in re.findall(r"\b\d{1,5}\b", spec) if int(x) <= 65535)
    for s in fw.services.values():
        for p, _ in s.ports:
            marks.update(int(x) for x in re.findall(r"\d+", p))
    return marks


# ---------------------------------------------------------------- egress: policies from HOST, direct OUTPUT rules


def egress_zone(fw: Firewalld, dst: Any, oif: str | None) -> str | None:
    """The zone firewalld classifies a packet the node sends by: the zone a source of which holds the destination,
    else the zone of the outgoing interface, else the default zone."""
    for name in sorted(fw.zones, key=lambda n: (fw.zones[n].ingress_priority, n)):
        if any(in_net(dst, s) for s in fw.zones[name].sources):
            return name
    if oif is not None:
        for name in sorted(fw.zones):
            if any(iface_match(i, oif) for i in fw.zones[name].interfaces):
                return name
    return fw.default_zone


def host_policies(fw: Firewalld, ezone: str | None) -> list[Policy]:
    """The policies a packet the node itself sends into `ezone` meets, in firewalld's order (priority, name)."""
    return sorted((p for p in fw.policies.values() if "HOST" in p.ingress_zones
                   and ("ANY" in p.egress_zones or (ezone is not None and ezone in p.egress_zones))),
                  key=lambda p: (p.priority, p.name))


_DIRECT_PLAIN = {"-m": {"tcp", "comment", "conntrack", "state"}}


def _direct_match(r: DirectRule, pkt: Packet, oif: str | None) -> bool | None:
    """Whether a direct OUTPUT rule matches the packet (None: a match this model does not know)."""
    a, i, res = list(r.args), 0, []
    while i < len(a):
        k = a[i]
        v = a[i + 1] if i + 1 < len(a) else ""
        if k == "!":
            return None
        if k in ("-j", "--jump"):
            i += 2
            continue
        if k in ("-d", "--destination"):
            res.append(in_net(pkt.dst, v) if pkt.dst is not None else None)
        elif k in ("-s", "--source"):
            res.append(in_net(pkt.src, v))
        elif k in ("-p", "--protocol"):
            res.append(v == pkt.proto)
        elif k in ("--dport", "--destination-port"):
            res.append(in_ports(pkt.dport, v, ":"))
        elif k in ("-o", "--out-interface"):
            res.append(None if oif is None else iface_match(v, oif))
        elif k == "--comment":
            pass
        elif k in ("--ctstate", "--state"):
            res.append("NEW" in v.split(","))
        elif k == "-m" and v in _DIRECT_PLAIN["-m"]:
            pass
        else:
            return None
        i += 2
    return tri_and(res)


def direct_target(r: DirectRule) -> str:
    a = list(r.args)
    for k in ("-j", "--jump"):
        if k in a and a.index(k) + 1 < len(a):
            return a[a.index(k) + 1]
    return ""


def evaluate_egress(fw: Firewalld, pkt: Packet, oif: str | None) -> LayerResult:
    """Would firewalld let the node send a NEW packet `pkt` (src: the node's address, dst: the peer's) out of
    `oif`? Direct rules of the OUTPUT chain first (priority order), then the policies whose ingress zone is HOST
    and whose egress zone is the packet's (or ANY), each by its rich rules, ports, services, protocols and target
    (CONTINUE: on to the next policy); no verdict: accepted (firewalld lets the host send by default)."""
    notes: list[str] = []
    maybe: list[tuple[Action, str]] = []
    fam = f"ipv{pkt.family}"
    for r in sorted((r for r in fw.direct_rules if r.ipv == fam and r.table == "filter" and r.chain == "OUTPUT"),
                    key=lambda r: r.priority):
        t = direct_target(r)
        if t not in ("ACCEPT", "DROP", "REJECT"):
            continue
        m = _direct_match(r, pkt, oif)
        verdict: Action = "accept" if t == "ACCEPT" else "drop" if t == "DROP" else "reject"
        if m is None:
            maybe.append((verdict, f"direct rule {r.text}"))
        elif m:
            return _settled(fw, pkt, verdict, True, f"firewalld direct rule: {r.text}", notes, maybe, [])
    ez = egress_zone(fw, pkt.dst, oif)
    for p in host_policies(fw, ez):
        v, explicit, ev = _eval_zone(fw, p.as_zone(), f"ingress HOST, egress {ez}", pkt, notes, maybe, "policy")
        if v is not None:
            return _settled(fw, pkt, v, explicit, ev, notes, maybe, [])
    return _settled(fw, pkt, "accept", False, f"firewalld: no policy from HOST to {ez} decides it", notes, maybe, [])


# ---------------------------------------------------------------- the fix: where the owner keeps it

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
