"""The firewalld zone model: pick the zone(s) firewalld would use for the packet, then walk its rich rules, ports,
services, protocols and target like firewalld's generated rules do."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
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
class Firewalld:
    """The ``firewalld`` part of the node's firewall facts."""

    running: bool = True
    version: str | None = None
    default_zone: str | None = None
    allow_zone_drifting: bool = False
    zones: dict[str, Zone] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Firewalld:
        zones: Mapping[Any, Any] = d["zones"] if isinstance(d.get("zones"), Mapping) else {}
        services: Mapping[Any, Any] = d["services"] if isinstance(d.get("services"), Mapping) else {}
        return cls(bool(d.get("running", True)), None if d.get("version") is None else str(d.get("version")),
                   None if d.get("default_zone") is None else str(d.get("default_zone")),
                   bool(d.get("allow_zone_drifting")),
                   {str(n): Zone.of(str(n), z) for n, z in zones.items() if isinstance(z, Mapping)},
                   {str(n): Service(_pairs(s.get("ports")), _strs(s.get("protocols")), _strs(s.get("includes")))
                    for n, s in services.items() if isinstance(s, Mapping)})

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
               maybe: list[tuple[Action, str]]) -> tuple[Action | None, bool, str]:
    head = f"firewalld zone {z.name!r} ({why})"
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
