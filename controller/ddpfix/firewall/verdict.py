"""Shared types of the firewall evaluator: the modelled packet, a layer's result, the verdict, and the helpers every
layer uses (address, interface and port matches, three-valued logic, netfilter's chain walk)."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
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
    """The modelled packet: NEW (conntrack), a SYN, unicast, not DNATed; arriving for a local address, or with
    ``out`` sent by the node itself (src: its own address, dst: the peer's; ``iface``: the outgoing interface)."""

    src: Address
    dport: int
    iface: str | None = None  # None: some non-loopback interface (the incoming one; with `out`, the outgoing one)
    proto: str = "tcp"
    dst: Address | None = None  # None: the destination address is not known
    out: bool = False  # sent by the node (the output hook / OUTPUT chain), not received

    @property
    def family(self) -> int:
        return self.src.version

    @classmethod
    def of(cls, src: str, dport: int, iface: str | None = None, proto: str | None = "tcp",
           dst: str | None = None, out: bool = False) -> Packet:
        return cls(ipaddress.ip_address(src), int(dport), iface, (proto or "tcp").lower(),
                   ipaddress.ip_address(dst) if dst else None, out)


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
    #: nftables: (family, table, base chain) of the first base chain that refuses the packet (a rule of a chain it
    #: jumped to counts for that base chain); None when the layer accepts, and for the other layers
    chain: tuple[str, str, str] | None = None

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
    chain: tuple[str, str, str] | None = None  # the deciding layer's (LayerResult.chain): where a fix would go

    @property
    def decided(self) -> bool:
        return not self.undecided


_network = lru_cache(maxsize=1 << 16)(network)  # a rule set's addresses are asked about once per packet


def in_net(addr: Address | None, spec: str) -> bool | None:
    """addr in spec ('a.b.c.d[/n]'); False on family mismatch, None if unparsable (or addr unknown)."""
    within = _network(spec)
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
#: Chains deep a walk follows jumps and gotos (nft's kernel refuses more than 16; iptables rule sets seen in the
#: wild nest fewer than 10); a deeper jump is undecided, like a loop.
MAX_DEPTH = 64
#: How a path cut at a loop is named in ``undecided``: the rules as read jump back into a chain on the path, which
#: no kernel holds (iptables and nft refuse a loop), so they are not what the node runs: a probe does not decide it.
LOOP = "reached again on the same path (a loop)"


class BudgetExceeded(Exception):
    """The firewall analysis ran past its time budget (`budget`): what it was deciding is not evaluated."""


#: The monotonic time after which a walk stops (None: no budget); set by `budget`, read by every walk.
_DEADLINE: ContextVar[float | None] = ContextVar("ddpfix_firewall_deadline", default=None)


@contextmanager
def budget(seconds: float) -> Iterator[None]:
    """Every chain walk inside the block raises `BudgetExceeded` once `seconds` have passed since it was entered (an
    enclosing budget that ends sooner still holds)."""
    end = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(end, outer))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@dataclass(frozen=True)
class Path:
    """One way through the chains: its end (None: the base chain's policy decides), the deciding rule's evidence
    (+ how it was reached), the undecided rules it assumed to match on the way (empty: the nominal path), and
    ``cut``: why the walk did not follow it to its end (a chain reached again on the same path, jumps nested deeper
    than ``MAX_DEPTH``, more than ``MAX_PATHS`` ways), naming the rule; its fate is then unknown."""

    verdict: Action | None
    evidence: str | None
    assumed: tuple[str, ...] = ()
    cut: str | None = None


@dataclass(frozen=True)
class _Out:
    """How a walk of one chain (entered by a jump, at its first rule) can end: a verdict (``verdict``, ``ref``),
    a return to the caller (``verdict`` None), or a cut (``cut``); ``via``: the jumps from that chain to the end."""

    verdict: Action | None
    ref: str | None
    via: tuple[str, ...]
    assumed: tuple[str, ...]
    cut: str | None = None


class _Walk:
    """One walk (one packet, one base chain), memoised per chain: the ways a chain can end, once worked out, are
    reused wherever it is jumped to again (a jump tree costs its rules once, not once per way of reaching them). A
    chain reached again on the same path (a loop: the kernel refuses one) or nested deeper than ``MAX_DEPTH`` is not
    walked: that way is cut, undecided, never a pass."""

    def __init__(self, rules_of: Callable[[str], Sequence[R]], decide: Decide[R], max_paths: int) -> None:
        self.rules_of, self.decide, self.max_paths = rules_of, decide, max_paths
        self.memo: dict[str, list[_Out]] = {}
        self.complete = True
        self.steps = 0
        self.deadline = _DEADLINE.get()

    def tick(self) -> None:
        self.steps += 1
        if self.deadline is not None and not self.steps & 1023 and time.monotonic() > self.deadline:
            raise BudgetExceeded(f"stopped after {self.steps} rules")

    def called(self, chain: str, on_path: tuple[str, ...]) -> list[_Out]:
        outs = self.memo.get(chain)
        if outs is None:
            outs = self.memo[chain] = self.run(chain, (*on_path, chain))
        return outs

    def run(self, chain: str, on_path: tuple[str, ...]) -> list[_Out]:
        """The ways `chain` (entered at its first rule, `on_path`: the chains of the path, `chain` last) can end;
        the nominal way (no undecided rule assumed to match) first, at most ``max_paths`` and a cut for the rest."""
        rules = self.rules_of(chain)
        outs: list[_Out] = []
        todo: list[tuple[int, tuple[str, ...]]] = [(0, ())]  # (next rule, assumed): the nominal way first
        dropped: list[str] = []

        def queue(ways: Sequence[tuple[int, tuple[str, ...]]]) -> None:
            for way in ways:
                if len(todo) + len(outs) >= self.max_paths:
                    dropped.extend(r for r in way[1] if r not in dropped)
                else:
                    todo.append(way)

        while todo:
            idx, assumed = todo.pop(0)
            while True:
                if idx >= len(rules):
                    outs.append(_Out(None, None, (), assumed))
                    break
                self.tick()
                alts, ref = self.decide(chain, idx + 1, rules[idx])
                idx += 1
                if not alts:
                    continue
                for action, target in alts[1:]:  # the undecided rule matched: other ways
                    queue(self.step(chain, idx, ref, action, target, (*assumed, ref), on_path, outs))
                ways = self.step(chain, idx, ref, alts[0][0], alts[0][1], assumed, on_path, outs)
                if not ways or ways[0][1] != assumed:  # the way this loop follows ended at this rule
                    queue(ways)
                    break
                idx = ways[0][0]
                queue(ways[1:])
        outs.sort(key=lambda o: bool(o.assumed))  # the nominal way first (stable)
        if len(outs) > self.max_paths:
            for o in outs[self.max_paths:]:
                dropped.extend(r for r in o.assumed if r not in dropped)
            del outs[self.max_paths:]
        if dropped:
            self.complete = False
            outs.append(_Out(None, None, (), tuple(dropped), f"more than {self.max_paths} ways through the chains"))
        return outs

    def step(self, chain: str, idx: int, ref: str, action: Step, target: str | None, assumed: tuple[str, ...],
             on_path: tuple[str, ...], outs: list[_Out]) -> list[tuple[int, tuple[str, ...]]]:
        """Take one rule's step (the rule at `idx` - 1 of `chain`): the ways that end are appended to `outs`; ->
        where the walk goes on in `chain` (its first element the way that assumes least)."""
        if action in ("accept", "drop", "reject"):
            verdict: Action = "accept" if action == "accept" else "drop" if action == "drop" else "reject"
            outs.append(_Out(verdict, ref, (), assumed))
            return []
        if action == "return":
            outs.append(_Out(None, None, (), assumed))
            return []
        if action not in ("jump", "goto") or target is None:
            return [(idx, assumed)]
        if target in on_path or len(on_path) >= MAX_DEPTH:
            why = LOOP if target in on_path else f"nested deeper than {MAX_DEPTH}"
            outs.append(_Out(None, None, (), assumed, f"{ref} ({action} {target}: {why}; not walked)"))
            return []
        hop = f"{chain} #{idx}"
        conts: list[tuple[int, tuple[str, ...]]] = []
        for o in self.called(target, on_path):
            both = (*assumed, *o.assumed) if o.assumed else assumed
            if o.verdict is None and o.cut is None and action == "jump":
                conts.append((idx, both))  # returned: on with the next rule
            else:  # a verdict, a cut, or the end of a goto's chain (which returns from this one)
                outs.append(_Out(o.verdict, o.ref, (hop, *o.via) if o.ref else (), both, o.cut))
        return conts


def walk(start: str, rules_of: Callable[[str], Sequence[R]], decide: Decide[R],
         max_paths: int = MAX_PATHS) -> tuple[list[Path], bool]:
    """Netfilter chain traversal shared by iptables and nft: rules in order, jump pushes a return point, goto does
    not, RETURN / end of a called chain pops, end of the base chain (or RETURN in it) falls to the policy.

    A rule that ``decide`` cannot decide forks the walk: the nominal path goes on as if it did not match, each
    other way it can go is walked too (assuming the rule matched). Linear in the rules and the paths: each chain's
    ways are worked out once per walk; a chain reached again on the same path is not re-walked (that path is cut).
    -> (the paths, the nominal one first; whether every path was walked: False when more than ``max_paths`` would
    be needed). Raises `BudgetExceeded` past the enclosing `budget`."""
    w = _Walk(rules_of, decide, max_paths)
    if w.deadline is not None and time.monotonic() > w.deadline:
        raise BudgetExceeded("stopped before a walk")
    outs = w.run(start, (start,))
    paths = [Path(o.verdict, (o.ref + (" (via {})".format(", ".join(o.via)) if o.via else "")) if o.ref else None,
                  o.assumed, o.cut) for o in outs]
    paths.sort(key=lambda p: bool(p.assumed))  # the nominal path first (stable: the others keep their order)
    return paths[: max_paths + 1], w.complete


def settle(paths: Sequence[Path], complete: bool, policy: Action) -> tuple[Path, tuple[str, ...], tuple[str, ...]]:
    """What the walk's paths say about one base chain whose policy is ``policy``.

    -> (the nominal path (no undecided rule matched), the undecided rules whose match turns around whether the
    packet is accepted, the other undecided rules met: they cannot change it). When not every path was walked,
    every undecided rule met counts as one that could change the verdict."""
    nominal = paths[0]

    def accepted(p: Path) -> bool:
        return (p.verdict or policy) == "accept"

    want = accepted(nominal)
    und: list[str] = [nominal.cut] if nominal.cut else []  # the nominal path itself was cut: its fate is unknown
    for p in paths[1:]:
        if p.cut or accepted(p) != want or not complete:
            und.extend(r for r in (*p.assumed, *((p.cut,) if p.cut else ())) if r not in und)
    met = [r for p in paths for r in p.assumed]
    return nominal, tuple(und), tuple(dict.fromkeys(r for r in met if r not in und))
