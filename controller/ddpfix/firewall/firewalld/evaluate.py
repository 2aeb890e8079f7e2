"""The firewalld evaluator: pick the zone(s) firewalld would use for the packet, then walk its rich rules, ports,
services, protocols and target like firewalld's generated rules do (`evaluate`); for what the node sends, its
policies from HOST and its direct OUTPUT rules (`evaluate_egress`)."""

from __future__ import annotations

import re
from typing import Any

from ddpfix.firewall.firewalld.model import DirectRule, Firewalld, Policy, RichRule, Zone, parse_rich, service_ports
from ddpfix.firewall.verdict import (
    Action,
    LayerResult,
    Packet,
    iface_match,
    in_net,
    in_ports,
    tri_and,
)


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
