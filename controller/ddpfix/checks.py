"""Every audit check, as pure functions over all hosts' facts (no I/O, no hosts needed to test).

Per-node facts come from the ``ddpfix_node_facts`` module (readers in the role's module_utils), probe
results from ``ddpfix_probe``. Firewall rule evaluation is the ``ddpfix.firewall`` package (the node's collector only
reads the rule sets).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from ddpfix import firewall, ifreach
from ddpfix import rules as registry
from ddpfix.envtemplate import judge as env_judge
from ddpfix.factguard import guard_facts, guard_reach
from ddpfix.findings import Finding, finding, sort_key
from ddpfix.inventory import Cluster
from ddpfix.nodefacts import NodeFacts, ProbeResult
from ddpfix.plan import (
    CLUSTER_KEYS,
    LAUNCH_KEYS,
    NodePlan,
    cluster_nic,
    effective_cidr,
    plan_cluster,
)
from ddpfix.rules import Remedy, Rule, Severity, rules

# NCCL's default exclusion list when NCCL_SOCKET_IFNAME is unset (after trying ib* first).
NCCL_DEFAULT_EXCLUDE = ("docker", "lo", "virbr")


#: The firewall layers the node's collector reads (its `unread` sources, see the ddpfix_firewall module_utils).
FIREWALL_SOURCES = frozenset({"firewalld", "iptables", "ip6tables", "iptables-legacy", "nft", "netfilter"})
_HOSTS, _IFACES, _ENV = frozenset({"hosts_file"}), frozenset({"interfaces"}), frozenset({"env_file"})
_FABRIC = frozenset({"fabric"})

#: How remediate fixes findings (see ddpfix.rules.Remedy); the roles' fix tasks carry the rule ids as tags.
FIREWALL = Remedy("ddpfix_firewall", "firewall")
VIA_FIREWALL = Remedy("ddpfix_firewall", "firewall", how="firewall", on_target=True)
HOSTS = Remedy("ddpfix_hosts", "hosts")
HOSTS_BLOCK = Remedy("ddpfix_hosts", "hosts", how="hosts block")
CHRONY = Remedy("ddpfix_chrony", "time")
ENV = Remedy("ddpfix_env", "env")
ENV_FILE = Remedy("ddpfix_env", "env", how="env file")
PIN_IFNAME = Remedy("ddpfix_ifname", "pin_ifname", how="--pin-ifnames")
E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


@dataclass
class Thresholds:
    max_offset_s: float = 0.1  # a node's own offset from its time source
    max_skew_s: float = 1.0  # between nodes
    peer_port_samples: int = 5  # points of the ephemeral range evaluated per peer source
    max_sources: int = 8  # peer source addresses evaluated per node's firewall


@dataclass
class HostFacts:
    name: str
    reachable: bool = True
    error: str = ""
    #: not read because a module failed on the node (SSH worked): `error` is the module's own error
    failed: bool = False
    node: NodeFacts | None = None  # ansible_facts.ddpfix_node
    probe: ProbeResult | None = None  # ddpfix_probe result
    collected_at: float | None = None  # controller clock when the facts arrived (epoch seconds)
    # controller clock window (epoch seconds) within which the node read its clock: task start .. result
    window: tuple[float, float] | None = None


@dataclass
class Context:
    cluster: Cluster
    hosts: dict[str, HostFacts]
    thresholds: Thresholds = field(default_factory=Thresholds)
    #: socket interfaces chosen before, by the interface reach probe of an audit (check --local: the cluster file's)
    ifnames: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        raw = {n: (h.node if h.reachable else None) for n, h in self.hosts.items()}
        #: invalid values each read node returned: {host: [(fact, value, why)]}; `facts` has them removed
        checked = {n: guard_facts(f) for n, f in raw.items() if f}
        self.invalid: dict[str, list[tuple[str, str, str]]] = {n: p for n, (p, _) in checked.items() if p}
        self.facts: dict[str, NodeFacts | None] = {n: (checked[n][1] if n in checked else None) for n in raw}
        #: the interface reach probe of each node that ran one (probe.reach), validated like the facts
        self.reach: dict[str, dict[str, dict[str, Any]]] = {}
        for n, h in self.hosts.items():
            got = (h.probe or {}).get("reach") if h.reachable and self.facts.get(n) else None
            if got is None:
                continue
            problems, self.reach[n] = guard_reach(got)
            seen = self.invalid.get(n, [])  # the facts' own probe (folded there) was guarded already
            if new := [p for p in problems if p not in seen]:
                self.invalid[n] = [*seen, *new]
        self.cidr = effective_cidr(self.cluster, self.facts)
        self.net = ipaddress.ip_network(self.cidr) if self.cidr else None
        self.plan: dict[str, NodePlan] = plan_cluster(self.cluster, self.facts, self.reach, self.ifnames)

        self._audited: list[tuple[str, NodeFacts]] = [
            (n.name, f) for n in self.cluster.nodes if (f := self.facts.get(n.name))
        ]
        self.by_address: dict[str, str] = {}
        for name, node_plan in self.plan.items():
            if node_plan.address:
                self.by_address.setdefault(node_plan.address, name)

    def audited(self) -> list[tuple[str, NodeFacts]]:
        """(name, facts) of every node that returned facts, in rank order (computed once)."""
        return self._audited

    def unread(self, name: str) -> dict[str, str]:
        """source -> reason for every fact source that could not be read on `name` (empty: everything was read)."""
        return unread_of(self.facts.get(name))

    def in_cidr(self, addr: str | None) -> bool:
        if not addr or self.net is None:
            return False
        try:
            return ipaddress.ip_address(addr.split("%")[0]) in self.net
        except ValueError:
            return False


def unread_of(facts: Mapping[str, Any] | None) -> dict[str, str]:
    """The node's unread fact sources (source -> reason), the firewall collector's included."""
    out: dict[str, str] = {}
    if not facts:
        return out
    for u in list(facts.get("unread") or []) + list((facts.get("firewall") or {}).get("unread") or []):
        if isinstance(u, Mapping) and u.get("source"):
            out.setdefault(str(u["source"]), str(u.get("reason") or "not read"))
    return out


def _cluster_if(actual: str | None) -> str:
    return f"cluster interface is {actual}" if actual else "no interface has an address in the cluster network"


def _past(verdict: object) -> str:
    """A firewall verdict as a past participle: drop -> dropped, reject -> rejected."""
    v = str(verdict or "blocked").lower()
    return {"drop": "dropped", "reject": "rejected", "deny": "denied", "block": "blocked"}.get(v, f"{v}ed")


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def _iface(facts: Mapping[str, Any], name: str | None) -> dict[str, Any] | None:
    for i in facts.get("interfaces") or []:
        if i.get("name") == name:
            return cast(dict[str, Any], i)
    return None


def _hosts_lines(facts: Mapping[str, Any], name: str) -> str:
    lines = [e["text"] for e in facts.get("hosts_file") or [] if name in e.get("names", [])]
    return "; ".join(f"/etc/hosts: {ln.strip()}" for ln in lines) or "no /etc/hosts line (resolved through NSS/DNS)"


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


# ---------------------------------------------------------------- reachability


@rules(
    Rule(
        "host.unreachable",
        E,
        "node not reachable over SSH (the others are still fully audited)",
        "Make the node reachable over SSH (sshd running, key, known_hosts, network) and re-run.",
    ),
    Rule(
        "host.module-failed",
        E,
        "the node answered over SSH but ddpfix's module failed there (its Python interpreter exited non-zero or is "
        "missing, a traceback): nothing was read; the evidence is the module's own error (the others are still "
        "fully audited)",
        "Fix what the module's error names on the node (a working python3, the host's ansible_python_interpreter, "
        "a full /tmp) and re-run; `ddpfix -vvv audit` shows the module's whole output.",
    ),
)
def check_unreachable(ctx: Context) -> Iterable[Finding]:
    for n in ctx.cluster.nodes:
        h = ctx.hosts.get(n.name)
        if h is None:
            continue  # outside --limit: not read, not a finding
        if h.failed and not h.node:
            yield finding("host.module-failed", n.name,
                          f"{n.name} ({n.address}) could not be audited: a module failed on the node (SSH works)",
                          h.error or "the module returned no result")
        elif not h.reachable or not h.node:
            why = (h.error if h else "") or "no facts returned"
            yield finding("host.unreachable", n.name, f"{n.name} ({n.address}) could not be audited", why)


def not_read(ctx: Context, names: Iterable[str]) -> str:
    """Nodes that were not read, each with why: 'node2 unreachable, node3 not read (its module failed)'."""
    return ", ".join(f"{n} {'not read (its module failed)' if (h := ctx.hosts.get(n)) and h.failed else 'unreachable'}"
                     for n in names)


@rules(
    Rule(
        "facts.incomplete",
        W,
        "a fact source could not be read on the node (no permission, e.g. `iptables-save`/`nft` as a non-root SSH "
        "user; a missing tool; a timeout): names each source and the tool's error. The checks that read it are listed "
        'per host as **not evaluated** (JSON `hosts.NODE.not_evaluated: [{id, reason}]`, a "NOT EVALUATED" table), '
        "never as passed",
        "Let the SSH user read them (root, or become: true with passwordless sudo) or install the missing tool, then "
        "re-run; until then the checks listed as not evaluated say nothing about this node.",
    ),
)
def check_incomplete(ctx: Context) -> Iterable[Finding]:
    for name, _ in ctx.audited():
        unread = ctx.unread(name)
        if not unread:
            continue
        blind = sorted(fid for fid in _blind_ids(ctx, name, unread))
        yield finding(
            "facts.incomplete",
            name,
            f"could not read {', '.join(sorted(unread))} on {name}; not evaluated: {', '.join(blind) or 'nothing'}",
            "; ".join(f"{src}: {why}" for src, why in sorted(unread.items())),
        )


def _blind_ids(ctx: Context, name: str, unread: Mapping[str, str]) -> dict[str, str]:
    """finding id -> why it cannot be evaluated on `name` (the first unread source it reads)."""
    out: dict[str, str] = {}
    master_only = registry.master_only()
    for fid, sources in registry.depends_on().items():
        if fid in master_only and name != ctx.cluster.master:
            continue
        missing = sorted(sources & set(unread))
        if missing:
            out[fid] = f"{missing[0]} not read: {unread[missing[0]]}"
    return out


def not_evaluated(ctx: Context, findings: Iterable[Finding]) -> dict[str, list[dict[str, str]]]:
    """Per host, the checks that could not be evaluated there (an unread source), minus those that still reported.

    `[{"id", "reason"}]`, sorted by id; hosts with nothing missing are left out."""
    reported = {(f.id, f.host) for f in findings}
    out: dict[str, list[dict[str, str]]] = {}
    for name, _ in ctx.audited():
        unread = ctx.unread(name)
        items = (
            [
                {"id": fid, "reason": why}
                for fid, why in sorted(_blind_ids(ctx, name, unread).items())
                if (fid, name) not in reported
            ]
            if unread
            else []
        )
        for f in findings:  # an undecided firewall verdict: the check it stands for was not evaluated
            check = f.var("check")
            if f.host == name and f.id in UNDECIDED and check and (check, name) not in reported:
                items.append({"id": check, "reason": f"undecided ({f.id}): {f.var('rule')}"})
        why_not = ifreach.undecided(ctx.reach.get(name))
        if why_not:
            items.append({"id": "netif.cannot-reach-peers", "reason": why_not})
        for c in (ctx.hosts[name].probe or {}).get("connects") or []:  # a peer that did not run: not a failure
            why = None if c.get("ok") else probe_not_evaluated(ctx, c)
            if why:
                fid = "probe.master-port-unreachable" if c.get("kind") == "master" else "probe.peer-unreachable"
                items.append(
                    {"id": fid, "reason": f"connect to {c.get('name')} {c.get('address')}:{c.get('port')}: {why}"}
                )
        if items:
            out[name] = items
    return out


@rules(
    Rule(
        "facts.invalid",
        E,
        "the node returned a value that is not of its field's grammar (a hostname, address, interface name, MAC, "
        "RDMA device, port, GID, P_Key, env-file key or value, ...): a node's text is never used as it came "
        '(see "Refused inputs" and "Security model")',
        "Fix {fact} on the node (a hostname: hostnamectl set-hostname with an RFC 1123 name; anything else: find what "
        "wrote it, since the kernel and the tools do not print such values); ddpfix leaves it out of every peer's "
        "files and refuses to remediate or write env files until it is fixed.",
    ),
)
def check_facts(ctx: Context) -> Iterable[Finding]:
    for name, problems in ctx.invalid.items():
        for fact, value, why in problems:
            yield finding(
                "facts.invalid", name, f"{name} returned {fact} {value!r}: {why}", f"{fact} = {value!r}", fact=fact
            )


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
    Rule(
        "firewall.master-port-blocked",
        E,
        "firewalld/iptables/nftables on the master drops/rejects TCP to the master port from the cluster CIDR",
        "Allow TCP from {cidr} to port {port} on the master (ddpfix remediate adds {cidr} as a trusted source / an "
        "ACCEPT rule).",
        remedies=(FIREWALL,),
        reads=FIREWALL_SOURCES | _IFACES,
        master_only=True,
        sound_on_partial=True,
    ),
    Rule(
        "firewall.peer-ports-blocked",
        E,
        "a node's firewall blocks TCP from peers on the ephemeral range NCCL/Gloo use",
        "Allow TCP from {cidr} to the ephemeral range {range} (ddpfix remediate trusts {cidr} on this node).",
        remedies=(FIREWALL,),
        reads=FIREWALL_SOURCES | _IFACES,
        sound_on_partial=True,
    ),
    Rule(
        "firewall.world-open",
        W,
        "the master port or ephemeral range is open to any source by an explicit rule",
        "Replace the rule with one limited to source {cidr}; "
        "ddpfix adds the CIDR-limited rule but never removes yours.",
        reads=FIREWALL_SOURCES | _IFACES,
        manual="ddpfix only adds CIDR rules",
    ),
    Rule(
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
    Rule(
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
    outcomes: dict[tuple[Any, ...], list[_Outcome]] = {}
    for name, f in ctx.audited():
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
            outcomes[key] = list(
                _firewall_outcomes(ctx, memo, skey, rs, iface, sources, (int(lo), int(hi)), master, dst)
            )
        for out in outcomes[key]:
            fid, summary, evidence, details = _probe_decides(ctx, memo, skey, rs, name, iface, dst, out)
            if fid:
                yield finding(fid, name, summary, evidence, **{k: v for k, v in details.items() if k != "_pairs"})


#: The undecided findings and the check each stands for (listed per host as not evaluated, never as a pass).
UNDECIDED = {"firewall.undecided", "firewall.undecided-accept"}
_BLOCKED = {True: "firewall.master-port-blocked", False: "firewall.peer-ports-blocked"}


def _undecided(v: firewall.Verdict, src: str, what: str, details: dict[str, Any],
               pairs: list[tuple[str, int, firewall.Verdict]]) -> _Outcome:
    """The finding of an undecided verdict: which way it goes if no undecided rule matches, and the rules."""
    rules_ = "; ".join(v.undecided[:3]) + (f"; ... ({len(v.undecided)} rules)" if len(v.undecided) > 3 else "")
    if v.allowed:
        fid, how = "firewall.undecided", "could be dropped/rejected by a rule ddpfix does not model"
        ev = f"not modelled, stands before the accepting rule: {rules_}; if it does not match: accepted by {v.evidence}"
    else:
        fid, how = "firewall.undecided-accept", f"is {_past(v.verdict)} unless a rule ddpfix does not model accepts it"
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
                f"TCP {src} -> {port} would be {_past(v.verdict)} by {v.layer}",
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
            f"TCP {src} -> ephemeral port {p} (range {lo}-{hi}) would be {_past(v.verdict)} by {v.layer}",
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
    if fid not in UNDECIDED:
        return out
    details = {**details, "node": name}
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


# ---------------------------------------------------------------- probes


@rules(
    Rule(
        "probe.master-port-unreachable",
        E,
        "TCP connect from this node to MASTER_ADDR:MASTER_PORT fails (refused / timed out / no route)",
        "Fix the firewall/route on the path to the master {target}; re-run audit to confirm the connect succeeds.",
        remedies=(VIA_FIREWALL,),
    ),
    Rule(
        "probe.peer-unreachable",
        E,
        "TCP from this node to a peer's probe port (in its ephemeral range) fails",
        "Open the peer's ephemeral range to {cidr} and check the route between the two nodes.",
        remedies=(VIA_FIREWALL,),
    ),
    Rule(
        "probe.port-in-use",
        E,
        "something already listens on the master port on the master",
        "Stop the process holding port {port} on the master, or choose another ddp_master_port outside the ephemeral "
        "range.",
        reads=frozenset({"listening"}),
        master_only=True,
    ),
)
def check_probes(ctx: Context) -> Iterable[Finding]:
    master = ctx.cluster.master
    mf = ctx.facts.get(master)
    if mf and ctx.cluster.master_port in (mf.get("listening") or []):
        yield finding(
            "probe.port-in-use",
            master,
            f"port {ctx.cluster.master_port} is already in use on the master",
            f"a socket on {master} is in LISTEN state on TCP port {ctx.cluster.master_port} before the job starts",
            port=ctx.cluster.master_port,
        )
    for name, f in ctx.audited():
        pr = ctx.hosts[name].probe or {}
        for c in pr.get("connects") or []:
            if c.get("ok") or probe_not_evaluated(ctx, c):
                continue
            target = f"{c.get('name')} {c.get('address')}:{c.get('port')}"
            src = pr_src(f)
            to_master = c.get("kind") == "master"
            yield finding(
                "probe.master-port-unreachable" if to_master else "probe.peer-unreachable",
                name,
                f"TCP connect to the master {target} failed" if to_master
                else f"TCP connect to peer {target} (probe port) failed",
                f"connect from {src} to {target}: {c.get('error')}",
                cidr=ctx.cidr,
                target=c.get("name"),
            )
        listener: Mapping[str, Any] = f.get("probe") or {}
        if listener.get("error"):
            yield finding(
                "probe.peer-unreachable",
                name,
                "probe listener could not start on this node",
                str(f["probe"]["error"]),
                cidr=ctx.cidr,
            )


def probe_not_evaluated(ctx: Context, c: Mapping[str, Any]) -> str | None:
    """Why a failed connect says nothing about the network (None: it does): the target did not run or was not
    read, its listener could not start, or it was refused while the target's listener was not up (the last attempt
    fell outside the listener's life: it started or ended outside the dialer's retries). A connect that succeeded
    is always evaluated."""
    target = c.get("name")
    tf = ctx.facts.get(str(target)) if target is not None else None
    if not tf:
        return f"{target} was not audited"
    tp = tf.get("probe") or {}
    if tp.get("error"):
        return f"{target}'s probe listener did not start"
    kind = c.get("kind")
    if kind == "peer" and not tp.get("port"):
        return f"{target} has no probe listener"
    if (
        kind == "master"
        and not tp.get("master_port_listening")
        and ctx.cluster.master_port not in (tf.get("listening") or [])
    ):
        return f"nothing listened on {target}'s master port"
    if "ECONNREFUSED" not in str(c.get("error") or ""):
        return None  # an ICMP reject or a timeout comes from the path, whether or not the listener was up yet
    if kind == "master" and not tp.get("master_port_listening"):
        return None  # the master port's listener is a job's, up all along
    last, up, down = c.get("last_try"), tp.get("up_at"), tp.get("down_at")
    if (
        isinstance(last, (int, float))
        and isinstance(up, (int, float))
        and isinstance(down, (int, float))
        and not up <= last <= down
    ):
        return f"{target}'s listener was not up during the last attempt"
    return None


def pr_src(f: Mapping[str, Any]) -> str:
    c = f.get("cluster") or {}
    return f"{c.get('address')} ({c.get('ifname')})"


# ---------------------------------------------------------------- names


@rules(
    Rule(
        "hosts.hostname-loopback",
        E,
        "the hostname resolves to 127.0.0.0/8 or ::1 (Gloo advertises loopback)",
        "Map the hostname to its cluster address in /etc/hosts and take it off the loopback line (ddpfix remediate).",
        remedies=(HOSTS,),
        reads=_HOSTS,
        sound_on_partial=True,
    ),
    Rule(
        "hosts.name-form-differs",
        W,
        "a form of the node's own name (hostname, FQDN) resolves to an address the node does not hold",
        "Make every form of the node's name resolve to an address it holds: correct the /etc/hosts lines of "
        "{forms} (the FQDN is the first dotted name on the hostname's line), or the search domain in "
        "/etc/resolv.conf that turns the short name into another host's FQDN; not changed automatically.",
        reads=_HOSTS | _IFACES,
        sound_on_partial=True,
    ),
    Rule(
        "hosts.duplicate-hostname",
        E,
        "two nodes share a hostname (cloned VMs)",
        "Give {nodes} each a unique hostname (hostnamectl set-hostname <new-name> on each) and a fresh "
        "/etc/machine-id; not changed automatically.",
    ),
    Rule(
        "hosts.duplicate-machine-id",
        W,
        "two nodes share /etc/machine-id",
        "Regenerate it on the clone: rm /etc/machine-id && systemd-machine-id-setup; not changed automatically.",
    ),
)
def check_hostnames(ctx: Context) -> Iterable[Finding]:
    by_hostname: dict[str, list[str]] = {}
    by_mid: dict[str, list[str]] = {}
    for name, f in ctx.audited():
        hn = f.get("hostname") or ""
        by_hostname.setdefault(hn, []).append(name)
        if f.get("machine_id"):
            by_mid.setdefault(f["machine_id"], []).append(name)
        addrs = (f.get("resolve_self") or {}).get(hn) or []
        loop = [a for a in addrs if _is_loopback(a)]
        if loop:
            yield finding(
                "hosts.hostname-loopback",
                name,
                f"hostname {hn} resolves to {', '.join(addrs)}: Gloo/c10d would advertise {loop[0]}",
                _hosts_lines(f, hn),
            )
        yield from _name_forms(ctx, name, f)
    for hn, names in by_hostname.items():
        if len(names) > 1:
            yield finding(
                "hosts.duplicate-hostname",
                None,
                f"hostname {hn!r} is used by {', '.join(names)}",
                "; ".join(f"{n}: hostname={hn}" for n in names),
                nodes=", ".join(names),
            )
    for mid, names in by_mid.items():
        if len(names) > 1:
            yield finding(
                "hosts.duplicate-machine-id",
                None,
                f"machine-id {mid} is shared by {', '.join(names)}",
                f"/etc/machine-id = {mid} on {', '.join(names)}",
            )


@rules(
    Rule(
        "hosts.peer-unresolvable",
        E,
        "a peer's hostname does not resolve on this node",
        "Add the managed /etc/hosts block mapping every node to its cluster address (ddpfix remediate).",
        remedies=(HOSTS,),
        reads=_HOSTS,
        sound_on_partial=True,
    ),
    Rule(
        "hosts.peer-mismatch",
        E,
        "a peer's hostname resolves to another address than its cluster address",
        "Use the same managed /etc/hosts block on every node (ddpfix remediate); remove stale entries.",
        remedies=(HOSTS,),
        reads=_HOSTS,
        sound_on_partial=True,
    ),
    Rule(
        "hosts.peer-name-other-network",
        INFO,
        "a peer's hostname resolves to that peer's address on another network than the cluster network (a "
        "management network): fine for ddpfix's env files, which name addresses and socket interfaces",
        "Nothing to change for launches from ddpfix's env files (MASTER_ADDR is the master's cluster address, the "
        "socket interfaces are set). A launcher that passes hostnames (torchrun --rdzv-endpoint with a hostname, or "
        "the c10d rendezvous, which advertises the rank-0 agent's FQDN) talks over that network: give it "
        "$MASTER_ADDR:$MASTER_PORT from the env file, or names that resolve to cluster addresses.",
        reads=_HOSTS,
        sound_on_partial=True,
    ),
    Rule(
        "addr.family-mismatch",
        W,
        "peers' names resolve to IPv4 on some nodes and IPv6 on others",
        "Use IPv4 literals for MASTER_ADDR and IPv4 /etc/hosts entries (ddpfix remediate); or "
        "NCCL_SOCKET_FAMILY=AF_INET.",
        remedies=(HOSTS_BLOCK,),
        reads=_HOSTS,
        sound_on_partial=True,
    ),
)
def check_resolution(ctx: Context) -> Iterable[Finding]:
    """The resolution matrix: every node resolves every peer's hostname to that peer's cluster address."""
    counts = Counter(f.get("hostname") for _, f in ctx.audited() if f.get("hostname"))
    peers = {f.get("hostname"): name for name, f in ctx.audited() if f.get("hostname")}
    dup = {hn for hn, c in counts.items() if c > 1}
    want_of = {hn: ctx.plan[peer].address for hn, peer in peers.items() if hn not in dup}
    families: dict[str, set[int]] = {}
    other: list[str] = []  # names that resolve to their node's address on another network (one finding)
    other_names: set[str] = set()
    for name, f in ctx.audited():
        pr = ctx.hosts[name].probe or {}
        res = pr.get("resolve") or {}
        if isinstance(pr.get("checked"), int) and pr["checked"] > len(res):
            # the node reports deviations only: the names it does not list resolved to the address expected
            mine = ctx.plan[name].address if name in ctx.plan else None
            if mine:
                families.setdefault(name, set()).add(6 if ":" in mine else 4)
        for hn, addrs in res.items():
            if hn not in want_of or peers[hn] == name:
                continue
            peer, want = peers[hn], want_of[hn]
            addrs = addrs or []
            if not addrs:
                yield finding(
                    "hosts.peer-unresolvable",
                    name,
                    f"peer {peer}'s hostname {hn} does not resolve on {name}",
                    f"getaddrinfo({hn!r}) on {name}: no address; {_hosts_lines(f, hn)}",
                    target=peer,
                )
                continue
            first = addrs[0]
            fam = 6 if ":" in first else 4
            families.setdefault(name, set()).add(fam)
            if want and first != want:
                held = _held_by(ctx, peer, first)
                if held is not None and ctx.in_cidr(first):
                    continue  # another of the peer's own addresses inside the cluster network: it reaches the peer
                if held is not None and held[0] != ctx.plan[peer].ifname:  # the peer's, on another network
                    other_names.add(hn)
                    other.append(f"{hn} -> {first} on {name} ({peer}'s {held[0]}, {held[1]}; "
                                 f"cluster address {want} on {ctx.plan[peer].ifname})")
                    continue
                where = (
                    "outside the cluster network " + str(ctx.cidr)
                    if not ctx.in_cidr(first)
                    else f"not {peer}'s cluster address {want}"
                )
                yield finding(
                    "hosts.peer-mismatch",
                    name,
                    f"{hn} resolves to {first} on {name}, {where}",
                    f"getaddrinfo({hn!r}) on {name} = {', '.join(addrs)}; {_hosts_lines(f, hn)}",
                    target=peer,
                )
    if other:
        more = f"; and {len(other) - 3} more" if len(other) > 3 else ""
        yield finding(
            "hosts.peer-name-other-network",
            None,
            f"peer hostnames resolve to their nodes' addresses outside the cluster network {ctx.cidr} "
            f"({len(other)} lookups of {len(other_names)} names)",
            "; ".join(other[:3]) + more,
        )
    fams = dict(families.items())
    if len({frozenset(s) for s in fams.values()}) > 1:
        yield finding(
            "addr.family-mismatch",
            None,
            "peer names resolve to different address families on different nodes",
            "; ".join(f"{n}: IPv{'/'.join(str(x) for x in sorted(s))}" for n, s in sorted(fams.items())),
        )


def _name_forms(ctx: Context, name: str, f: NodeFacts) -> Iterable[Finding]:
    """hosts.name-form-differs: the node's hostname or FQDN resolving (first address, as torch's
    `_matches_machine_hostname` and Gloo's bind use it) to an address the node does not hold. Loopback is
    hosts.hostname-loopback's; an own name that does not resolve is not judged here."""
    hn, fqdn = f.get("hostname") or "", f.get("fqdn") or ""
    resolved = f.get("resolve_self") or {}
    forms = [("hostname", hn)] + ([("FQDN", fqdn)] if fqdn and fqdn != hn else [])
    evidence, wrong = [], []
    for label, form in forms:
        got = resolved.get(form) or []
        if not got or _is_loopback(got[0]):
            continue
        held = _held_by(ctx, name, got[0])
        if held is not None:
            evidence.append(f"{label} {form} -> {got[0]} ({held[0]})")
            continue
        owner = ctx.by_address.get(got[0])
        evidence.append(f"{label} {form} -> {got[0]} ({'held by ' + owner if owner else 'not an address of ' + name})")
        wrong.append((label, form, got[0]))
    if not wrong:
        return
    label, form, addr = wrong[0]
    yield finding(
        "hosts.name-form-differs",
        name,
        f"{name}'s {label} {form} resolves to {addr}, an address {name} does not hold: Gloo without "
        f"GLOO_SOCKET_IFNAME binds what the hostname resolves to, and torchrun's c10d rendezvous advertises it",
        "; ".join(evidence) + "; " + "; ".join(_hosts_lines(f, fm) for _, fm, _ in wrong),
        forms=" and ".join(fm for _, fm, _ in wrong),
    )


def _held_by(ctx: Context, node: str, address: str) -> tuple[str, str] | None:
    """(interface, its network) of `node` that holds `address`, from its facts; None when it holds none (or was not
    read)."""
    for i in (ctx.facts.get(node) or {}).get("interfaces") or []:
        for a in i.get("addrs") or []:
            if a.get("local") == address:
                try:
                    net = ipaddress.ip_network(f"{address}/{a.get('prefixlen')}", strict=False)
                except ValueError:
                    continue
                return str(i.get("name")), str(net)
    return None


@rules(
    Rule(
        "hosts.block-differs",
        W,
        "the managed /etc/hosts block is not the same on every node (a fix applied to only some of them)",
        "Write the same block on every node: ddpfix remediate --apply without --limit ({nodes} differ).",
        remedies=(HOSTS_BLOCK,),
        reads=_HOSTS,
        sound_on_partial=True,
    ),
)
def check_hosts_block(ctx: Context) -> Iterable[Finding]:
    """ddpfix's managed /etc/hosts block is identical on every read node, or absent on all (each node returns only
    the block's SHA-256). A node whose /etc/hosts was not read, or which returned no valid digest (validated with the
    other node values, factguard.validate_facts), is left out."""
    by_digest: dict[str | None, list[str]] = {}
    for name, f in ctx.audited():
        if "hosts_file" in ctx.unread(name) or "hosts_block_sha256" not in f:
            continue
        by_digest.setdefault(f.get("hosts_block_sha256"), []).append(name)
    if len(by_digest) < 2:
        return
    groups = sorted(by_digest.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    common = groups[0][1]
    others = sorted(n for _, names in groups[1:] for n in names)
    yield finding(
        "hosts.block-differs",
        None,
        f"the managed /etc/hosts block differs between nodes: {', '.join(others)} against {', '.join(common)}",
        "; ".join(f"{', '.join(names)}: " + (f"block sha256 {d[:12]}" if d else "no managed block")
                  for d, names in groups),
        nodes=", ".join(others),
    )


# ---------------------------------------------------------------- time


def chrony_unsynchronised(tracking: Mapping[str, Any] | None, max_offset_s: float) -> tuple[str, str] | None:
    """The one judgement of a running chronyd from its `chronyc -c tracking` facts (parsed on the node: its
    `synchronised` is the leap status and reference): (summary, evidence) of why it is not synchronised, or None
    when it is, within `max_offset_s`."""
    if not tracking:
        return "chronyd runs but `chronyc tracking` gives no answer", "chronyc -c tracking failed"
    if not tracking.get("synchronised"):
        return (
            "chronyd is not synchronised",
            f"chronyc tracking: leap status {tracking.get('leap_status')!r}, reference {tracking.get('ref_name')!r}",
        )
    offset = float(tracking.get("system_offset") or 0.0)
    if abs(offset) > max_offset_s:
        return (
            f"clock offset {offset:+.3f}s exceeds {max_offset_s}s",
            f"chronyc tracking: system time offset {offset:+.6f}s",
        )
    return None


@rules(
    Rule(
        "time.no-daemon",
        W,
        "no chronyd/ntpd/timesyncd/ptp4l running",
        "Install and run chrony with common servers (ddp_ntp_servers) or the master as local source "
        "(ddp_ntp_local_master).",
        remedies=(CHRONY,),
        reads=frozenset({"processes"}),
        still_open="chronyd was started but is not running: see its log on the node",
    ),
    Rule(
        "time.unsynchronized",
        W,
        "chrony not synchronised, or its offset above 0.1 s",
        "Give chrony reachable sources (ddp_ntp_servers or ddp_ntp_local_master) with iburst and makestep; ddpfix "
        "remediate configures it.",
        remedies=(CHRONY,),
        reads=frozenset({"processes", "chronyc"}),
        still_open="chronyd runs with the ddpfix sources but has not synchronised to them: check that the sources "
        "answer NTP from this node and that chronyd reads the configuration ddpfix edited "
        "(ddpfix_chrony_conf_path)",
    ),
    Rule(
        "time.skew",
        W,
        "clock readings differ between nodes by more than `--max-skew` (1 s)",
        "Synchronise every node to the same sources (chrony); elastic rendezvous heartbeats compare wall clocks.",
    ),
)
def check_time(ctx: Context) -> Iterable[Finding]:
    offsets: dict[str, float] = {}
    for name, f in ctx.audited():
        t: Mapping[str, Any] = f.get("time") or {}
        daemons = t.get("daemons") or []
        tr = t.get("chrony_tracking")
        if not daemons:
            yield finding(
                "time.no-daemon",
                name,
                "no time-sync daemon is running",
                "no chronyd/ntpd/systemd-timesyncd/ptp4l process found",
            )
        elif "chronyd" in daemons:
            problem = chrony_unsynchronised(tr, ctx.thresholds.max_offset_s)
            if problem:
                yield finding("time.unsynchronized", name, *problem)
        h = ctx.hosts[name]
        if f.get("now") is not None:
            offset = clock_offset(float(f["now"]), h.window, h.collected_at)
            if offset is not None:
                offsets[name] = offset
    if len(offsets) > 1:
        lo = min(offsets, key=lambda n: offsets[n])
        hi = max(offsets, key=lambda n: offsets[n])
        spread = offsets[hi] - offsets[lo]
        if spread > ctx.thresholds.max_skew_s:
            yield finding(
                "time.skew",
                None,
                f"clocks differ by {spread:.2f}s between {hi} and {lo}",
                "; ".join(f"{n}: {o:+.2f}s vs controller" for n, o in sorted(offsets.items()))
                + " (beyond each task's start..result window)",
            )


# ---------------------------------------------------------------- interfaces


def clock_offset(node_now: float, window: tuple[float, float] | None, collected_at: float | None) -> float | None:
    """How far a node's clock reading lies outside the controller's window for that task.

    The node read its clock somewhere between the task's start and its result on the controller, so a synchronised
    node's reading falls inside the window: offset 0. Only the part outside the window counts, so a busy controller
    (a wide window) can hide small skews but never invents one."""
    if window is not None:
        lo, hi = window
        if node_now < lo:
            return node_now - lo
        if node_now > hi:
            return node_now - hi
        return 0.0
    if collected_at is not None:
        return node_now - collected_at
    return None


def nccl_select(spec: str | None, ifaces: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Interfaces NCCL would use for `NCCL_SOCKET_IFNAME=spec` (None: its default order), IPv4 ones."""
    cands = [
        i
        for i in sorted(ifaces, key=lambda x: x.get("index") or 0)
        if any(a.get("family") == "inet" for a in i.get("addrs") or [])
    ]
    if spec:
        exclude = spec.startswith("^")
        s = spec[1:] if exclude else spec
        exact = s.startswith("=")
        s = s[1:] if exact else s
        pats = [p for p in s.split(",") if p]

        def match(n: str) -> bool:
            return any((n == p) if exact else n.startswith(p) for p in pats)

        return [i for i in cands if match(i["name"]) != exclude]
    ib = [i for i in cands if i["name"].startswith("ib")]
    if ib:
        return ib
    return [i for i in cands if not any(i["name"].startswith(p) for p in NCCL_DEFAULT_EXCLUDE)]


def _inet(i: Mapping[str, Any]) -> list[str]:
    return [a["local"] for a in i.get("addrs") or [] if a.get("family") == "inet"]


# NCCL's automatic socket interface choice (NCCL_SOCKET_IFNAME unset), replayed from its source: ncclFindInterfaces
# (NVIDIA/nccl src/misc/socket.cc) walks the getifaddrs() entries (glibc asks the kernel for every IPv4 address,
# interface by interface in index order, then every IPv6 one; NCCL skips ::1 and keeps the first address of each
# name) and takes the first non-empty step: names starting with "ib"; the subnet of NCCL_COMM_ID (torch never sets
# it); every name but "^docker,lo"; "docker"; "lo". NCCL 2.28.3 (f1308997, the loop moved to src/os/linux.cc
# ncclOsFindInterfaces) skips interfaces without IFF_RUNNING (up, operstate UP or UNKNOWN), excludes "virbr" too and
# falls back to it last. The bootstrap (src/bootstrap.cc) takes the first interface (maxIfs 1); NET/Socket takes up
# to 16 (MAX_IFS). Nothing else is excluded: cni0, flannel.1, cali*, weave, tailscale0, wg*, br-*, veth* and
# link-local addresses are picked like any NIC (uccl-project/uccl#1034).
NCCL_AUTO_STEPS = {
    "2.28.3+": (("ib",), ("^", "docker", "lo", "virbr"), ("docker",), ("lo",), ("virbr",)),
    "<2.28.3": (("ib",), ("^", "docker", "lo"), ("docker",), ("lo",)),
}

#: Interface name prefixes of virtual and overlay devices, and what they are (a pick of one of them, other than the
#: node's cluster interface, is wrong even when its address lies in the cluster CIDR).
VIRTUAL_IFNAMES = (
    ("docker", "Docker bridge"), ("br-", "Docker user-network bridge"), ("veth", "container veth"),
    ("virbr", "libvirt NAT bridge"), ("cni", "Kubernetes CNI bridge"), ("flannel", "flannel overlay"),
    ("cali", "Calico pod interface"), ("weave", "Weave Net bridge"), ("vxlan", "VXLAN overlay"),
    ("cilium", "Cilium interface"), ("kube-", "Kubernetes proxy interface"), ("tailscale", "Tailscale VPN"),
    ("wg", "WireGuard tunnel"), ("zt", "ZeroTier VPN"), ("tunl", "IP-in-IP tunnel"), ("tun", "tunnel"),
    ("tap", "tap device"),
    ("lxcbr", "LXC bridge"), ("lxdbr", "LXD bridge"), ("podman", "Podman bridge"),
)
#: `ip -d` link kinds that are never a cluster NIC of their own (a bridge may be: br0 holding the host's NIC)
VIRTUAL_KINDS = {"veth": "veth", "vxlan": "VXLAN overlay", "wireguard": "WireGuard tunnel", "geneve": "Geneve overlay",
                 "tun": "tun/tap device", "ipip": "IP-in-IP tunnel", "gre": "GRE tunnel", "sit": "SIT tunnel"}


def _running(i: Mapping[str, Any]) -> bool:
    """IFF_RUNNING as the kernel sets it (dev_get_flags): up, and operstate UP or UNKNOWN (netif_oper_up)."""
    return "UP" in (i.get("flags") or []) and i.get("operstate") in ("UP", "UNKNOWN", None)


def nccl_autoselect(ifaces: Sequence[Mapping[str, Any]],
                    version: str = "2.28.3+") -> list[tuple[Mapping[str, Any], str]]:
    """(interface, address) in the order NCCL's automatic choice of `version` ("2.28.3+" or "<2.28.3") returns
    them; the first one is the bootstrap's (see NCCL_AUTO_STEPS)."""
    ordered = sorted(ifaces, key=lambda x: x.get("index") or 0)
    entries = [(i, str(a.get("local")))
               for fam in ("inet", "inet6") for i in ordered for a in i.get("addrs") or []
               if a.get("family") == fam and a.get("local") and not (fam == "inet6" and _is_loopback(a["local"]))]
    if version == "2.28.3+":
        entries = [e for e in entries if _running(e[0])]
    for step in NCCL_AUTO_STEPS[version]:
        negate = step[0] == "^"
        pats = step[1:] if negate else step
        got: list[tuple[Mapping[str, Any], str]] = []
        for i, addr in entries:
            name = str(i.get("name") or "")
            if name.startswith(pats) != negate and all(g[0].get("name") != name for g in got):
                got.append((i, addr))
        if got:
            return got
    return []


def virtual_kind(i: Mapping[str, Any], addr: str | None = None) -> str | None:
    """What makes (interface, address) no cluster path: a virtual/overlay device or a link-local address; None."""
    name = str(i.get("name") or "")
    why = [next((what for prefix, what in VIRTUAL_IFNAMES if name.startswith(prefix)), None)
           or VIRTUAL_KINDS.get(str(i.get("kind") or ""))]
    try:
        ip = ipaddress.ip_address((addr or "").split("%")[0]) if addr else None
    except ValueError:
        ip = None
    if ip is not None and ip.is_link_local:
        why.insert(0, "link-local, 169.254.0.0/16" if ip.version == 4 else "link-local, fe80::/10")
    return ", ".join(w for w in why if w) or None


def _owner(ifaces: Sequence[Mapping[str, Any]], addr: str) -> Mapping[str, Any] | None:
    return next((i for i in ifaces for a in i.get("addrs") or [] if a.get("local") == addr), None)


def gloo_autoselect(f: Mapping[str, Any]) -> str | None:
    """The address Gloo binds with GLOO_SOCKET_IFNAME unset: torch's GlooDeviceFactory makeDeviceForHostname takes
    the first getaddrinfo(hostname) result that bind() accepts (doesHostnameResolveToUsableAddress, torch
    torch/csrc/distributed/c10d/GlooDeviceFactory.cpp), i.e. a loopback or a local address (a link-local IPv6 one
    without a scope does not bind); None: nothing binds (torch falls back to 127.0.0.1)."""
    hn = f.get("hostname") or ""
    ifaces = f.get("interfaces") or []
    for a in (f.get("resolve_self") or {}).get(hn) or []:
        if _is_loopback(a):
            return str(a)
        try:
            if ipaddress.ip_address(a.split("%")[0]).is_link_local and ":" in a and "%" not in a:
                continue
        except ValueError:
            continue
        if _owner(ifaces, a) is not None:
            return str(a)
    return None


def _autoselect_nccl(ctx: Context, name: str, ifaces: Sequence[Mapping[str, Any]],
                     actual: str | None) -> Iterable[Finding]:
    """netif.autoselect-wrong for NCCL with NCCL_SOCKET_IFNAME unset: each NCCL version's bootstrap pick (see
    NCCL_AUTO_STEPS) that lies outside the CIDR, or is a virtual/overlay interface or link-local address other than
    the cluster interface."""
    wrong: dict[str, tuple[Mapping[str, Any], str, str]] = {}
    picks: dict[str, list[tuple[Mapping[str, Any], str]]] = {}
    for version in NCCL_AUTO_STEPS:
        picks[version] = got = nccl_autoselect(ifaces, version)
        if not got:
            continue
        i, addr = got[0]
        kind = virtual_kind(i, addr) if i.get("name") != actual else None
        if kind or not ctx.in_cidr(addr):
            wrong[version] = (i, addr, kind or f"outside {ctx.cidr}")
    if not wrong:
        return
    said = {v: f"{i['name']} ({addr}, {why})" for v, (i, addr, why) in wrong.items()}
    if len(set(said.values())) == 1 and len(wrong) == len(NCCL_AUTO_STEPS):
        what = f"NCCL would pick {next(iter(said.values()))}"
    else:
        what = "; ".join(f"NCCL {v} would pick {pick}" for v, pick in said.items())
        what += "".join(f" (NCCL {v} picks {got[0][0]['name']})" for v, got in picks.items() if got and v not in wrong)
    lists: dict[str, list[str]] = {}  # the order each version returns (the same list once), the first 6 entries
    for v, got in picks.items():
        shown = [f"{i['name']}={a}" for i, a in got[:6]] + ([f"... {len(got) - 6} more"] if len(got) > 6 else [])
        lists.setdefault(", ".join(shown), []).append(v)
    order = "; ".join(" and ".join(f"{v} (ib*, then not {', '.join(NCCL_AUTO_STEPS[v][1][1:])})" for v in vs)
                      + f": {text}" for text, vs in lists.items() if text)
    yield finding(
        "netif.autoselect-wrong",
        name,
        f"with NCCL_SOCKET_IFNAME unset {what}, "
        f"not the cluster interface {actual or '(none found in ' + str(ctx.cidr) + ')'}",
        f"NCCL's automatic order, {order}; picked: "
        + ", ".join(dict.fromkeys(f"{i['name']} {addr} ({why})" for i, addr, why in wrong.values())),
        ifname=actual or "<cluster interface>",
    )


def _configured_ifnames(ctx: Context, name: str, f: Mapping[str, Any]) -> dict[str, str]:
    """Socket interface settings in force on this node: inventory override and existing env file values."""
    out: dict[str, str] = {}
    node = ctx.cluster.node(name)
    if node.socket_ifname:
        out["ddp_socket_ifname"] = node.socket_ifname
    env = (f.get("env_file") or {}).get("values") or {}
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        if env.get(k):
            out[k] = env[k]
    return out


@rules(
    Rule(
        "netif.missing",
        E,
        "the configured socket interface (override or env file's NCCL/GLOO_SOCKET_IFNAME, NCCL grammar) does not "
        "exist or has no address in the CIDR",
        "Set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME per node to the node's own cluster interface (ddpfix env --apply).",
        remedies=(ENV_FILE,),
        reads=_IFACES | _ENV,
    ),
    Rule(
        "netif.name-mismatch",
        W,
        "the cluster NIC has different names while one name is configured for all",
        "Write per-node interface names (ddpfix env files) instead of one cluster-wide name; optionally pin names "
        "(--pin-ifnames).",
        remedies=(ENV_FILE, PIN_IFNAME),
        reads=_IFACES | _ENV,
    ),
    Rule(
        "netif.autoselect-wrong",
        W,
        "with no IFNAME set, NCCL's default order or Gloo's hostname path would pick a non-cluster interface: "
        "outside the CIDR, or a virtual/overlay device (docker0, br-*, veth*, virbr*, cni0, flannel.1, cali*, weave, "
        "tailscale0, wg*) or a link-local address (169.254.0.0/16, fe80::/10) other than the cluster NIC",
        "Set NCCL_SOCKET_IFNAME=={ifname} and GLOO_SOCKET_IFNAME={ifname} on this node (ddpfix env --apply writes "
        "them). NCCL excludes only docker*, lo* (and, from 2.28.3, virbr* and interfaces without carrier) from its "
        "automatic choice, and Gloo binds whatever the hostname resolves to.",
        remedies=(ENV_FILE,),
        reads=_IFACES | _ENV,
    ),
    Rule(
        "netif.mtu-mismatch",
        W,
        "cluster interface MTUs differ",
        "Set the same MTU on every node's cluster interface (and the switch); not changed automatically.",
        reads=_IFACES,
    ),
    Rule(
        "netif.down",
        E,
        "the cluster interface is down",
        "Bring the interface up (ip link set {ifname} up) and fix its configuration; not changed automatically.",
        reads=_IFACES,
    ),
)
def check_interfaces(ctx: Context) -> Iterable[Finding]:
    names: dict[str, str] = {}
    mtus: dict[str, int] = {}
    configured_all: dict[str, dict[str, str]] = {}
    for name, f in ctx.audited():
        ifaces = f.get("interfaces") or []
        cl: Mapping[str, Any] = f.get("cluster") or {}
        actual = ctx.plan[name].ifname
        # the NIC holding the cluster address, even when a (wrong) override hid it from the plan
        real = actual or cluster_nic(f, cidr=ctx.cidr)
        if real:
            names[name] = real
        if actual:
            i = _iface(f, actual) or {}
            if i.get("mtu"):
                mtus[name] = int(i["mtu"])
            if "UP" not in (i.get("flags") or []) or i.get("operstate") == "DOWN":
                yield finding(
                    "netif.down",
                    name,
                    f"cluster interface {actual} is down",
                    f"ip link: {actual} flags={','.join(i.get('flags') or [])} operstate={i.get('operstate')}",
                    ifname=actual or "<cluster interface>",
                )
        elif not cl.get("address") and not ctx.cluster.node(name).socket_ifname:
            yield finding(
                "netif.missing",
                name,
                f"no interface on {name} has an address in {ctx.cidr}",
                "interfaces: " + "; ".join(f"{i['name']} {','.join(_inet(i)) or '-'}" for i in ifaces),
            )
        configured = _configured_ifnames(ctx, name, f)
        configured_all[name] = configured
        for key, value in configured.items():
            if key == "NCCL_SOCKET_IFNAME":
                chosen = nccl_select(value, ifaces)
                ok = [i for i in chosen if any(ctx.in_cidr(a) for a in _inet(i))]
                if not ok:
                    yield finding(
                        "netif.missing",
                        name,
                        f"{key}={value} matches no interface with an address in {ctx.cidr} on {name}",
                        f"{key}={value} matched: {', '.join(i['name'] for i in chosen) or 'nothing'}; "
                        f"{_cluster_if(actual)}",
                    )
            else:
                for ifn in [v for v in value.split(",") if v]:
                    found = _iface(f, ifn)
                    if found is None:
                        yield finding(
                            "netif.missing",
                            name,
                            f"{key}={value}: interface {ifn} does not exist on {name}",
                            f"{key}={value}; interfaces present: {', '.join(x['name'] for x in ifaces)}; "
                            f"{_cluster_if(actual)}",
                        )
                    elif not any(ctx.in_cidr(a) for a in _inet(found)):
                        yield finding(
                            "netif.missing",
                            name,
                            f"{key}={value}: {ifn} has no address in {ctx.cidr}",
                            f"{key}={value}; {ifn} addresses: {', '.join(_inet(found)) or 'none'}",
                        )
        if not configured.get("NCCL_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
            yield from _autoselect_nccl(ctx, name, ifaces, actual)
        if not configured.get("GLOO_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
            hn = f.get("hostname") or ""
            bound = gloo_autoselect(f)
            owner = _owner(ifaces, bound) if bound else None
            kind = virtual_kind(owner, bound) if owner and owner.get("name") != actual else None
            if bound and not _is_loopback(bound) and (kind or not ctx.in_cidr(bound)):
                yield finding(
                    "netif.autoselect-wrong",
                    name,
                    f"with GLOO_SOCKET_IFNAME unset Gloo would bind {bound} (what hostname {hn} resolves to), "
                    + (f"on {owner['name']} ({kind}), not the cluster interface {actual}" if kind and owner
                       else f"outside {ctx.cidr}"),
                    _hosts_lines(f, hn) + (f"; {bound} is on {owner['name']}" if owner else ""),
                    ifname=actual or "<cluster interface>",
                )
    if len(set(names.values())) > 1:
        single = {frozenset(c.items()) for c in configured_all.values() if c}
        one_name = len(single) == 1 and len(configured_all) == len(names) and all(configured_all.values())
        if one_name:
            yield finding(
                "netif.name-mismatch",
                None,
                "the cluster interface is named differently across nodes but one name is configured for all",
                "cluster interfaces: "
                + ", ".join(f"{n}={i}" for n, i in sorted(names.items()))
                + "; configured: "
                + ", ".join(f"{k}={v}" for k, v in sorted(next(iter(single)))),
            )
    if len(set(mtus.values())) > 1:
        yield finding(
            "netif.mtu-mismatch",
            None,
            "cluster interface MTUs differ between nodes",
            ", ".join(f"{n}: {names[n]} mtu {m}" for n, m in sorted(mtus.items())),
        )


def in_force_ifnames(ctx: Context, name: str, f: Mapping[str, Any]) -> dict[str, list[str]]:
    """{interface: [what puts it in force]} on a node: ddp_socket_ifname, the env file's GLOO/TP_SOCKET_IFNAME
    (each name of the list) and NCCL_SOCKET_IFNAME (the first interface NCCL's grammar selects: its bootstrap's),
    else the automatic picks: NCCL's first interface in each version's order and Gloo's hostname address."""
    ifaces = f.get("interfaces") or []
    out: dict[str, list[str]] = {}
    configured = _configured_ifnames(ctx, name, f)
    for key, value in configured.items():
        if key == "NCCL_SOCKET_IFNAME":
            names = [str(i.get("name")) for i in nccl_select(value, ifaces)[:1]]
        else:
            names = [v for v in value.split(",") if v]
        for n in names:
            out.setdefault(n, []).append(f"{key}={value}")
    if not configured.get("NCCL_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
        for version in NCCL_AUTO_STEPS:
            got = nccl_autoselect(ifaces, version)
            if got and "NCCL's automatic pick" not in out.get(str(got[0][0].get("name")), []):
                out.setdefault(str(got[0][0].get("name")), []).append("NCCL's automatic pick")
    if not configured.get("GLOO_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
        bound = gloo_autoselect(f)
        owner = _owner(ifaces, bound) if bound else None
        if owner:
            out.setdefault(str(owner.get("name")), []).append(f"Gloo's automatic pick (the hostname's {bound})")
    return out


@rules(
    Rule(
        "netif.cannot-reach-peers",
        E,
        "the socket interface in force (ddp_socket_ifname, the env file's GLOO/NCCL/TP_SOCKET_IFNAME, or NCCL's or "
        "Gloo's automatic pick) did not reach some probed peer while another candidate interface reached them all "
        "(the interface reach probe: each planned peer dialled from each up IPv4 interface, bound to its device)",
        "Use {good} ({good_address}) on {node}, the interface that reached every probed peer: {how}. Then find why "
        "{bad} reaches no peer (cabling, switch port or VLAN, its address in the cluster network on an isolated link).",
        remedies=(ENV_FILE,),
        reads=_IFACES | _ENV,
        still_open="ddp_socket_ifname in the inventory names the failing interface: ddpfix keeps the inventory's "
                   "interface; change it, or find why that interface reaches no peer",
    ),
)
def check_interface_reach(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        reach = ctx.reach.get(name)
        if not ifreach.decisive(reach):
            continue
        assert reach is not None
        good = ifreach.reached_all(reach)
        if not good:
            continue  # no candidate reached every peer: the probe findings say what fails
        bad = {n: why for n, why in in_force_ifnames(ctx, name, f).items() if ifreach.failed(reach, n)}
        if not bad:
            continue
        planned = ctx.plan[name].ifname
        inside = [n for n in good if ctx.in_cidr(str(reach[n].get("address") or ""))] or good
        best = planned if planned in inside else inside[0]
        override = any(w.startswith("ddp_socket_ifname=") for ws in bad.values() for w in ws)
        how = (f"set ddp_socket_ifname: {best} for {name} in the inventory (ddpfix keeps the inventory's interface)"
               if override else
               f"NCCL_SOCKET_IFNAME=={best} and GLOO_SOCKET_IFNAME={best} in its env file (ddpfix remediate "
               "--apply writes them)")
        said = "; ".join(f"{n} ({', '.join(ws)}) did not reach {', '.join(sorted(ifreach.failed(reach, n)))}"
                         for n, ws in bad.items())
        yield finding(
            "netif.cannot-reach-peers",
            name,
            f"{said}, while {', '.join(good)} reached every probed peer",
            ifreach.describe(reach),
            good=best, good_address=reach[best].get("address"), node=name, how=how, bad=", ".join(bad),
        )


# ---------------------------------------------------------------- addresses, routes, sysctls


@rules(
    Rule(
        "route.via-gateway",
        W,
        "the route to a peer leaves through a gateway or another interface",
        "Make the peer on-link on the cluster interface (fix the netmask or remove the host route); not changed "
        "automatically.",
    ),
)
def check_routes(ctx: Context) -> Iterable[Finding]:
    for name, _f in ctx.audited():
        routes = (ctx.hosts[name].probe or {}).get("routes") or {}
        ifname = ctx.plan[name].ifname
        for dst, r in routes.items():  # run_checks sorts the findings
            if "error" in r or not (r.get("via") or (ifname and r.get("dev") != ifname)):
                continue
            peer = ctx.by_address.get(dst, dst)
            yield finding(
                "route.via-gateway",
                name,
                f"traffic from {name} to {peer} ({dst}) leaves via {r.get('via') or r.get('dev')} "
                f"instead of on-link on {ifname}",
                f"ip route get {dst}: dev {r.get('dev')}"
                + (f" via {r['via']}" if r.get("via") else "")
                + (f" src {r['src']}" if r.get("src") else ""),
            )


@rules(
    Rule(
        "addr.master-not-private",
        E,
        "an env file's MASTER_ADDR is not the master's address in the cluster CIDR",
        "Use the master's private address in {cidr} as MASTER_ADDR (ddpfix env --apply writes it).",
        remedies=(ENV_FILE,),
        reads=_ENV,
    ),
)
def check_master_addr(ctx: Context) -> Iterable[Finding]:
    want = ctx.plan[ctx.cluster.master].address if ctx.cluster.master in ctx.plan else None
    for name, f in ctx.audited():
        envf: Mapping[str, Any] = f.get("env_file") or {}
        env = envf.get("values") or {}
        got = env.get("MASTER_ADDR")
        if got and want and got != want:
            kind = "outside the cluster network" if not ctx.in_cidr(got) else "not the master's cluster address"
            yield finding(
                "addr.master-not-private",
                name,
                f"MASTER_ADDR={got} in {envf.get('path')} is {kind} ({ctx.cluster.master} is {want})",
                f"{envf.get('path')}: MASTER_ADDR={got}",
                cidr=ctx.cidr,
            )


@rules(
    Rule(
        "net.master-port-ephemeral",
        W,
        "the master port is inside the ephemeral range",
        "Choose a ddp_master_port outside net.ipv4.ip_local_port_range, or an outgoing socket may take it (errno 98).",
        reads=frozenset({"sysctl"}),
        master_only=True,
    ),
    Rule(
        "net.somaxconn-low",
        W,
        "`net.core.somaxconn` below the world size",
        "Raise net.core.somaxconn above the world size on the master (sysctl -w net.core.somaxconn={want} and persist "
        "it in /etc/sysctl.d/).",
        reads=frozenset({"sysctl"}),
        master_only=True,
    ),
)
def check_sysctls(ctx: Context) -> Iterable[Finding]:
    mf = ctx.facts.get(ctx.cluster.master)
    if not mf:
        return
    sc: Mapping[str, Any] = mf.get("sysctl") or {}
    lo, hi = sc.get("ip_local_port_range", [32768, 60999])
    if int(lo) <= ctx.cluster.master_port <= int(hi):
        yield finding(
            "net.master-port-ephemeral",
            ctx.cluster.master,
            f"MASTER_PORT {ctx.cluster.master_port} is inside the ephemeral range {lo}-{hi}",
            f"net.ipv4.ip_local_port_range = {lo} {hi}",
        )
    world = ctx.cluster.world_size
    if sc.get("somaxconn") and int(sc["somaxconn"]) < world:
        yield finding(
            "net.somaxconn-low",
            ctx.cluster.master,
            f"net.core.somaxconn={sc['somaxconn']} is below the world size {world}",
            f"net.core.somaxconn = {sc['somaxconn']}",
            want=max(4096, 2 * world),
        )


RP_FILTER_STRICT = 1  # net.ipv4.conf.*.rp_filter: 0 off, 1 strict (RFC 3704), 2 loose


@rules(
    Rule(
        "net.rp-filter-strict",
        W,
        "strict reverse-path filtering (rp_filter 1, the larger of conf.all and the interface's) on the cluster "
        "interface of a node with more than one IPv4 interface: cluster packets whose route back leaves by another "
        "interface are dropped without a trace",
        "Use loose mode on {ifname}: sysctl -w net.ipv4.conf.{ifname}.rp_filter=2 and persist it as "
        "net.ipv4.conf.{ifname}.rp_filter = 2 in /etc/sysctl.d/90-ddpfix-rp-filter.conf (the kernel uses the larger "
        "of conf.all and conf.{ifname}, so 2 wins over a strict conf.all). A warning, not an error: strict mode only "
        "drops a packet when the route back to its source leaves by another interface (a default route or "
        "host route on {others}), which depends on routes and peers' addresses. Not changed automatically.",
        reads=frozenset({"interfaces", "rp_filter"}),
    ),
)
def check_rp_filter(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        sysctl: Mapping[str, Any] = f.get("sysctl") or {}
        rp = sysctl.get("rp_filter")
        ifname = ctx.plan[name].ifname
        if not isinstance(rp, Mapping) or not ifname:
            continue  # facts of a ddpfix that did not read rp_filter; no cluster interface (netif.missing)
        homed = [
            i
            for i in f.get("interfaces") or []
            if _inet(i) and "LOOPBACK" not in (i.get("flags") or []) and "UP" in (i.get("flags") or [])
        ]
        if len(homed) < 2:
            continue
        try:
            values = {k: int(rp[k]) for k in ("all", ifname) if k in rp}
        except (TypeError, ValueError):
            continue
        if ifname not in values:
            continue
        effective = max(values.values())
        if effective != RP_FILTER_STRICT:
            continue
        others = [i["name"] for i in homed if i.get("name") != ifname]
        yield finding(
            "net.rp-filter-strict",
            name,
            f"{ifname}, the cluster interface of {name}, filters reverse paths strictly while {name} has "
            f"{len(homed)} IPv4 interfaces: cluster traffic whose route back leaves by "
            f"{', '.join(others)} is dropped",
            f"net.ipv4.conf.all.rp_filter = {values.get('all', '?')}, "
            f"net.ipv4.conf.{ifname}.rp_filter = {values[ifname]} (effective {effective}, strict); "
            "IPv4 interfaces: " + ", ".join(f"{i['name']} {','.join(_inet(i))}" for i in homed),
            ifname=ifname,
            others=", ".join(others),
        )


# ---------------------------------------------------------------- env files


@rules(
    Rule(
        "env.missing",
        INFO,
        "no env file yet (or one that sets none of the keys ddpfix writes)",
        "Write it: ddpfix env -i INVENTORY --apply (or ddpfix remediate --apply).",
        remedies=(ENV,),
        reads=_ENV,
    ),
    Rule(
        "env.inconsistent",
        E,
        "env files disagree between nodes, ranks duplicated / not 0..N-1, or differ from the plan",
        "Rewrite them: ddpfix env -i INVENTORY --apply.",
        remedies=(ENV,),
        reads=_ENV,
    ),
)
def check_env(ctx: Context) -> Iterable[Finding]:
    existing: dict[str, dict[str, str]] = {}
    for name, f in ctx.audited():
        ef: Mapping[str, Any] = f.get("env_file") or {}
        keys_set: Mapping[str, str] = ef.get("values") or {}
        if not ef.get("exists"):
            yield finding(
                "env.missing", name, f"{ef.get('path')} does not exist", f"stat {ef.get('path')}: no such file"
            )
        elif ef.get("readable", True) and not set(keys_set) & set(ctx.plan[name].env):
            # a file of the user's own (or another tool's) at that path: ddpfix's keys are missing, not inconsistent
            yield finding(
                "env.missing",
                name,
                f"{ef.get('path')} sets none of the keys ddpfix writes",
                f"{ef.get('path')}: {len(keys_set)} other key(s) ({', '.join(sorted(keys_set)[:5]) or 'none'}), "
                "kept when ddpfix adds its block",
            )
        else:
            existing[name] = dict(keys_set)
    if not existing:
        return
    for key in CLUSTER_KEYS:
        values = {n: v.get(key) for n, v in existing.items()}
        if len(set(values.values())) > 1:
            yield finding(
                "env.inconsistent",
                None,
                f"{key} differs between nodes' env files",
                ", ".join(f"{n}: {key}={v}" for n, v in sorted(values.items())),
            )
    ranks: dict[str, list[str]] = {}
    for n, v in existing.items():
        ranks.setdefault(v.get("NODE_RANK", ""), []).append(n)
    for r, ns in ranks.items():
        if len(ns) > 1 and r:  # an unset NODE_RANK is reported per node below, not as a duplicate
            yield finding(
                "env.inconsistent",
                None,
                f"NODE_RANK={r} is set on {len(ns)} nodes",
                ", ".join(f"{n}: NODE_RANK={r}" for n in sorted(ns)),
            )
    if len(existing) == len(ctx.cluster.nodes) and ctx.cluster.env_scope == "cluster":
        got = sorted(v.get("NODE_RANK", "") for v in existing.values())
        if got != sorted(str(i) for i in range(len(ctx.cluster.nodes))) and all(len(v) == 1 for v in ranks.values()):
            yield finding(
                "env.inconsistent",
                None,
                f"NODE_RANKs are not 0..{len(ctx.cluster.nodes) - 1}",
                "NODE_RANK values: " + ", ".join(got),
            )
    for n in sorted(existing):
        ef_n: Mapping[str, Any] = (ctx.facts[n] or {}).get("env_file") or {}
        # secret-looking values are compared by digest and shown as *** (env_differs): never the wanted value
        judged = env_judge(ef_n, ctx.plan[n], ctx.cluster.env_template)  # the template's keys when it has one
        diff = [f"{k}={got} (want {shown})" for k, got, shown in judged.differs]
        if ctx.cluster.env_scope == "node":  # a node-global file must not pin a job's launch values
            diff += [f"{k}={v} (per job: not in the file with ddp_env_scope: node)"
                     for k, v in sorted((ef_n.get("managed") or {}).items()) if k in LAUNCH_KEYS]
        if diff:
            yield finding(
                "env.inconsistent",
                n,
                f"{(ctx.facts[n] or {}).get('env_file', {}).get('path')} differs from what ddpfix would write",
                "; ".join(diff),
            )


@rules(
    Rule(
        "slurm.node-count-mismatch",
        E,
        "the Slurm allocation's node count (SLURM_JOB_NUM_NODES, SLURM_NNODES, SLURM_STEP_NUM_NODES) is not the "
        "number of nodes its node list expands to (audit --slurm)",
        "Run ddpfix inside one job step of one job, where srun sets that step's own SLURM_* variables; in a "
        "heterogeneous job name the components that train with --het-group (DDPFIX_HET_GROUP). env --slurm, "
        "remediate --slurm and inventory slurm refuse these variables (exit 2): a launch from them gets a wrong world "
        "size.",
    ),
)
def check_slurm_allocation(ctx: Context) -> Iterable[Finding]:
    """The allocation the --slurm audit checks: its declared node count against its node list (slurm.py, which
    puts a disagreement into the inventory it writes instead of refusing, for the audit only)."""
    why = ctx.cluster.slurm_count_mismatch
    if why:
        yield finding("slurm.node-count-mismatch", None, f"the Slurm allocation's variables disagree: {why}", why)


def run_checks(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for reg in registry.registered():
        own = {r.id for r in reg.rules}
        for f in reg.check(ctx):
            if f.id not in own:  # a programming error: every id is declared by the check that reports it
                raise AssertionError(f"{reg.check.__name__} reported {f.id}, which it does not declare")
            if not _from_placeholder(ctx, f):
                out.append(f)
    return sorted(dict.fromkeys(out), key=sort_key)


def _from_placeholder(ctx: Context, f: Finding) -> bool:
    """A per-host finding computed from a source that was not read on that host (and not sound on partial facts)."""
    rule = registry.RULES[f.id]
    if f.host is None or rule.sound_on_partial or not rule.reads:
        return False
    return bool(rule.reads & set(ctx.unread(f.host)))


def parse_event_time(created: str) -> float | None:
    try:
        dt = datetime.fromisoformat(created)
    except (TypeError, ValueError):
        return None
    if dt.tzinfo is None:  # ansible-runner stamps events in naive UTC
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
