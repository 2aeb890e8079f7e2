"""The firewalld model: its zones, policies, services, direct rules and rich rules, read from the facts
(`Firewalld.of`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
