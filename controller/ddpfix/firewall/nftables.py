"""nftables (``nft -j list ruleset``): the base chains of type filter on the prerouting and input hooks, by hook then
priority, each walked like the kernel does. The JSON stays as nft wrote it (its schema is nft's, see
libnftables-json(5)); it is indexed once per ruleset."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from ddpfix.firewall.verdict import (
    PROTO_NUM,
    Action,
    Alt,
    LayerResult,
    Packet,
    Step,
    iface_match,
    in_net,
    settle,
    walk,
)
from ddpfix.model.net import Address

#: Statements that do not end the rule (they count, log, set metadata, ... and the rule goes on).
CONTINUE = frozenset({"counter", "log", "meta", "ct", "mangle", "notrack", "set", "quota",
                      "dup", "comment", "synproxy", "continue"})
#: Statements that are conditions on traffic the dump cannot show: the rule goes on only while they hold.
CONDITIONAL = frozenset({"xt", "limit", "quota", "meter", "ct count"})
_HOOKS = {"prerouting": 0, "input": 1}
#: The hooks a packet the node sends passes (`Packet.out`), in order; chains of type route on output can drop too.
_OUT_HOOKS = {"output": 0, "postrouting": 1}
#: A counter's values in `nft list` text: they change with traffic, not with the rules (evidence shows `counter`).
COUNTERS = re.compile(r"counter packets \d+ bytes \d+")

Json = Any  # a value of nft's JSON output
Field = tuple[str, Any]  # (kind, the packet's value of it); kind "false": cannot apply, "?": unknown


@dataclass
class Table:
    family: str
    name: str
    chains: dict[str, dict[str, Json]] = field(default_factory=dict)
    rules: dict[str, list[dict[str, Json]]] = field(default_factory=dict)
    #: named sets and maps: their elements, or None when the dump cannot say (a dynamic set the packet path fills)
    sets: dict[str, list[Json] | None] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return self.family, self.name

    def is_iptables_nft(self) -> bool:
        """A table that iptables-nft created (its rules are counted by iptables-save already)."""
        if self.name != "filter" or self.family not in ("ip", "ip6"):
            return False
        return bool({"INPUT", "FORWARD", "OUTPUT"} & set(self.chains)) or any(
            isinstance(e, dict) and "xt" in e for rs in self.rules.values() for r in rs for e in r.get("expr") or [])


@dataclass
class Ruleset:
    tables: dict[tuple[str, str], Table]
    texts: dict[tuple[str, str, str, int], str]  # (family, table, chain, handle) -> `nft -a` rule text

    @classmethod
    def of(cls, nft: Json, text: str | None) -> Ruleset:
        return cls(index(nft), text_index(text))


def index(nft: Json) -> dict[tuple[str, str], Table]:
    """`nft -j list ruleset` -> {(family, table): Table}."""
    tables: dict[tuple[str, str], Table] = {}
    objs = nft.get("nftables") if isinstance(nft, dict) else None
    for obj in objs if isinstance(objs, list) else []:
        if not isinstance(obj, dict) or len(obj) != 1:
            continue
        kind, o = next(iter(obj.items()))
        if not isinstance(o, dict):
            continue
        if kind == "table" and "family" in o and "name" in o:
            key = (str(o["family"]), str(o["name"]))
            tables.setdefault(key, Table(*key))
        elif kind in ("chain", "rule", "set", "map") and "family" in o and "table" in o:
            key = (str(o["family"]), str(o["table"]))
            t = tables.setdefault(key, Table(*key))
            if kind == "chain" and "name" in o:
                t.chains[str(o["name"])] = o
            elif kind == "rule" and "chain" in o:
                t.rules.setdefault(str(o["chain"]), []).append(o)
            elif kind in ("set", "map") and "name" in o:
                flags = o.get("flags") or []
                flags = [flags] if isinstance(flags, str) else flags
                dynamic = isinstance(flags, list) and bool({"dynamic", "timeout"} & set(map(str, flags)))
                t.sets[str(o["name"])] = None if dynamic else list(o.get("elem") or [])
    return tables


def text_index(text: str | None) -> dict[tuple[str, str, str, int], str]:
    """`nft -a list ruleset` -> {(family, table, chain, handle): 'rule text'}."""
    out: dict[tuple[str, str, str, int], str] = {}
    table: tuple[str, str] | None = None
    chain: str | None = None
    for line in (text or "").splitlines():
        s = line.strip()
        m = re.match(r"table (\S+) (\S+) \{", s)
        if m:
            table, chain = (m.group(1), m.group(2)), None
            continue
        m = re.match(r"chain (\S+) \{", s)
        if m:
            chain = m.group(1).strip('"')
            continue
        if s == "}":
            chain = None
            continue
        m = re.match(r"(.*\S)\s+# handle (\d+)$", s)
        if m and table and chain:
            out[(table[0], table[1], chain, int(m.group(2)))] = COUNTERS.sub("counter", m.group(1))
    return out


def _left(left: Json, pkt: Packet) -> Field:
    """-> (kind, value) of the packet field; value None = unknown; kind 'false' = cannot apply."""
    if isinstance(left, dict) and isinstance(left.get("payload"), dict):
        p = left["payload"]
        proto, fld = p.get("protocol"), p.get("field")
        if proto in ("ip", "ip6"):
            if (proto == "ip") != (pkt.family == 4):
                return "false", None
            if fld == "saddr":
                return "addr", pkt.src
            if fld == "daddr":
                return "addr", pkt.dst
            if fld in ("protocol", "nexthdr"):
                return "proto", pkt.proto
            return "?", None
        if proto in ("ether", "vlan", "arp", "ll", "nh"):
            return "?", None
        if proto != "th" and proto != pkt.proto:
            return "false", None  # e.g. icmpv6 type / udp dport on a TCP packet
        return ("port", pkt.dport) if fld == "dport" else ("sport", None) if fld == "sport" else ("port", None)
    if isinstance(left, dict) and isinstance(left.get("meta"), dict):
        inner: Field = ("iface", pkt.iface) if not pkt.out else ("str", "")  # a sent packet has no input interface
        meta: dict[str, Field] = {
            "iifname": inner, "iif": inner, "l4proto": ("proto", pkt.proto),
            "protocol": ("str", "ip" if pkt.family == 4 else "ip6"), "nfproto": ("str", f"ipv{pkt.family}"),
            "pkttype": ("str", "host")}
        if pkt.out:
            meta.update({"oifname": ("iface", pkt.iface), "oif": ("iface", pkt.iface)})
        return meta.get(left["meta"].get("key"), ("?", None))
    if isinstance(left, dict) and isinstance(left.get("ct"), dict):  # a NEW, non-DNATed connection
        ct: dict[str, Field] = {"state": ("str", "new"), "status": ("flags", set()), "direction": ("str", "original")}
        return ct.get(left["ct"].get("key"), ("?", None))
    return "?", None


def _elems(right: Json, sets: dict[str, list[Json] | None]) -> list[Json] | None:
    """The elements on the right of a match; None: a named set whose elements are not known (missing, dynamic)."""
    if isinstance(right, str) and right.startswith("@"):
        named = sets.get(right[1:])
        if named is None:
            return None
        return [e["elem"]["val"] if isinstance(e, dict) and isinstance(e.get("elem"), dict) else e for e in named]
    if isinstance(right, dict) and "set" in right:
        return list(right["set"])
    if isinstance(right, list):
        return list(right)
    return [right]


def _elem_match(kind: str, val: Any, el: Json) -> bool | None:
    if isinstance(el, dict) and isinstance(el.get("elem"), dict):
        el = el["elem"].get("val")
    try:
        if kind == "addr":
            addr: Address = val
            if isinstance(el, dict) and isinstance(el.get("prefix"), dict):
                return in_net(addr, "{}/{}".format(el["prefix"]["addr"], el["prefix"]["len"]))
            if isinstance(el, dict) and isinstance(el.get("range"), list):
                lo, hi = (ipaddress.ip_address(str(x)) for x in el["range"])
                return lo.version == addr.version == hi.version and lo <= addr <= hi  # type: ignore[operator]
            return in_net(addr, el) if isinstance(el, str) else None
        if kind == "port":
            if isinstance(el, dict) and isinstance(el.get("range"), list):
                return bool(int(el["range"][0]) <= val <= int(el["range"][1]))
            return bool(val == int(el))
    except (TypeError, ValueError, KeyError):
        return None
    if kind == "proto":
        num = PROTO_NUM.get(val)
        return el in (val, num) or str(el) == str(num)
    if kind == "iface":
        return iface_match(el, val, "*") if isinstance(el, str) else None
    if kind == "flags":
        return el in val if isinstance(el, str) else None
    return el == val if isinstance(el, (str, int)) else None


def _privileged_only(elems: list[Json] | None) -> bool:
    """Whether every element is a port (or range of ports) below 1024."""
    def low(e: Json) -> bool:
        if isinstance(e, dict) and isinstance(e.get("range"), list) and len(e["range"]) == 2:
            return all(isinstance(x, int) and 0 <= x < 1024 for x in e["range"])
        return isinstance(e, int) and not isinstance(e, bool) and 0 <= e < 1024
    return bool(elems) and all(low(e) for e in elems or [])


def _match(m: dict[str, Json], pkt: Packet, sets: dict[str, list[Json] | None]) -> bool | None:
    kind, val = _left(m.get("left"), pkt)
    if kind == "false":
        return False
    if kind == "sport":  # the dialer's source port is an unprivileged one (of its ephemeral range)
        sop = str(m.get("op", "=="))
        if sop in ("==", "!=", "in") and _privileged_only(_elems(m.get("right"), sets)):
            return sop == "!="
        return None
    if (val is None and kind != "iface") or kind == "?":
        return None
    op: Json = m.get("op", "==")
    right: Json = m.get("right")
    if op in ("<", ">", "<=", ">="):
        if not isinstance(val, int):  # an unknown interface, a string field
            return None
        try:
            r, v = int(right), val
        except (TypeError, ValueError):
            return None
        return {"<": v < r, ">": v > r, "<=": v <= r, ">=": v >= r}[op]
    if op not in ("==", "!=", "in"):
        return None
    elems = _elems(right, sets)
    if elems is None:
        return None
    res = [_elem_match(kind, val, e) for e in elems]
    hit = True if True in res else (None if None in res else False)
    if hit is None:
        return None
    return hit if op != "!=" else not hit


def _verdict(e: Json) -> tuple[str, str | None] | None:
    """A verdict statement -> (accept|drop|reject|return|queue|jump|goto, jump target)."""
    if not isinstance(e, dict):
        return None
    for k in ("accept", "drop", "reject", "return", "queue"):
        if k in e:
            return k, None
    for k in ("jump", "goto"):
        if k in e and isinstance(e[k], dict):
            return k, str(e[k].get("target"))
    return None


_STEPS: dict[str, Step] = {"accept": "accept", "drop": "drop", "reject": "reject", "return": "return",
                           "jump": "jump", "goto": "goto"}
#: A verdict the evaluator cannot follow (queue: userspace decides): on to the next rule, or a verdict either way.
UNMODELLED: tuple[tuple[str, str | None], ...] = (("nomatch", None), ("drop", None), ("accept", None))
Outcome = tuple[str, str | None]  # ("nomatch" | "queue" | a Step, jump target)


def _rule(rule: dict[str, Json], pkt: Packet, sets: dict[str, list[Json] | None]) -> tuple[Outcome, ...]:
    """-> the ways the rule can go, the nominal one (no undecided expression matches) first: one when the
    evaluator decided the rule, more when an expression it does not model (an unknown set, `xt`, `limit`, `meta
    mark`, `fib`, ...) stands before the verdict. Statements before the verdict are ignored."""
    unknown = False

    def ways(*found: Outcome) -> tuple[Outcome, ...]:
        out: list[Outcome] = [("nomatch", None)] if unknown else []
        for v in found:
            out.extend(UNMODELLED[1:] if v[0] == "queue" else [v])
        if not unknown and found and found[0][0] == "queue":
            out.insert(0, ("nomatch", None))
        return tuple(dict.fromkeys(out)) or (("nomatch", None),)

    for e in rule.get("expr") or []:
        if not isinstance(e, dict) or not e:
            continue
        k = next(iter(e))
        if k == "match" and isinstance(e["match"], dict):
            r = _match(e["match"], pkt, sets)
            if r is False:
                return (("nomatch", None),)
            unknown = unknown or r is None
        elif k == "vmap" and isinstance(e["vmap"], dict):
            kind, val = _left(e["vmap"].get("key"), pkt)
            if kind == "false":
                return (("nomatch", None),)
            data = e["vmap"].get("data")
            pairs = _elems(data, sets) if not isinstance(data, dict) else data.get("set", [])
            if pairs is None:  # a map the dump cannot resolve: any of its verdicts, or none
                unknown = True
                return ways(*UNMODELLED[1:])
            hit: Outcome | None = None
            maybe: list[Outcome] = []
            for pair in pairs:
                if isinstance(pair, list) and len(pair) == 2:
                    m = _elem_match(kind, val, pair[0]) if kind != "?" else None
                    way: Outcome = _verdict(pair[1]) or ("queue", None)
                    if m is None:
                        maybe.append(way)
                    elif m and hit is None:
                        hit = way
            if maybe and hit is None:
                unknown = True  # the key may hit one of these, or none
                return ways(*maybe)
            return ways(hit) if hit else (("nomatch", None),)
        elif (v := _verdict(e)) is not None:
            return ways(v)
        elif k in CONDITIONAL or k not in CONTINUE or (k in ("set", "map") and isinstance(e[k], dict)
                                                       and e[k].get("stmt")):
            # a rate/quota/connection-count condition (`limit rate over`, `quota`, a meter, `add @s { ip saddr
            # limit rate over N }`): whether it lets the rule go on depends on traffic the dump cannot show
            unknown = True
    return (("nomatch", None),)


def _render(rule: dict[str, Json]) -> str:
    """Fallback evidence when `nft -a list ruleset` text is missing: the rule's JSON."""
    return json.dumps([e for e in rule.get("expr") or [] if not (isinstance(e, dict) and "counter" in e)],
                      sort_keys=True)


#: One base chain's fate of a packet: ((family, table), chain, verdict, evidence, by a rule (not the policy),
#: the undecided rules that could turn it).
ChainVerdict = tuple[tuple[str, str], str, Action, str, bool, tuple[str, ...]]


def _base_chains(rs: Ruleset, pkt: Packet, skip: Callable[[Table], bool]) -> list[tuple[tuple[str, str], str]]:
    """The base chains the packet passes, in order (hook, then priority): filter chains on prerouting/input (a packet
    the node sends: output/postrouting, route chains on output too) of the packet's families; tables `skip` names
    are left out. Empty when none of them can refuse."""
    tables = rs.tables
    fams = ("ip", "inet") if pkt.family == 4 else ("ip6", "inet")
    bases: list[tuple[int, int, tuple[str, str], str]] = []
    hooks, types = (_OUT_HOOKS, ("filter", "route")) if pkt.out else (_HOOKS, ("filter",))
    for key, t in sorted(tables.items()):
        if key[0] not in fams or skip(t):
            continue
        for c in t.chains.values():
            if c.get("hook") in hooks and c.get("type", "filter") in types:
                try:
                    prio = int(c.get("prio", 0))
                except (TypeError, ValueError):
                    prio = 0
                bases.append((hooks[c["hook"]], prio, key, str(c.get("name"))))
    bases.sort()
    if all(not tables[k].rules.get(n) and tables[k].chains[n].get("policy", "accept") == "accept"
           for _, _, k, n in bases):
        return []
    return [(k, n) for _, _, k, n in bases]


def chain_verdicts(rs: Ruleset, pkt: Packet, skip: Callable[[Table], bool],
                   notes: list[str]) -> list[ChainVerdict]:
    """Each base chain the packet passes (`_base_chains`), walked like the kernel does (jumps, gotos, returns), and
    its verdict; what cannot change a verdict goes to `notes`."""
    tables = rs.tables
    out: list[ChainVerdict] = []
    for key, base in _base_chains(rs, pkt, skip):
        t, label = tables[key], "nft {} {}".format(*key)

        def decide(chain: str, n: int, rule: dict[str, Json], t: Table = t,
                   label: str = label) -> tuple[list[Alt], str]:
            handle = rule.get("handle")
            txt = rs.texts.get((t.family, t.name, chain, handle if isinstance(handle, int) else -1)) or _render(rule)
            ref = f"{label} {chain}: {txt}"
            alts: list[Alt] = []
            for v, target in _rule(rule, pkt, t.sets):
                if v in ("jump", "goto") and target not in t.chains:
                    notes.append("jump to unknown chain, ignored: " + ref)
                    alts.append((None, None))
                else:
                    alts.append((_STEPS.get(v), target))
            return ([] if alts == [(None, None)] else alts), ref

        def rules_of(chain: str, t: Table = t) -> list[dict[str, Json]]:
            return t.rules.get(chain, [])
        paths, complete = walk(base, rules_of, decide)
        pol = t.chains[base].get("policy", "accept")
        policy: Action = "accept" if pol == "accept" else "drop"  # nft knows no other policy: never read as a pass
        nominal, undecided, others = settle(paths, complete, policy)
        notes.extend(f"not evaluated (cannot change this verdict): {r}" for r in others)
        verdict, ref = nominal.verdict, nominal.evidence
        by_rule = verdict is not None and ref is not None
        if verdict is None or ref is None:
            verdict, ref = policy, f"{label} {base} policy {pol}"
        out.append((key, base, verdict, ref, by_rule, undecided))
    return out


def evaluate(rs: Ruleset, pkt: Packet, skip_firewalld: bool,
             skip_ipt_families: Collection[str | None]) -> LayerResult | None:
    """Every base filter chain on prerouting/input (a packet the node sends, `Packet.out`: output/postrouting, route
    chains on output too) of the packet's families must accept.

    ``skip_firewalld``: firewalld's own tables are evaluated through its zone model; ``skip_ipt_families``: families
    whose iptables-nft tables were already evaluated from iptables-save. -> None when no base chain can refuse."""
    def skip(t: Table) -> bool:
        return (skip_firewalld and t.name == "firewalld") or (t.family in skip_ipt_families and t.is_iptables_nft())
    notes: list[str] = []
    return _settle_layer(chain_verdicts(rs, pkt, skip, notes), notes)


def evaluate_without(rs: Ruleset, pkt: Packet, skip_tables: Collection[tuple[str, str]]) -> LayerResult | None:
    """`evaluate` with the tables `skip_tables` names left out (those other backends own)."""
    notes: list[str] = []
    return _settle_layer(chain_verdicts(rs, pkt, lambda t: t.key in skip_tables, notes), notes)


def _settle_layer(chains: list[ChainVerdict], notes: list[str]) -> LayerResult | None:
    """The layer's verdict from its base chains': the first refusal, else the first explicit accept."""
    if not chains:
        return None
    explicit: str | None = None
    last: str | None = None
    # (verdict, evidence, undecided, (family, table, base chain)) of each refusing chain
    denied: list[tuple[Action, str, tuple[str, ...], tuple[str, str, str]]] = []
    may_deny: list[str] = []  # undecided rules of accepting chains
    for key, base, verdict, ref, by_rule, undecided in chains:
        if verdict != "accept":
            denied.append((verdict, ref, undecided, (key[0], key[1], base)))
        elif by_rule:
            explicit = explicit or ref
            may_deny.extend(undecided)
        else:
            last = last or ref
            may_deny.extend(undecided)
    if denied:
        d_verdict, ref, _, where = denied[0]
        if all(u for _, _, u, _ in denied):  # every refusing chain could accept after all: undecided
            flip = tuple(dict.fromkeys(r for _, _, u, _ in denied for r in u))
        else:
            flip = ()
            notes.extend(f"not evaluated (cannot change this verdict): {r}" for _, _, u, _ in denied for r in u)
        notes.extend(f"not evaluated (cannot change this verdict): {r}" for r in may_deny)
        d: Action = "reject" if d_verdict == "reject" else "drop"
        return LayerResult("nftables", d, True, ref, tuple(dict.fromkeys(notes)), flip, where)
    return LayerResult("nftables", "accept", bool(explicit), explicit or last or "", tuple(dict.fromkeys(notes)),
                       tuple(dict.fromkeys(may_deny)))


def refusing_input_chains(rs: Ruleset, packets: Iterable[Packet],
                          skip_tables: Collection[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(family, table, chain) of the ip/inet base chains on the input hook that refuse one of `packets`, or could (a
    rule the evaluator does not model could drop it), as `evaluate` walks them: where an accept at the top lets those
    packets in. Tables in `skip_tables` (firewalld's, iptables-nft's: their own backends change them) are left out."""
    out: dict[tuple[str, str, str], None] = {}
    for pkt in packets:
        for key, base, verdict, _ref, _by_rule, undecided in chain_verdicts(
                rs, pkt, lambda t: t.key in skip_tables, []):
            if rs.tables[key].chains[base].get("hook") == "input" and (verdict != "accept" or undecided):
                out.setdefault((key[0], key[1], base))
    return list(out)


def with_rules_first(nft: Json, rules: Iterable[dict[str, Json]]) -> Json:
    """A copy of `nft -j` output with each `{"rule": {family, table, chain, ...}}` first in its chain (as `nft insert
    rule` puts it)."""
    out = copy.deepcopy(nft) if isinstance(nft, dict) else {"nftables": []}
    items = out.setdefault("nftables", [])
    for rule in rules:
        where = tuple(rule["rule"].get(k) for k in ("family", "table", "chain"))
        at = next((i for i, o in enumerate(items) if isinstance(o, dict) and isinstance(o.get("rule"), dict)
                   and tuple(o["rule"].get(k) for k in ("family", "table", "chain")) == where), len(items))
        items.insert(at, rule)
    return out


def port_marks(nft: Json) -> set[int]:
    """Ints on the right of a "... dport" match anywhere in the nft JSON."""
    marks: set[int] = set()

    def visit(o: Json, in_port: bool) -> None:
        if isinstance(o, dict) and isinstance(o.get("match"), dict):
            visit(o["match"].get("right"), '"dport"' in json.dumps(o["match"].get("left")))
        elif isinstance(o, (dict, list)):
            for v in (o.values() if isinstance(o, dict) else o):
                visit(v, in_port)
        elif in_port and isinstance(o, int) and not isinstance(o, bool):
            marks.add(o)
    visit(nft, False)
    return marks
