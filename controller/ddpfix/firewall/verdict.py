"""Shared types of the firewall evaluator: the modelled packet, a layer's result, the verdict, and the helpers every
layer uses (address, interface and port matches, three-valued logic, netfilter's chain walk)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from ddpfix.model.net import Address, network

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
    """One firewall layer's decision on the packet.

    ``verdict`` is what the layer does when no rule it cannot evaluate matches; ``undecided`` names the rules it
    cannot evaluate (a match or target the evaluator does not model) whose match would change whether the layer
    accepts: when it is not empty, the layer's fate of the packet is undecided."""

    layer: str  # "firewalld", "iptables", "ip6tables", "iptables-legacy", "nftables"
    verdict: Action
    explicit: bool  # an explicit rule decided (not a chain policy / an empty ruleset)
    evidence: str  # the deciding rule, as the tool prints it
    notes: tuple[str, ...] = ()  # rules that could not be evaluated but cannot change the verdict
    undecided: tuple[str, ...] = ()  # rules that could not be evaluated and could change the verdict

    @property
    def decided(self) -> bool:
        return not self.undecided


@dataclass(frozen=True)
class Verdict:
    """Does the packet get accepted by every active layer?

    ``allowed``/``layer``/``evidence`` name the outcome when no rule the evaluator cannot decide matches: the first
    drop/reject, else the first explicit accept, else a policy accept; ``layer`` is None when no layer holds rules.
    ``undecided`` lists the rules (as the tools print them) that the evaluator does not model and whose match would
    turn that outcome around: when it is not empty the packet's fate is **undecided**, neither a pass nor a block
    (``allowed`` then says which way it goes if none of them matches)."""

    allowed: bool
    layer: str | None
    verdict: Action
    explicit: bool
    evidence: str
    notes: tuple[str, ...] = ()
    layers: tuple[LayerResult, ...] = field(default=())
    undecided: tuple[str, ...] = ()

    @property
    def decided(self) -> bool:
        return not self.undecided


def in_net(addr: Address | None, spec: str) -> bool | None:
    """addr in spec ('a.b.c.d[/n]'); False on family mismatch, None if unparsable (or addr unknown)."""
    within = network(spec)
    if within is None or addr is None:
        return None
    return within.version == addr.version and addr in within


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
#: One way a rule can go: (step, jump/goto target). A rule the evaluator decided has one; a rule it cannot decide
#: has several, the first being what it does when it does not match (usually ``(None, None)``: next rule).
Alt = tuple[Step, str | None]
#: decide(chain, n, rule) -> (the ways the rule can go, evidence of the rule)
Decide = Callable[[str, int, R], tuple[Sequence[Alt], str]]
#: Paths explored per walk before giving up (each undecided rule that can change the path doubles them).
MAX_PATHS = 256


@dataclass(frozen=True)
class Path:
    """One way through the chains: its end (None: the base chain's policy decides), the deciding rule's evidence
    (+ how it was reached), and the undecided rules it assumed to match on the way (empty: the nominal path)."""

    verdict: Action | None
    evidence: str | None
    assumed: tuple[str, ...] = ()


Frame = tuple[str, int, tuple[str, ...]]  # (chain, next rule index, how it was reached)


@dataclass(frozen=True)
class _Pending:
    """A walk still to do: where it stands, its return stack and the undecided rules it assumed to match."""

    chain: str
    idx: int
    via: tuple[str, ...]
    stack: tuple[Frame, ...]
    assumed: tuple[str, ...]


def _step(at: _Pending, action: Step, target: str | None, ref: str) -> _Pending | Path | None:
    """Take one rule's step from ``at`` (the rule just read): a finished path, where the walk goes on, or None
    (no step: the next rule)."""
    if action in ("accept", "drop", "reject"):
        verdict: Action = "accept" if action == "accept" else "drop" if action == "drop" else "reject"
        return Path(verdict, ref + (" (via {})".format(", ".join(at.via)) if at.via else ""), at.assumed)
    if action == "return":
        if not at.stack:
            return Path(None, None, at.assumed)
        (c, i, v), rest = at.stack[-1], at.stack[:-1]
        return _Pending(c, i, v, rest, at.assumed)
    if action in ("jump", "goto") and target is not None:
        stack = (*at.stack, (at.chain, at.idx, at.via)) if action == "jump" else at.stack
        return _Pending(target, 0, (*at.via, f"{at.chain} #{at.idx}"), stack, at.assumed)
    return None


def walk(start: str, rules_of: Callable[[str], Sequence[R]], decide: Decide[R],
         max_paths: int = MAX_PATHS) -> tuple[list[Path], bool]:
    """Netfilter chain traversal shared by iptables and nft: rules in order, jump pushes a return point, goto does
    not, RETURN / end of a called chain pops, end of the base chain (or RETURN in it) falls to the policy.

    A rule that ``decide`` cannot decide forks the walk: the nominal path goes on as if it did not match, each
    other way it can go is walked too (assuming the rule matched). -> (the paths, the nominal one first; whether
    every path was walked: False when more than ``max_paths`` would be needed)."""
    todo: list[_Pending | Path] = [_Pending(start, 0, (), (), ())]
    paths: list[Path] = []
    while todo:
        if len(paths) + len(todo) > max_paths:
            return paths, False
        at: _Pending | Path | None = todo.pop(0)
        for _ in range(100000):  # loop guard; nft and iptables both reject chain loops anyway
            if not isinstance(at, _Pending):
                break
            rules = rules_of(at.chain)
            if at.idx >= len(rules):
                at = _step(at, "return", None, "")
                continue
            cur = _Pending(at.chain, at.idx + 1, at.via, at.stack, at.assumed)
            alts, ref = decide(cur.chain, cur.idx, rules[at.idx])
            if not alts:
                at = cur
                continue
            fork = _Pending(cur.chain, cur.idx, cur.via, cur.stack, (*cur.assumed, ref))
            for action, target in alts[1:]:  # the undecided rule matched: another path
                todo.append(_step(fork, action, target, ref) or fork)
            nxt = _step(cur, alts[0][0], alts[0][1], ref)
            at = cur if nxt is None else nxt
        paths.append(at if isinstance(at, Path) else Path(None, None, at.assumed if at else ()))
    return paths, True


def settle(paths: Sequence[Path], complete: bool, policy: Action) -> tuple[Path, tuple[str, ...], tuple[str, ...]]:
    """What the walk's paths say about one base chain whose policy is ``policy``.

    -> (the nominal path (no undecided rule matched), the undecided rules whose match turns around whether the
    packet is accepted, the other undecided rules met: they cannot change it). When not every path was walked,
    every undecided rule met counts as one that could change the verdict."""
    nominal = paths[0]

    def accepted(p: Path) -> bool:
        return (p.verdict or policy) == "accept"

    want = accepted(nominal)
    und: list[str] = []
    for p in paths[1:]:
        if accepted(p) != want or not complete:
            und.extend(r for r in p.assumed if r not in und)
    met = [r for p in paths for r in p.assumed]
    return nominal, tuple(und), tuple(dict.fromkeys(r for r in met if r not in und))
