"""Shared types of the firewall evaluator: the modelled packet, a layer's result, the verdict, and the helpers every
layer uses (address, interface and port matches, three-valued logic, netfilter's chain walk)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: A terminal verdict: what a layer does with the packet.
Action = Literal["accept", "drop", "reject"]
#: What one rule does when it matches: a terminal verdict, return, jump/goto (to a chain), or nothing (None).
Step = Literal["accept", "drop", "reject", "return", "jump", "goto"] | None

PROTO_NUM = {"tcp": 6, "udp": 17, "icmp": 1, "ipv6-icmp": 58, "icmpv6": 58,
             "sctp": 132, "udplite": 136, "dccp": 33, "gre": 47, "esp": 50, "ah": 51}


@dataclass(frozen=True)
class Packet:
    """The modelled packet: NEW (conntrack), a SYN, unicast to a local address, not DNATed."""

    src: Address
    dport: int
    iface: str | None = None  # None: some non-loopback interface
    proto: str = "tcp"
    dst: Address | None = None  # None: the destination address is not known

    @property
    def family(self) -> int:
        return self.src.version

    @classmethod
    def of(cls, src: str, dport: int, iface: str | None = None, proto: str | None = "tcp",
           dst: str | None = None) -> Packet:
        return cls(ipaddress.ip_address(src), int(dport), iface, (proto or "tcp").lower(),
                   ipaddress.ip_address(dst) if dst else None)


@dataclass(frozen=True)
class LayerResult:
    """One firewall layer's decision on the packet."""

    layer: str  # "firewalld", "iptables", "ip6tables", "iptables-legacy", "nftables"
    verdict: Action
    explicit: bool  # an explicit rule decided (not a chain policy / an empty ruleset)
    evidence: str  # the deciding rule, as the tool prints it
    notes: tuple[str, ...] = ()  # rules that could not be decided (treated as non-matching)


@dataclass(frozen=True)
class Verdict:
    """Does the packet get accepted by every active layer?

    ``layer``/``evidence`` name the deciding rule: the first drop/reject, else the first explicit accept, else a
    policy accept; ``layer`` is None when no layer holds rules."""

    allowed: bool
    layer: str | None
    verdict: Action
    explicit: bool
    evidence: str
    notes: tuple[str, ...] = ()
    layers: tuple[LayerResult, ...] = field(default=())


def in_net(addr: Address | None, spec: str) -> bool | None:
    """addr in spec ('a.b.c.d[/n]'); False on family mismatch, None if unparsable (or addr unknown)."""
    try:
        net = ipaddress.ip_network(spec, strict=False)
    except ValueError:
        return None
    if addr is None:
        return None
    return net.version == addr.version and addr in net


def iface_match(pattern: str, iface: str | None, plus: str = "+") -> bool | None:
    """Interface name match with a trailing wildcard ('+' iptables/firewalld, '*' nft)."""
    if iface is None:
        return False if pattern.rstrip(plus) == "lo" else None
    if pattern.endswith(plus):
        return iface.startswith(pattern[:-1])
    return iface == pattern


def in_ports(port: int, spec: object, sep: str) -> bool | None:
    """port in '80' / '1000<sep>2000' (sep ':' iptables, '-' firewalld)."""
    a, s, b = str(spec).partition(sep)
    try:
        lo = int(a) if a else 0
        hi = int(b) if s and b else (65535 if s else lo)
    except ValueError:
        return None
    return lo <= port <= hi


def tri_and(values: Sequence[bool | None]) -> bool | None:
    """Three-valued AND: False if any False, else None if any None, else True."""
    if False in values:
        return False
    return None if None in values else True


R = TypeVar("R")
#: decide(chain, n, rule) -> (step, target chain, evidence of the rule)
Decide = Callable[[str, int, R], tuple[Step, str | None, str]]


def walk(start: str, rules_of: Callable[[str], Sequence[R]], decide: Decide[R]) -> tuple[Action | None, str | None]:
    """Netfilter chain traversal shared by iptables and nft: rules in order, jump pushes a return point, goto does
    not, RETURN / end of a called chain pops, end of the base chain (or RETURN in it) falls to the policy.

    -> (verdict or None for "the policy decides", evidence of the deciding rule + how it was reached)."""
    stack: list[tuple[str, int, list[str]]] = []
    via: list[str] = []
    chain, idx = start, 0
    for _ in range(100000):  # loop guard; nft and iptables both reject chain loops anyway
        rules = rules_of(chain)
        if idx >= len(rules):
            if not stack:
                break
            chain, idx, via = stack.pop()
            continue
        idx += 1
        action, target, ref = decide(chain, idx, rules[idx - 1])
        if action in ("accept", "drop", "reject"):
            verdict: Action = "accept" if action == "accept" else "drop" if action == "drop" else "reject"
            return verdict, ref + (" (via {})".format(", ".join(via)) if via else "")
        if action == "return":
            if not stack:
                break
            chain, idx, via = stack.pop()
        elif action in ("jump", "goto") and target is not None:
            if action == "jump":
                stack.append((chain, idx, via))
            chain, idx, via = target, 0, [*via, f"{chain} #{idx}"]
    return None, None
