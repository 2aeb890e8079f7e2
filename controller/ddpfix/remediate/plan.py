"""Remediation's plan: which fixes each host gets, from the audit's findings (`build_plan`, `HostPlan`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpfix.envtemplate import write_needed
from ddpfix.firewall import firewalld as fwd
from ddpfix.firewall.egressfix import egress_fix
from ddpfix.firewall.ingressfix import ingress_fix
from ddpfix.model.finding import Finding
from ddpfix.plan import env_comment, env_not_ours, env_refusal
from ddpfix.rules.context import Context, not_read
from ddpfix.rules.firewall import EGRESS_BLOCKED, FIREWALL_SOURCES, active_firewalls, ufw_managed
from ddpfix.rules.reachability import INCOMPLETE
from ddpfix.rules.registry import fixed_by

# Which findings turn on which part of the plan: from the rule registry (each rule's Remedy.plan).
FIREWALL_IDS = fixed_by("firewall", on_target=False)  # fixed on the finding's host
PROBE_IDS = fixed_by("firewall", on_target=True)  # fixed on the node the probe could not reach
EGRESS_IDS = frozenset({EGRESS_BLOCKED.id})  # fixed on the sending node, in what restricts its egress
HOSTS_IDS = fixed_by("hosts")
TIME_IDS = fixed_by("time")
LIMITS_IDS = fixed_by("limits")
NOFILE_IDS = fixed_by("nofile")
ARP_IDS = fixed_by("arp")
ENV_IDS = fixed_by("env")
#: The findings each file of ddpfix_node_files fixes (its result's `key`): the hosts block's and the env file's.
FILE_RULES = {"hosts": tuple(sorted(HOSTS_IDS)), "env": tuple(sorted(ENV_IDS)), "cluster_file": tuple(sorted(ENV_IDS)),
              "nofile": tuple(sorted(NOFILE_IDS)), "memlock": tuple(sorted(LIMITS_IDS))}


@dataclass
class HostPlan:
    firewall: str = "none"  # firewalld | iptables | iptables-legacy | nftables | none
    hosts: bool = False
    time: bool = False
    env: dict[str, str] = field(default_factory=dict)  # the env file's managed block; empty: not written
    env_comment: str = ""
    env_key_comments: dict[str, str] = field(default_factory=dict)  # KEY -> why (a comment above it in the block)
    pin_ifname: dict[str, str] | None = None  # {"name", "mac"}: systemd .link file (--pin-ifnames)
    limits: bool = False  # memlock drop-in (LIMITS_IDS)
    nofile: dict[str, str] = field(default_factory=dict)  # {soft, hard, unit_hard}: NOFILE_IDS; empty: off
    arp: list[str] = field(default_factory=list)  # cluster interfaces given arp_ignore 1/arp_announce 2 (ARP_IDS)
    notes: list[str] = field(default_factory=list)
    #: firewalld: the changes `firewalld_fix` planned ({zone|policy, source|rich_rule}); empty: the cluster CIDR as a
    #: source of the role's ddpfix_firewall_zone
    firewalld: list[dict[str, str]] = field(default_factory=list)
    #: nftables/iptables: the egress accepts `egressfix.egress_fix` planned ({backend, family, table, chain, ports})
    egress: list[dict[str, str]] = field(default_factory=list)
    ingress: bool = True  # nftables/iptables: whether the cluster is let in too (False: only egress is fixed)
    #: nftables: the input base chains that take ddpfix's accept ({family, table, chain}), as `ingressfix` proved them
    nft_chains: list[dict[str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return (self.firewall == "none" and not self.hosts and not self.time and not self.env and not self.pin_ifname
                and not self.limits and not self.nofile and not self.arp)

    @property
    def previewable(self) -> bool:
        """Its fixes are the env file (and the cluster file) and the open-file limit's drop-ins, or one of them: what
        remediate's dry run can compute from the audit's facts (`preview`)."""
        return bool(self.env or self.nofile) and (
            self.firewall == "none" and not self.hosts and not self.time and not self.pin_ifname
            and not self.limits and not self.arp)

    @property
    def env_only(self) -> bool:
        """Its one fix is the env file (and the cluster file next to it)."""
        return bool(self.env) and not self.nofile and self.previewable

    @property
    def per_node(self) -> bool:
        """It has a fix of remediate.yml's per-node play (else the node's pre-flight is all that play does there).
        The limits drop-ins are not: ddpfix_node_files writes them in the cluster-wide play's call (`files`)."""
        return self.firewall != "none" or self.time or bool(self.arp) or self.pin_ifname is not None

    def to_vars(self) -> dict[str, Any]:
        return {"firewall": self.firewall, "hosts": self.hosts, "time": self.time, "env": self.env,
                "per_node": self.per_node,
                "env_comment": self.env_comment,
                "env_key_comments": self.env_key_comments, "pin_ifname": self.pin_ifname, "limits": self.limits,
                "nofile": self.nofile, "arp": self.arp, "firewalld": self.firewalld, "egress": self.egress,
                "ingress": self.ingress, "nft_chains": self.nft_chains,
                "firewalld_files": firewalld_files(self.firewalld)}


def firewalld_files(changes: Iterable[Mapping[str, str]]) -> list[str]:
    """The permanent configuration files firewalld writes for the planned changes (the write pre-flight's)."""
    return sorted({f"/etc/firewalld/zones/{c['zone']}.xml" if "zone" in c else
                   f"/etc/firewalld/policies/{c['policy']}.xml" for c in changes if c.get("zone", "x")})


def firewalld_fix(ctx: Context, name: str, facts: Mapping[str, Any], ingress: bool,
                  egress: bool) -> tuple[list[dict[str, str]], list[str]]:
    """firewalld on `name`: the changes that let the cluster in (and out) where the node's configuration keeps it,
    or the refusals naming what ddpfix cannot change (`ddpfix.firewall.firewalld.plan_fix`)."""
    fw = (facts.get("firewall") or {}).get("firewalld")
    if not isinstance(fw, Mapping) or not ctx.cidr:
        return [], []
    own = ctx.plan[name].address
    peers = [a for n, _ in ctx.audited() if n != name and (a := ctx.plan[n].address)][: ctx.thresholds.max_sources]
    lo, hi = (facts.get("sysctl") or {}).get("ip_local_port_range", [32768, 60999])
    plan = fwd.plan_fix(fwd.Firewalld.of(fw), ctx.cidr, node=name, iface=(facts.get("cluster") or {}).get("ifname"),
                        own=own, peers=peers or ([own] if own else []),
                        ports=[ctx.cluster.master_port, int(lo), (int(lo) + int(hi)) // 2, int(hi)],
                        ingress=ingress, egress=egress)
    return [c.to_vars() for c in plan.changes], plan.refusals


def firewall_backend(state: Mapping[str, Any], configured: str, blocking_layers: set[str]) -> str:
    """Which firewall to change: the inventory's ddp_firewall, else the layer the audit found blocking,
    else the one that holds rules (firewalld before iptables before native nftables). `iptables-legacy`: the legacy
    tables block while `iptables` is the nft variant (the rule must go where the blocking rules are). `ufw`: ufw
    loaded the tables of that iptables variant (its chains, rebuilt from /etc/ufw at every reload and boot): the rule
    goes in through ufw."""
    backend = _firewall_backend(state, configured, blocking_layers)
    return "ufw" if backend in ("iptables", "iptables-legacy") and ufw_managed(state, backend) else backend


def _firewall_backend(state: Mapping[str, Any], configured: str, blocking_layers: set[str]) -> str:
    if configured in ("firewalld", "iptables", "nftables", "none"):
        if configured == "iptables" and "iptables-legacy" in blocking_layers and "iptables" not in blocking_layers:
            return "iptables-legacy"
        return configured
    for layer in ("firewalld", "iptables", "iptables-legacy", "nftables"):
        if layer in blocking_layers:
            return layer
    active = active_firewalls(state)
    if "firewalld" in active:
        return "firewalld"
    if "iptables" in active:  # only the legacy tables hold rules: change those (iptables-legacy, its save file)
        return "iptables" if (state.get("iptables") or "").strip() else "iptables-legacy"
    if "nft" in active:
        return "nftables"
    return "none"


def nft_ingress(ctx: Context, name: str, facts: Mapping[str, Any], findings: Iterable[Finding]) -> tuple[
        list[dict[str, str]], str]:
    """The native nftables input base chains of `name` that take ddpfix's accept ({family, table, chain}), decided by
    the audit's evaluator (`ddpfix.firewall.ingressfix`), or why ddpfix cannot fix its nftables block (refused before
    anything changes: names the rule, its owner and what an operator would run)."""
    ev = next((f.evidence for f in findings if f.host == name and f.id in FIREWALL_IDS), "the blocking rule")
    return ingress_fix(ctx, name, facts, ev)


def build_plan(ctx: Context, findings: Iterable[Finding], *, only: set[str] | None = None,
               env: bool = True, allow_partial: bool = False,
               pin_ifnames: bool = False) -> tuple[dict[str, HostPlan], list[str]]:
    """Per-host fixes for the findings. Returns (plans, refusals)."""
    fl = [f for f in findings if only is None or f.id in only]
    ids_by_host: dict[str | None, set[str]] = {}
    for f in fl:
        ids_by_host.setdefault(f.host, set()).add(f.id)
    # a connect that the dialler's own egress refused (EGRESS_IDS) says nothing about its target
    egress_blocked = {f.host for f in fl if f.id in EGRESS_IDS}
    failed_targets = {
        c.get("name")
        for n, h in ctx.hosts.items()
        if n not in egress_blocked
        for c in ((h.probe or {}).get("connects") or [])
        if not c.get("ok")
    }
    all_ids = {f.id for f in fl}
    refusals: list[str] = []
    audited = dict(ctx.audited())
    # unreachable nodes (read but no facts); nodes outside --limit are not written, and need not be read
    missing = [n.name for n in ctx.cluster.nodes if n.name in ctx.hosts and n.name not in audited]
    write_env = env and (only is None or bool(only & ENV_IDS))
    if write_env and missing and not allow_partial:
        refusals.append(f"env files not written: {not_read(ctx, missing)}, the rank set would be incomplete "
                        "(pass --allow-partial to write the reachable nodes' files; ranks never shift)")
        write_env = False
    not_ours = {
        n: why for n, f in audited.items() if (why := env_not_ours(f.get("env_file") or {}, ctx.cluster.env_adopt))
    }
    if write_env and not_ours:
        refusals.append("env files not written (on no node, so ranks stay consistent): " + env_refusal(not_ours))
        write_env = False
    if write_env and not ctx.plan[ctx.cluster.master].address:
        refusals.append(f"env files not written: {master_unknown(ctx)}")
        write_env = False
    hosts_needed = bool(all_ids & HOSTS_IDS) and (only is None or bool(only & HOSTS_IDS))
    unknown = [p.name for p in ctx.plan.values() if p.name not in audited and not p.address]
    if hosts_needed and unknown:
        refusals.append(
            f"/etc/hosts block not written: {', '.join(unknown)} not read and no ansible_host inside "
            f"{ctx.cidr or 'the cluster network'} to take its address from; its line would vanish from "
            "its peers' blocks (run without --limit, or set ansible_host to its cluster address)"
        )
        hosts_needed = False
    time_needed_any = bool(all_ids & TIME_IDS)
    plans: dict[str, HostPlan] = {}
    for name, facts in audited.items():
        hp = HostPlan()
        mine = ids_by_host.get(name, set())
        blocks = bool(mine & FIREWALL_IDS) or (
            name in failed_targets and (only is None or bool(only & (PROBE_IDS | FIREWALL_IDS)))
        )
        if blocks:
            layers = {dict(f.fix_vars).get("layer", "") for f in fl if f.host == name and f.id in FIREWALL_IDS}
            hp.firewall = firewall_backend(facts.get("firewall") or {}, ctx.cluster.firewall, layers)
            hp.ingress = bool((mine & FIREWALL_IDS) - EGRESS_IDS) or name in failed_targets
            why = ""
            if hp.firewall == "nftables" and hp.ingress:
                hp.nft_chains, why = nft_ingress(ctx, name, facts, fl)
            if why:
                hp.firewall = "none"
                hp.notes.append(why)
            unread_fw = sorted(s for s in ctx.unread(name) if s in FIREWALL_SOURCES)
            if hp.firewall == "none" and unread_fw:
                hp.notes.append(
                    f"traffic is blocked but the firewall could not be read ({', '.join(unread_fw)}, see "
                    f"{INCOMPLETE.id}): nothing changed there"
                )
            elif hp.firewall == "none":
                hp.notes.append(
                    "traffic is blocked but no firewalld/iptables/nftables rule set was found to change: "
                    "check host-external firewalls (security groups) by hand"
                )
            if hp.firewall == "firewalld":
                egress = EGRESS_IDS & mine
                ingress = bool((mine & FIREWALL_IDS) - EGRESS_IDS) or name in failed_targets
                hp.firewalld, refused = firewalld_fix(ctx, name, facts, ingress, bool(egress))
                if refused:  # nothing of this node's firewall is changed
                    refusals.extend(refused)
                    hp.firewall, hp.firewalld = "none", []
                    hp.notes.append("firewall not changed: " + refused[0])
            elif hp.firewall != "none" and EGRESS_IDS & mine:  # nftables / iptables: ddpfix.firewall.egressfix
                hp.egress, refused = egress_fix(ctx, name, facts, hp.firewall)
                if refused:  # nothing of this node's firewall is changed
                    refusals.extend(refused)
                    hp.firewall, hp.egress = "none", []
                    hp.notes.append("firewall not changed: " + refused[0])
        hp.hosts = hosts_needed
        hp.limits = bool(mine & LIMITS_IDS)
        hp.nofile, hp.arp = host_setting_fixes(fl, name)
        hp.time = bool(mine & TIME_IDS) or (
            time_needed_any and ctx.cluster.ntp_local_master and name == ctx.cluster.master
        )
        if write_env and ctx.plan[name].address and ctx.plan[ctx.cluster.master].address and write_needed(
            facts.get("env_file") or {}, ctx.plan[name], ctx.cluster.env_template
        ):  # only nodes whose block differs
            hp.env = dict(ctx.plan[name].env)
            hp.env_comment = env_comment(ctx.plan[name])
            hp.env_key_comments = dict(ctx.plan[name].comments)
        if pin_ifnames and ctx.plan[name].ifname:
            ifname = str(ctx.plan[name].ifname)
            mac, why_not = pin_target(facts.get("interfaces") or [], ifname)
            if mac:
                hp.pin_ifname = {"name": ifname, "mac": mac}
                hp.notes.append(f"{ifname} pinned to {mac} by a systemd .link file: takes effect at the next boot")
            else:
                hp.notes.append(f"{ifname} not pinned: {why_not}")
        plans[name] = hp
    return plans, refusals


def host_setting_fixes(findings: Iterable[Finding], name: str) -> tuple[dict[str, str], list[str]]:
    """The values the open-files limit and ARP-flux fixes (NOFILE_IDS, ARP_IDS) write on `name`, as their checks
    reported them."""
    nofile: dict[str, str] = {}
    arp: list[str] = []
    for f in findings:
        if f.host == name and f.id in NOFILE_IDS:
            nofile = {"soft": f.var("value") or "", "hard": f.var("hard") or "0", "unit_hard": f.var("unit_hard") or ""}
        elif f.host == name and f.id in ARP_IDS:
            arp = sorted(set((f.var("ifaces") or "").split(",")) - {""})
    return nofile, arp


def master_unknown(ctx: Context) -> str:
    m = ctx.cluster.master_node
    why = "was not read" if m.name not in dict(ctx.audited()) else "has no address in the cluster network"
    return (
        f"MASTER_ADDR unknown: the master {m.name} {why} and its ansible_host {m.address!r} is not an address "
        f"inside {ctx.cidr or 'the cluster network (set ddp_cluster_cidr)'}"
    )


def pin_target(interfaces: Sequence[Mapping[str, Any]], ifname: str) -> tuple[str | None, str]:
    """The permanent MAC to pin `ifname` to, or (None, why not).

    Only a physical NIC (a bus device, no virtual kind) with a permanent MAC that no other interface of the node
    carries: a bridge, bond or VLAN takes its port's MAC, so a MAC-matched .link file would rename it instead.
    """
    iface = next((i for i in interfaces if i.get("name") == ifname), None)
    if iface is None:
        return None, "not found among the node's interfaces"
    if "physical" not in iface:
        return None, "the facts do not say whether it is a physical NIC (audit again with this ddpfix version)"
    if not iface.get("physical"):
        return None, (
            f"it is a {iface.get('kind') or 'virtual'} interface, not a physical NIC; only physical NICs are "
            "pinned (bridges, bonds, VLANs and veths share or get their MAC from another device)"
        )
    mac = str(iface.get("permaddr") or "").lower()
    if not mac or mac == "00:00:00:00:00:00":
        return None, "it has no permanent MAC address"
    others = sorted(
        str(i.get("name"))
        for i in interfaces
        if i is not iface and mac in {str(i.get("mac") or "").lower(), str(i.get("permaddr") or "").lower()}
    )
    if others:
        return None, (
            f"its permanent MAC {mac} is also on {', '.join(others)} (a bridge, bond or VLAN on top of it): "
            "a MAC-matched .link file could rename that device instead"
        )
    return mac, ""
