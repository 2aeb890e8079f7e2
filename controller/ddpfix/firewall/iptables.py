"""iptables (``iptables-save`` text): the filter table's INPUT chain and the user chains it reaches, walked like the
kernel does."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpfix.firewall.verdict import (
    PROTO_NUM,
    Action,
    Alt,
    LayerResult,
    Packet,
    iface_match,
    in_net,
    in_ports,
    settle,
    tri_and,
    walk,
)

#: Targets that do not end the traversal (they log, mark, ... and go on with the next rule).
CONTINUE = frozenset({"LOG", "NFLOG", "ULOG", "AUDIT", "MARK", "CONNMARK", "CT", "TRACE",
                      "CLASSIFY", "SET", "TCPMSS", "CHECKSUM", "TEE", "SECMARK", "CONNSECMARK"})

_ALIASES = {"--source": "-s", "--src": "-s", "--destination": "-d", "--dst": "-d",
            "--in-interface": "-i", "--out-interface": "-o", "--protocol": "-p",
            "--jump": "-j", "--goto": "-g", "--match": "-m", "--fragment": "-f",
            "--destination-port": "--dport", "--source-port": "--sport",
            "--destination-ports": "--dports", "--source-ports": "--sports"}


@dataclass(frozen=True)
class Option:
    negated: bool
    name: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Rule:
    line: str  # as iptables-save prints it (counters stripped)
    options: tuple[Option, ...]
    target: str | None
    goto: bool


@dataclass
class Chain:
    policy: str = "-"  # "ACCEPT", "DROP", "-" (user chain)
    rules: list[Rule] = field(default_factory=list)


def parse_rule(line: str, toks: list[str]) -> Rule:
    """tokens after ``-A CHAIN`` -> the rule's match options, target and whether it is a goto."""
    opts: list[Option] = []
    target, goto, neg, i = None, False, False, 0
    while i < len(toks):
        t = toks[i]
        i += 1
        if t == "!":
            neg = True
            continue
        name = _ALIASES.get(t, t)
        args = []
        while i < len(toks) and toks[i] != "!" and not (toks[i].startswith("-") and len(toks[i]) > 1
                                                          and not toks[i][1:].isdigit()):
            args.append(toks[i])
            i += 1
        if name in ("-j", "-g"):
            target, goto = (args[0] if args else None), name == "-g"
            break  # the rest are target options (--reject-with, --log-prefix, ...)
        opts.append(Option(neg, name, tuple(args)))
        neg = False
    return Rule(line, tuple(opts), target, goto)


_QUOTING, _BLANKS = re.compile(r"[\"'\\]"), re.compile(r"[ \t\r\n]+")  # what shlex.split treats specially; its blanks


def parse(text: str | None, table: str = "filter") -> dict[str, Chain]:
    """iptables-save text -> {chain: Chain} for one table."""
    chains: dict[str, Chain] = {}
    on = False
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("*"):
            on = line[1:] == table
        elif not on or not line or line.startswith("#"):
            continue
        elif line == "COMMIT":
            on = False
        elif line.startswith(":"):
            parts = line[1:].split()
            if parts:
                chains[parts[0]] = Chain(parts[1] if len(parts) > 1 else "-")
        else:
            line = re.sub(r"^\[\d+:\d+\]\s*", "", line)
            try:  # shlex only where it differs from splitting at blanks (a quote, a backslash): 30x faster
                toks = shlex.split(line) if _QUOTING.search(line) else [t for t in _BLANKS.split(line) if t]
            except ValueError:
                toks = line.split()
            if len(toks) >= 2 and toks[0] in ("-A", "--append"):
                chains.setdefault(toks[1], Chain()).rules.append(parse_rule(line, toks[2:]))
    return chains


def _option(o: Option, pkt: Packet) -> bool | None:
    """Decide one match option: True/False/None (unknown)."""
    name, args = o.name, o.args
    a = args[0] if args else ""
    r: bool | None
    if name in ("-m", "--comment", "--limit-iface-in", "--log-prefix"):
        return True
    if name == "-s":
        r = in_net(pkt.src, a)
    elif name == "-d":
        if pkt.dst is None:
            return True if a.endswith("/0") else None
        r = in_net(pkt.dst, a)
    elif name == "-i":
        r = iface_match(a, pkt.iface) if not pkt.out else False  # a packet the node sends has no input interface
    elif name == "-o" and pkt.out:
        r = iface_match(a, pkt.iface)
    elif name == "-p":
        a = a.lower()
        r = a in ("all", "0") or a == pkt.proto or a == str(PROTO_NUM.get(pkt.proto))
    elif name == "--dport":
        r = in_ports(pkt.dport, a, ":")
    elif name in ("--dports", "--ports"):
        r = any(in_ports(pkt.dport, p, ":") for p in a.split(","))
        if name == "--ports" and not r:
            r = None  # could still match the (unknown) source port
    elif name == "--sport":
        # the dialer's source port is an unprivileged one (of its ephemeral range): a range of privileged ports
        # only never matches, any other is not known
        lo_s, sep, hi_s = a.partition(":")
        if not (lo_s.isdigit() or (sep and not lo_s)) or not (hi_s or "0").isdigit():
            return None
        if (int(hi_s) if hi_s else 65535 if sep else int(lo_s)) >= 1024:
            return None
        r = False
    elif name in ("--state", "--ctstate"):
        r = "NEW" in a.upper().split(",")
    elif name == "--ctstatus":
        r = False  # a fresh, non-DNATed connection has no status bits
    elif name == "--syn":
        r = pkt.proto == "tcp"
    elif name == "--tcp-flags" and len(args) == 2:
        every = {"SYN", "ACK", "FIN", "RST", "URG", "PSH"}
        sets = [every if x == "ALL" else set() if x == "NONE" else set(x.split(",")) for x in args]
        r = (sets[0] & {"SYN"}) == sets[1]
    elif name in ("--src-range", "--dst-range"):
        addr = pkt.src if name == "--src-range" else pkt.dst
        lo_s, _, hi_s = a.partition("-")
        try:
            lo, hi = ipaddress.ip_address(lo_s), ipaddress.ip_address(hi_s or lo_s)
        except ValueError:
            return None
        r = None if addr is None else lo.version == addr.version == hi.version and lo <= addr <= hi  # type: ignore[operator]
    elif name == "--dst-type":  # received: for a local address; sent: to a unicast peer
        r = ("UNICAST" if pkt.out else "LOCAL") in a.split(",")
    elif name == "--pkt-type":
        r = a == "unicast"
    elif name == "-f":
        r = False
    else:
        return None
    return None if r is None else r != o.negated


def is_active(chains: dict[str, Chain], base: str = "INPUT") -> bool:
    """Whether the filter table has an INPUT (`base`) chain that can refuse anything."""
    inp = chains.get(base)
    return inp is not None and (bool(inp.rules) or inp.policy not in ("ACCEPT", "-"))


#: The ways a rule whose target the evaluator does not model can go when it matches (NFQUEUE, TARPIT, ...): on to
#: the next rule, or a verdict either way.
UNMODELLED_TARGET: tuple[Alt, ...] = ((None, None), ("drop", None), ("accept", None))


def evaluate(chains: dict[str, Chain], pkt: Packet, label: str) -> LayerResult | None:
    """Walk filter INPUT (a packet the node sends, `Packet.out`: OUTPUT) like the kernel. -> the layer's result, or
    None (no filter table / nothing in that chain).

    A rule with a match the evaluator does not model (``-m set``, ``recent``, ``hashlimit``, ``string``, ``u32``,
    ``bpf``, ``connlimit``, ``limit``, source ports, ...) or an unknown target is undecided: both ways are walked,
    and when they end differently the rule is named in ``undecided``."""
    base = "OUTPUT" if pkt.out else "INPUT"
    if not is_active(chains, base):
        return None
    empty = Chain()

    def decide(chain: str, n: int, rule: Rule) -> tuple[Sequence[Alt], str]:
        m = tri_and([_option(o, pkt) for o in rule.options])
        ref = f"{label} filter {chain} #{n}: {rule.line}"
        target = rule.target
        if m is False:
            return (), ref
        if target in ("ACCEPT", "DROP", "REJECT", "RETURN"):
            alt: Alt = ({"ACCEPT": "accept", "DROP": "drop", "REJECT": "reject"}.get(target, "return"), None)  # type: ignore[assignment]
        elif target in chains:
            alt = ("goto" if rule.goto else "jump", target)
        elif not target or target in CONTINUE:
            return (), ref
        else:  # a target the evaluator does not model
            return UNMODELLED_TARGET, ref
        return ((alt,) if m else ((None, None), alt)), ref
    paths, complete = walk(base, lambda c: chains.get(c, empty).rules, decide)
    pol = chains[base].policy
    policy: Action = "drop" if pol == "DROP" else "reject" if pol == "REJECT" else "accept"
    nominal, undecided, others = settle(paths, complete, policy)
    notes = tuple(f"not evaluated (cannot change this verdict): {r}" for r in others)
    if nominal.verdict and nominal.evidence is not None:
        return LayerResult(label, nominal.verdict, True, nominal.evidence, notes, undecided)
    return LayerResult(label, policy, policy != "accept", f"{label} filter {base} policy {pol}", notes, undecided)


def port_marks(text: str | None) -> set[int]:
    """Port numbers that appear in a port match of the text."""
    marks: set[int] = set()
    for m in re.finditer(r"--(?:dports?|ports|destination-ports?)\s+(\S+)", text or ""):
        marks.update(int(x) for x in re.findall(r"\d+", m.group(1)))
    return marks
