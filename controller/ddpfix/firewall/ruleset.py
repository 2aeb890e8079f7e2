"""A node's firewall facts as one rule set, and the questions the checks ask of it: would this packet be accepted
(`evaluate`), which ports of a range would not be (`ports_blocked`, `sample_ports`), is a port open to the world
(`world_open`).

Netfilter semantics: every active layer / base chain must accept; the first drop/reject is final. Layers: the
firewalld zone model (firewalld's own nft tables / iptables chains are then skipped), iptables (filter INPUT and the
user chains it reaches), nftables (base filter chains on prerouting and input; tables that iptables-nft created are
skipped when iptables-save was evaluated). What cannot be decided is never a pass: a rule with a match or target
the evaluator does not model (ipsets, limits, recent, hashlimit, string, u32, bpf, connlimit, marks, source ports,
destination addresses when ``dst`` is not given, ``fib``, ``xt`` expressions, sets it cannot resolve, queue
verdicts, ...) is walked both ways; when that could turn around whether the packet is accepted, the verdict is
undecided (``Verdict.undecided`` names those rules), else the rule is listed in ``notes`` / the evidence.
``iface=None`` means "some non-loopback interface".
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ddpfix.firewall import firewalld as fwd
from ddpfix.firewall import iptables as ipt
from ddpfix.firewall import nftables as nft
from ddpfix.firewall.verdict import LayerResult, Packet, Verdict

SCHEMA = "ddpfix.firewall/v1"
#: Documentation addresses (TEST-NET-1..3, 2001:db8::/32): the "world" a world-open rule admits. Only evaluated.
TEST_NET_SOURCES = ("203.0.113.7", "198.51.100.7", "192.0.2.7", "2001:db8::7")


@dataclass(frozen=True)
class IptablesText:
    """One iptables-save output (iptables, iptables-legacy or ip6tables) and what evaluating it needs."""

    label: str
    family: str | None  # the nft family its iptables-nft tables live in (None: legacy, not in nft)
    text: str
    chains: dict[str, ipt.Chain]

    @property
    def firewalld_backend(self) -> bool:
        """firewalld's iptables backend wrote it: evaluated through the zone model instead."""
        return re.search(r"^:INPUT_ZONES\b", self.text, re.MULTILINE) is not None

    @property
    def in_nft(self) -> bool:
        """iptables-nft: its tables also appear in `nft -j` and must not be counted twice."""
        return bool(self.family) and "*filter" in self.text and "(legacy)" not in self.text.split("\n", 1)[0]


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


class Ruleset:
    """A node's firewall facts (the ``ddpfix.firewall/v1`` dict its collector returns), parsed once."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.state = state
        fw = state.get("firewalld")
        self.firewalld = fwd.Firewalld.of(fw) if isinstance(fw, Mapping) and fw else None
        self.ipv4: list[IptablesText] = []
        self.ipv6: list[IptablesText] = []
        for key, label, fam, out in (("iptables", "iptables", "ip", self.ipv4),
                                     ("iptables_legacy", "iptables-legacy", None, self.ipv4),
                                     ("ip6tables", "ip6tables", "ip6", self.ipv6)):
            text = _text(state.get(key))
            if text is not None:
                out.append(IptablesText(label, fam, text, ipt.parse(text)))
        raw = state.get("nft")
        self.nft = nft.Ruleset.of(raw, _text(state.get("nft_text"))) if raw else None

    @property
    def firewalld_active(self) -> bool:
        return self.firewalld is not None and self.firewalld.active

    @cached_property
    def port_marks(self) -> frozenset[int]:
        """Every port number that appears in a port match anywhere in the rule set."""
        marks: set[int] = set()
        for t in self.ipv4 + self.ipv6:
            marks |= ipt.port_marks(t.text)
        if self.firewalld is not None:
            marks |= fwd.port_marks(self.firewalld)
        marks |= nft.port_marks(self.state.get("nft"))
        return frozenset(marks)

    @cached_property
    def uses_dst(self) -> bool:
        """Whether any rule matches on the destination address (then the packet's destination must be given, or
        those rules are undecided)."""
        texts = [t.text for t in self.ipv4 + self.ipv6]
        if any(re.search(r"(?:^|\s)(?:-d|--destination|--dst|--dst-range)\s", t, re.MULTILINE) for t in texts):
            return True
        if self.firewalld is not None and any("destination" in r for z in self.firewalld.zones.values()
                                              for r in z.rich_rules):
            return True
        return self.nft is not None and '"daddr"' in json.dumps(self.state.get("nft"))

    def evaluate(self, pkt: Packet) -> Verdict:
        """Would the packet be accepted by every active layer?"""
        notes: list[str] = []
        layers: list[LayerResult] = []
        fw_on = self.firewalld_active
        if fw_on and self.firewalld is not None:
            layers.append(fwd.evaluate_egress(self.firewalld, pkt, pkt.iface) if pkt.out
                          else fwd.evaluate(self.firewalld, pkt))
        skip_ipt: list[str | None] = []
        for t in self.ipv4 if pkt.family == 4 else self.ipv6:
            if fw_on and t.firewalld_backend:
                notes.append(f"{t.label}: firewalld iptables backend, evaluated via the zone model")
                skip_ipt.append(t.family)
                continue
            r = ipt.evaluate(t.chains, pkt, t.label)
            if t.in_nft:
                skip_ipt.append(t.family)
            if r:
                layers.append(r)
        if self.nft is not None:
            r = nft.evaluate(self.nft, pkt, fw_on, skip_ipt)
            if r:
                layers.append(r)
        for lr in layers:
            notes.extend(f"{lr.layer}: {n}" for n in lr.notes)
        deny = [lr for lr in layers if lr.verdict != "accept"]
        expl = [lr for lr in layers if lr.verdict == "accept" and lr.explicit]
        picks = deny or expl or layers
        if not picks:
            return Verdict(True, None, "accept", False, "no active firewall rules", tuple(notes), ())
        # Undecided: accepted unless an undecided rule of some layer refuses it, or refused unless an undecided
        # rule of every refusing layer accepts it. Undecided rules that cannot turn the outcome are notes.
        may_accept = bool(deny) and all(lr.undecided for lr in deny)
        flips = (deny if may_accept else []) if deny else [lr for lr in layers if lr.undecided]
        undecided = tuple(dict.fromkeys(u for lr in flips for u in lr.undecided))
        notes.extend(f"{lr.layer}: not evaluated (cannot change this verdict): {u}" for lr in layers
                     if lr not in flips for u in lr.undecided)
        pick = picks[0]
        ev = pick.evidence
        if notes:
            ev += " [{} rule(s) not evaluated, cannot change this verdict: {}]".format(
                len(notes), "; ".join(notes[:3]) + ("; ..." if len(notes) > 3 else ""))
        return Verdict(not deny, pick.layer, pick.verdict, pick.explicit, ev, tuple(notes), tuple(layers), undecided,
                       pick.chain)


State = Ruleset | Mapping[str, Any]
#: The keys of the facts that the evaluator reads (`errors` and `unread` are not rules).
EVALUATED = ("firewalld", "iptables", "iptables_legacy", "ip6tables", "nft", "nft_text")


#: What differs between nodes with the same rules: the time in iptables-save's comment lines, packet counters.
_IPT_NOISE = re.compile(r"^(#[^\n]*?) on [^\n]*$|^(:\S+ \S+) \[\d+:\d+\]$|^\[\d+:\d+\] ", re.MULTILINE)


def _same_rules(key: str, v: Any) -> Any:
    """The value of facts[key] with what does not change the rules taken out (the time iptables-save ran, packet
    counters), and the nft JSON as its size when the nft text (the same rule set, counters aside) is there."""
    if not isinstance(v, str):
        return v
    if key == "nft_text":
        return nft.COUNTERS.sub("counter", v) if "counter packets" in v else v
    return _IPT_NOISE.sub(r"\1\2", v)


def _shape(v: Any) -> object:
    """A cheap, hashable stand-in for a value: texts as they are, containers by their size."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return (type(v).__name__, len(v)) if hasattr(v, "__len__") else type(v).__name__


class Rulesets:
    """The distinct rule sets of a cluster, each parsed once (nodes usually share one configuration).

    Two nodes share an entry when everything the evaluator reads is equal, apart from what never changes a verdict:
    the time in iptables-save's comments and packet counters (iptables-save's `[packets:bytes]`, nft's `counter
    packets N bytes M`; evidence never shows them). Facts are looked up by a cheap fingerprint (the rule texts,
    hashed in C; the JSON parts by their size), then compared. `nft -j`'s JSON is compared only where `nft -a`'s text
    of the same rule set is missing: deep-comparing (or serialising to hash) a firewalld rule set's JSON costs more
    than evaluating it, and its counters would make every node's differ."""

    def __init__(self) -> None:
        self._seen: dict[tuple[object, ...], list[tuple[dict[str, Any], int]]] = {}
        self.all: list[Ruleset] = []

    def get(self, state: Mapping[str, Any]) -> tuple[int, Ruleset]:
        """-> (an id that is equal for equal rule sets, the parsed rule set)."""
        same = {k: _same_rules(k, state.get(k)) for k in EVALUATED}
        if same["nft_text"] and same["nft"]:
            same["nft"] = _shape(same["nft"].get("nftables") if isinstance(same["nft"], Mapping) else same["nft"])
        bucket = self._seen.setdefault(tuple(_shape(same[k]) for k in EVALUATED), [])
        for seen, i in bucket:
            if seen == same:
                return i, self.all[i]
        self.all.append(Ruleset(state))
        bucket.append((same, len(self.all) - 1))
        return len(self.all) - 1, self.all[-1]


def ruleset(state: State) -> Ruleset:
    return state if isinstance(state, Ruleset) else Ruleset(state)


def evaluate(state: State, src: str, dport: int, iface: str | None = None, proto: str = "tcp",
             dst: str | None = None) -> Verdict:
    """Would a NEW packet src -> local dport (arriving on iface) be accepted by every active layer?"""
    return ruleset(state).evaluate(Packet.of(src, dport, iface, proto, dst))


def ports_blocked(state: State, src: str, ports: Iterable[int], iface: str | None = None, proto: str = "tcp",
                  dst: str | None = None) -> list[tuple[int, Verdict]]:
    """-> [(port, verdict)] for each port in ``ports`` that would NOT be accepted."""
    rs = ruleset(state)
    out = []
    for p in ports:
        r = evaluate(rs, src, p, iface=iface, proto=proto, dst=dst)
        if not r.allowed:
            out.append((int(p), r))
    return out


def sample_ports(state: State, lo: int, hi: int, extra: int = 5) -> list[int]:
    """Representative ports of [lo, hi]: the ends, ``extra`` evenly spaced points and, for every port number the rule
    sets mention, n-1, n, n+1. Because every supported port predicate is a union of intervals bounded by those
    numbers, testing these points decides the whole range exactly."""
    lo, hi = int(lo), int(hi)
    pts = {lo, hi}
    if extra and hi > lo:
        pts.update(lo + (hi - lo) * i // (extra + 1) for i in range(1, extra + 1))
    for m in ruleset(state).port_marks:
        pts.update(p for p in (m - 1, m, m + 1) if lo <= p <= hi)
    return sorted(pts)


def world_open(state: State, port_or_range: int | tuple[int, int] | list[int], cidr: str, iface: str | None = None,
               dst: str | None = None) -> str | None:
    """Evidence if an explicit active-firewall rule admits the port (or any port of a ``(lo, hi)`` range) from
    anywhere, else None.

    World-open: a NEW TCP packet from a TEST-NET documentation address outside ``cidr`` (203.0.113.7 /
    198.51.100.7 / 192.0.2.7, and 2001:db8::7 for ::/0) would be accepted by every active layer AND the decisive
    accept is an explicit rule (iptables / nft accept rule, firewalld port/service/rich rule/ACCEPT target), not a
    policy accept of a chain whose rules did not match, and not the absence of any firewall."""
    rs = ruleset(state)
    if isinstance(port_or_range, (list, tuple)):
        ports = sample_ports(rs, port_or_range[0], port_or_range[1])
    else:
        ports = [int(port_or_range)]
    try:
        net: ipaddress.IPv4Network | ipaddress.IPv6Network | None = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        net = None
    srcs = [s for s in TEST_NET_SOURCES if net is None or ipaddress.ip_address(s) not in net]
    v4 = [s for s in srcs if ":" not in s][:1]
    for src in v4 + [s for s in srcs if ":" in s]:
        for p in ports:
            r = evaluate(rs, src, p, iface=iface, dst=dst)
            if r.allowed and r.layer and r.explicit and r.decided:
                return f"{p}/tcp from {src} (outside {cidr}) accepted: {r.evidence}"
    return None
