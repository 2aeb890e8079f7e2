"""Host firewalls: whether each node's rule sets (``ddpfix.firewall`` evaluates them) let the training ports in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpfix import firewall
from ddpfix.firewall.verdict import LOOP, Packet
from ddpfix.model.finding import Explains, Finding, Severity
from ddpfix.rules.context import SRC_IFACES, Context, past
from ddpfix.rules.probes import MASTER_PORT_UNREACHABLE, PEER_UNREACHABLE, probe_not_evaluated
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import FIREWALL

E, W = Severity.ERROR, Severity.WARNING


#: The firewall layers the node's collector reads (its `unread` sources, see the ddpfix_firewall module_utils).
FIREWALL_SOURCES = frozenset({"firewalld", "iptables", "ip6tables", "iptables-legacy", "nft", "netfilter"})
#: The source a node's firewall analysis past its time budget is listed under (its checks: not evaluated).
BUDGET_SOURCE = "netfilter"
#: The source a node's egress analysis is listed under when it could not decide it (undecided rules, its budget).
EGRESS_SOURCE = "egress"


def active_firewalls(fw: Mapping[str, Any]) -> list[str]:
    """Firewall layers that hold rules (`nft -j` always answers, an empty ruleset is no firewall)."""
    out = []
    if fw.get("firewalld"):
        out.append("firewalld")
    if (fw.get("iptables") or "").strip() or (fw.get("iptables_legacy") or "").strip():
        out.append("iptables")
    if any("table" in x for x in (fw.get("nft") or {}).get("nftables") or []):
        out.append("nft")
    return out


def ufw_managed(fw: Mapping[str, Any], variant: str = "") -> bool:
    """Whether ufw loaded the node's iptables rules (INPUT jumps to its `ufw-before-input` chain) in the tables of
    `variant` (`iptables`: the nft variant, `iptables-legacy`; "": either): its chains are rewritten from /etc/ufw at
    every `ufw reload` and boot, so the fix is ufw's own rule (`ufw allow from CIDR`), never an iptables line."""
    keys = {"iptables": ("iptables",), "iptables-legacy": ("iptables_legacy",)}.get(variant,
                                                                                   ("iptables", "iptables_legacy"))
    return any("-A INPUT -j ufw-before-input" in (fw.get(k) or "") for k in keys)


#: What a block in ufw's chains adds to its evidence: the owner, and the rule remediate adds through it.
UFW_OWNER = ("; these are ufw's chains (INPUT -> ufw-before-input -> ufw-user-input, loaded from /etc/ufw): "
             "ddpfix remediate adds `ufw allow from {cidr}` through ufw, first of its rules, kept in "
             "/etc/ufw/user.rules")


# ---------------------------------------------------------------- firewall


class _FirewallMemo:
    """The firewall evaluator: one parsed rule set per distinct content and each answer memoised (clusters usually
    share one configuration: 2,000 nodes are then parsed and evaluated once)."""

    def __init__(self) -> None:
        self.rulesets = firewall.Rulesets()
        self.evaluated: dict[tuple[int, str, int, str | None, str | None], firewall.Verdict] = {}
        self.samples: dict[tuple[int, int, int, int], list[int]] = {}
        self.open: dict[tuple[int, int | tuple[int, int], str, str | None, str | None], str | None] = {}

    def ruleset(self, state: Mapping[str, Any]) -> tuple[int, firewall.Ruleset]:
        return self.rulesets.get(state)

    def evaluate(self, key: int, rs: firewall.Ruleset, src: str, port: int, iface: str | None,
                 dst: str | None = None) -> firewall.Verdict:
        k = (key, src, port, iface, dst)
        v = self.evaluated.get(k)
        if v is None:
            v = self.evaluated[k] = firewall.evaluate(rs, src, port, iface=iface, dst=dst)
        return v

    def sample_ports(self, key: int, rs: firewall.Ruleset, lo: int, hi: int, n: int) -> list[int]:
        k = (key, lo, hi, n)
        if k not in self.samples:
            self.samples[k] = firewall.sample_ports(rs, lo, hi, n)
        return self.samples[k]

    def world_open(
        self, key: int, rs: firewall.Ruleset, port: int | tuple[int, int], cidr: str, iface: str | None,
        dst: str | None = None,
    ) -> str | None:
        k = (key, port, cidr, iface, dst)
        if k not in self.open:
            self.open[k] = firewall.world_open(rs, port, cidr, iface=iface, dst=dst)
        return self.open[k]


#: A finding without its host: (id, summary, evidence, details).
_Outcome = tuple[str, str, str, dict[str, Any]]


@rules(
    MASTER_PORT_BLOCKED := Rule(
        "firewall.master-port-blocked",
        E,
        "firewalld/iptables/nftables on the master drops/rejects TCP to the master port from the cluster CIDR",
        "Allow TCP from {cidr} to port {port} on the master (ddpfix remediate adds {cidr} as a trusted source / an "
        "ACCEPT rule).",
        remedies=(FIREWALL,),
        reads=FIREWALL_SOURCES | SRC_IFACES,
        master_only=True,
        sound_on_partial=True,
        explains=(Explains(MASTER_PORT_UNREACHABLE.id, "master"),),
    ),
    PEER_PORTS_BLOCKED := Rule(
        "firewall.peer-ports-blocked",
        E,
        "a node's firewall blocks TCP from peers on the ephemeral range NCCL/Gloo use",
        "Allow TCP from {cidr} to the ephemeral range {range} (ddpfix remediate trusts {cidr} on this node).",
        remedies=(FIREWALL,),
        reads=FIREWALL_SOURCES | SRC_IFACES,
        sound_on_partial=True,
        explains=(Explains(PEER_UNREACHABLE.id, "target"),),
    ),
    WORLD_OPEN := Rule(
        "firewall.world-open",
        W,
        "the master port or ephemeral range is open to any source by an explicit rule",
        "Replace the rule with one limited to source {cidr}; "
        "ddpfix adds the CIDR-limited rule but never removes yours.",
        reads=FIREWALL_SOURCES | SRC_IFACES,
        manual="ddpfix only adds CIDR rules",
    ),
    UNDECIDED := Rule(
        "firewall.undecided",
        E,
        "a rule ddpfix does not model (ipset, `recent`, `hashlimit`, `limit`, `string`, `u32`, `bpf`, `connlimit`, "
        "marks, an nft set or expression it cannot resolve, a queue target) stands before the rule accepting TCP from "
        "peers to the master port / ephemeral range and could drop it: not evaluated, never a pass (probes decide)",
        "Check by hand whether the rule named in the evidence matches TCP from {cidr} to {ports} on {node}; accept "
        "{cidr} explicitly before it if the cluster must pass; `ddpfix audit` with probes (the default) decides by "
        "connecting.",
        manual="ddpfix cannot tell what the rule does",
    ),
    UNDECIDED_ACCEPT := Rule(
        "firewall.undecided-accept",
        W,
        "TCP from peers to the master port / ephemeral range is refused unless a rule ddpfix does not model (e.g. "
        "an ipset match) accepts it: not evaluated, never a pass (probes decide)",
        "Make sure the rule named in the evidence matches TCP from every node of {cidr} to {ports} on {node} (e.g. "
        "the ipset holds every node's address), or accept {cidr} explicitly; `ddpfix audit` with probes (the "
        "default) decides by connecting.",
        manual="ddpfix cannot tell what the rule does",
    ),
)
def check_firewall(ctx: Context) -> Iterable[Finding]:
    memo = _FirewallMemo()
    # peer sources evaluated on each node: the first few cluster addresses (the node's own is skipped)
    candidates = [a for name, _ in ctx.audited() if (a := ctx.plan[name].address)]
    candidates = candidates[: ctx.thresholds.max_sources + 1]
    # nodes with the same rule set, interface, sources, port range and role get the same answers: asked once
    outcomes: dict[tuple[Any, ...], list[_Outcome] | str] = {}  # str: why not evaluated
    for name, f in ctx.audited():
        try:  # the node's whole firewall analysis, bounded in time: past it, not evaluated (never a pass)
            with firewall.budget(ctx.thresholds.firewall_budget_s):
                found = list(_node_firewall(ctx, memo, outcomes, candidates, name, f))
        except firewall.BudgetExceeded as exc:
            ctx.unanalysed.setdefault(name, {})[BUDGET_SOURCE] = (
                f"the firewall analysis ran past its budget of {ctx.thresholds.firewall_budget_s:g} s ({exc})")
            continue
        yield from found


def _node_firewall(ctx: Context, memo: _FirewallMemo, outcomes: dict[tuple[Any, ...], list[_Outcome] | str],
                   candidates: list[str], name: str, f: Mapping[str, Any]) -> Iterable[Finding]:
    """The firewall findings of node `name` (its rule set parsed, its packets evaluated, probes consulted); raises
    `firewall.BudgetExceeded` past the enclosing budget, and again for any node with the same answers."""
    skey, rs = memo.ruleset(f.get("firewall") or {})
    cl: Mapping[str, Any] = f.get("cluster") or {}
    iface = cl.get("ifname")
    own = ctx.plan[name].address
    dst = own if rs.uses_dst else None  # the packet's destination matters only to rules that match on it
    sources = [a for a in candidates if a != own][: ctx.thresholds.max_sources] or ([own] if own else [])
    sysctl: Mapping[str, Any] = f.get("sysctl") or {}
    lo, hi = sysctl.get("ip_local_port_range", [32768, 60999])
    master = name == ctx.cluster.master
    key = (skey, iface, tuple(sources), int(lo), int(hi), master, dst)
    if key not in outcomes:
        try:
            outcomes[key] = list(
                _firewall_outcomes(ctx, memo, skey, rs, iface, sources, (int(lo), int(hi)), master, dst)
            )
        except firewall.BudgetExceeded as exc:
            outcomes[key] = str(exc)
            raise
    done = outcomes[key]
    if isinstance(done, str):
        raise firewall.BudgetExceeded(done)
    ufw = ufw_managed(f.get("firewall") or {})
    for out in done:
        fid, summary, evidence, details = _probe_decides(ctx, memo, skey, rs, name, iface, dst, out)
        if ufw and fid in _BLOCKED.values() and str(details.get("layer", "")).startswith("iptables"):
            evidence += UFW_OWNER.format(cidr=ctx.cidr)
        if fid:
            yield finding(fid, name, summary, evidence, **{k: v for k, v in details.items() if k != "_pairs"})


#: The undecided findings and the check each stands for (listed per host as not evaluated, never as a pass).
UNDECIDED_IDS = frozenset({UNDECIDED.id, UNDECIDED_ACCEPT.id})
_BLOCKED = {True: "firewall.master-port-blocked", False: "firewall.peer-ports-blocked"}


def _undecided(v: firewall.Verdict, src: str, what: str, details: dict[str, Any],
               pairs: list[tuple[str, int, firewall.Verdict]]) -> _Outcome:
    """The finding of an undecided verdict: which way it goes if no undecided rule matches, and the rules."""
    rules_ = "; ".join(v.undecided[:3]) + (f"; ... ({len(v.undecided)} rules)" if len(v.undecided) > 3 else "")
    if v.allowed:
        fid, how = "firewall.undecided", "could be dropped/rejected by a rule ddpfix does not model"
        ev = f"not modelled, stands before the accepting rule: {rules_}; if it does not match: accepted by {v.evidence}"
    else:
        fid, how = "firewall.undecided-accept", f"is {past(v.verdict)} unless a rule ddpfix does not model accepts it"
        ev = f"not modelled, the only rule that could accept it: {rules_}; if it does not match: {v.evidence}"
    return fid, f"TCP {src} -> {what} {how} (not evaluated)", ev, {**details, "rule": v.undecided[0], "_pairs": pairs}


def _firewall_outcomes(
    ctx: Context,
    memo: _FirewallMemo,
    skey: int,
    rs: firewall.Ruleset,
    iface: str | None,
    sources: list[str],
    ephemeral: tuple[int, int],
    master: bool,
    dst: str | None = None,
) -> Iterable[_Outcome]:
    """The firewall findings of one node, without its host. A decided block is reported as blocked; else an
    undecided verdict (for any source) is reported as undecided, naming every (source, port) it holds for so that a
    probe can decide (see `_probe_decides`)."""
    lo, hi = ephemeral
    port = ctx.cluster.master_port
    if master:
        pairs: list[tuple[str, int, firewall.Verdict]] = []
        blocked: tuple[str, int, firewall.Verdict] | None = None
        for src in sources:
            v = memo.evaluate(skey, rs, src, port, iface, dst)
            if not v.decided:
                pairs.append((src, port, v))
            elif not v.allowed:
                blocked = (src, port, v)
                break
        details = {"cidr": ctx.cidr, "port": port, "ports": f"port {port}", "check": _BLOCKED[True]}
        if blocked:
            src, _, v = blocked
            yield (
                "firewall.master-port-blocked",
                f"TCP {src} -> {port} would be {past(v.verdict)} by {v.layer}",
                v.evidence,
                {"cidr": ctx.cidr, "port": port, "layer": v.layer},
            )
        elif pairs:
            yield _undecided(pairs[0][2], pairs[0][0], f"{port}", {**details, "layer": pairs[0][2].layer}, pairs)
        open_ev = memo.world_open(skey, rs, port, ctx.cidr, iface, dst) if ctx.cidr else None
        if open_ev:
            yield "firewall.world-open", f"master port {port} is open to any source", open_ev, {"cidr": ctx.cidr}
    peer_blocked = None
    upairs: list[tuple[str, int, firewall.Verdict]] = []
    for src in sources:
        first_undecided = None
        for p in memo.sample_ports(skey, rs, lo, hi, ctx.thresholds.peer_port_samples):
            v = memo.evaluate(skey, rs, src, p, iface, dst)
            if not v.decided:
                first_undecided = first_undecided or (src, p, v)
            elif not v.allowed:
                peer_blocked = (src, p, v)
                break
        if peer_blocked:
            break
        if first_undecided:
            upairs.append(first_undecided)
    if peer_blocked:
        src, p, v = peer_blocked
        yield (
            "firewall.peer-ports-blocked",
            f"TCP {src} -> ephemeral port {p} (range {lo}-{hi}) would be {past(v.verdict)} by {v.layer}",
            v.evidence,
            {"cidr": ctx.cidr, "range": f"{lo}-{hi}", "layer": v.layer},
        )
    elif upairs:
        src, p, v = upairs[0]
        details = {"cidr": ctx.cidr, "range": f"{lo}-{hi}", "ports": f"the ephemeral range {lo}-{hi}",
                   "layer": v.layer, "check": _BLOCKED[False]}
        yield _undecided(v, src, f"ephemeral port {p} (range {lo}-{hi})", details, upairs)
    open_ev = memo.world_open(skey, rs, (lo, hi), ctx.cidr, iface, dst) if ctx.cidr else None
    if open_ev:
        yield "firewall.world-open", f"ephemeral range {lo}-{hi} is open to any source", open_ev, {"cidr": ctx.cidr}


def _probe_decides(
    ctx: Context,
    memo: _FirewallMemo,
    skey: int,
    rs: firewall.Ruleset,
    name: str,
    iface: str | None,
    dst: str | None,
    out: _Outcome,
) -> _Outcome:
    """An undecided outcome on node `name`, decided by the probes where they ran: every (source, port) it holds for
    connected -> no finding (id ""); one failed -> the blocked finding, with the probe's error as evidence; none
    probed -> the undecided finding as it is, with the host to fill its fix. A peer's probe port stands for the
    sampled ephemeral port when the same undecided rules decide both."""
    fid, summary, evidence, details = out
    if fid not in UNDECIDED_IDS:
        return out
    details = {**details, "node": name}
    if any(LOOP in u for _, _, v in details.get("_pairs") or [] for u in v.undecided):
        return fid, summary, evidence, details  # rules as read that no kernel holds: no probe of one port decides
    master = details.get("check") == _BLOCKED[True]
    connected: list[str] = []
    for src, port, v in details.get("_pairs") or []:
        dialer = ctx.by_address.get(src)
        probe = (ctx.hosts[dialer].probe or {}) if dialer in ctx.hosts else {}
        for c in probe.get("connects") or []:
            if c.get("name") != name or c.get("kind") != ("master" if master else "peer"):
                continue
            try:
                cport = int(str(c.get("port")))
            except (TypeError, ValueError):
                continue
            if cport != port and memo.evaluate(skey, rs, src, cport, iface, dst).undecided != v.undecided:
                continue  # the probe tested a port these rules do not decide alike
            what = f"the probe from {dialer} ({src}) to {name}:{cport}"
            if c.get("ok"):
                connected.append(f"{what} connected")
            elif not probe_not_evaluated(ctx, c):
                ev = f"{what} failed: {c.get('error')} (the rules could not decide: {evidence})"
                blocked_summary = f"TCP {src} -> {cport} failed although the rules could not decide (probe)"
                keep = {"cidr": ctx.cidr, "layer": details.get("layer")}
                keep.update({"port": cport} if master else {"range": details.get("range")})
                return details["check"], blocked_summary, ev, keep
            break
        else:
            return fid, summary, evidence, details  # not probed from this source: still undecided
    if connected and len(connected) == len(details.get("_pairs") or []):
        return "", "", "", {}  # the probes decided: accepted
    return fid, summary, evidence, details


# ---------------------------------------------------------------- egress (the sending node's own firewall)


@rules(
    EGRESS_BLOCKED := Rule(
        "firewall.egress-blocked",
        E,
        "a node's own firewall (a firewalld policy from HOST or direct OUTPUT rule, an nftables output-hook chain, "
        "iptables OUTPUT in either backend) refuses the connects it makes to its peers' master port / ephemeral range",
        "Let {node} send to {cidr}: ddpfix remediate adds an accept for destination {cidr} where it is refused "
        "({where}): a firewalld policy gets `rule family=\"ipv4\" destination address=\"{cidr}\" accept`, an nft "
        "output chain / iptables OUTPUT an accept of TCP to {cidr} on the master port and ephemeral range, ahead of "
        "the drop; a direct rule or a chain ddpfix does not own is not changed (the refusal names it and the command).",
        remedies=(FIREWALL,),
        reads=FIREWALL_SOURCES | SRC_IFACES | {EGRESS_SOURCE},
        sound_on_partial=True,
        explains=(Explains(MASTER_PORT_UNREACHABLE.id, "dialler"), Explains(PEER_UNREACHABLE.id, "dialler")),
    ),
)
def check_egress(ctx: Context) -> Iterable[Finding]:
    """Each node's own firewall (firewalld's policies from HOST and direct OUTPUT rules, nftables output-hook chains
    of every table, family and priority, iptables OUTPUT of both backends), by the same evaluator as the ingress
    check, for a connect from the node's cluster address to each peer's (bounded like the ingress check) on the
    master port (to the master) and the ends and middle of the ephemeral range. Bounded in time like the ingress
    check; a rule the evaluator does not model that could turn the verdict makes the check not evaluated on that
    node (never a pass, never a block)."""
    memo = _FirewallMemo()
    addrs = [(n, a) for n, _ in ctx.audited() if (a := ctx.plan[n].address)][: ctx.thresholds.max_sources + 1]
    for name, f in ctx.audited():
        state = f.get("firewall") or {}
        own = ctx.plan[name].address
        if not own or not isinstance(state, Mapping) or not active_firewalls(state):
            continue
        try:
            with firewall.budget(ctx.thresholds.firewall_budget_s):
                hit, undecided = egress_verdicts(ctx, memo, name, f, addrs)
        except firewall.BudgetExceeded as exc:
            ctx.unanalysed.setdefault(name, {})[EGRESS_SOURCE] = (
                f"the egress firewall analysis ran past its budget of {ctx.thresholds.firewall_budget_s:g} s ({exc})")
            continue
        if hit:
            peer, dst, port, v = hit
            where = egress_where(v)
            yield finding(EGRESS_BLOCKED.id, name, f"TCP {own} -> {dst}:{port} ({peer}) would be "
                          f"{past(v.verdict)} by this node's own {v.layer} ({where})", v.evidence,
                          node=name, cidr=ctx.cidr, where=where, layer=v.layer or "")
        elif undecided and not _probes_connected(ctx, name):
            peer, dst, port, v = undecided
            ctx.unanalysed.setdefault(name, {})[EGRESS_SOURCE] = (
                f"undecided: TCP {own} -> {dst}:{port} ({peer}) meets a rule ddpfix does not model: {v.undecided[0]}")


def _probes_connected(ctx: Context, name: str) -> bool:
    """Whether node `name`'s own probe connected to every peer it tried (then its egress lets them out: the probes
    decide what the rules could not)."""
    connects = list((ctx.hosts[name].probe or {}).get("connects") or []) if name in ctx.hosts else []
    return bool(connects) and all(c.get("ok") for c in connects)


def egress_where(v: firewall.Verdict) -> str:
    """Where a refused connect is refused, in words: the policy/chain of the deciding rule."""
    ev = v.evidence.split(" (via", 1)[0]
    if v.layer == "firewalld":
        return ev.split(" (", 1)[0].removeprefix("firewalld ")
    return ev.split(": ", 1)[0].split(" #", 1)[0]


def egress_verdicts(ctx: Context, memo: _FirewallMemo, name: str, f: Mapping[str, Any],
                    addrs: list[tuple[str, str]]) -> tuple[tuple[str, str, int, firewall.Verdict] | None,
                                                          tuple[str, str, int, firewall.Verdict] | None]:
    """(the first connect of node `name` to a peer its own firewall certainly refuses, else the first one it may
    refuse (undecided)): each as (peer, peer address, port, verdict)."""
    skey, rs = memo.ruleset(f.get("firewall") or {})
    own = str(ctx.plan[name].address)
    iface = (f.get("cluster") or {}).get("ifname")
    lo, hi = (f.get("sysctl") or {}).get("ip_local_port_range", [32768, 60999])
    undecided = None
    for peer, dst in addrs:
        if peer == name:
            continue
        ports = ([ctx.cluster.master_port] if peer == ctx.cluster.master else []) + [
            int(lo), (int(lo) + int(hi)) // 2, int(hi)]
        for port in ports:
            k = (skey, own, port, iface, f"out:{dst}")
            v = memo.evaluated.get(k)
            if v is None:
                v = memo.evaluated[k] = rs.evaluate(Packet.of(own, port, iface, dst=dst, out=True))
            if v.undecided:
                undecided = undecided or (peer, dst, port, v)
            elif not v.allowed:
                return (peer, dst, port, v), None
    return None, undecided
