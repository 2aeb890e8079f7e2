"""Remediation: turn an audit into a per-host plan of fixes, run it (check+diff or apply), re-audit."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpfix import clusterfile, paths
from ddpfix.ansible.collection import module_utils
from ddpfix.ansible.results import RunResult, is_node_lock_task, module_failure
from ddpfix.ansible.run import run_playbook
from ddpfix.audit import AuditResult
from ddpfix.envtemplate import render_body, template_path, write_needed
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.firewall import firewalld as fwd
from ddpfix.inventory.contract import ACK_BROAD, cidr_needs_ack
from ddpfix.model.finding import Finding
from ddpfix.plan import env_comment, env_not_ours, env_refusal, envfile_lib, hosts_entries, redact_env
from ddpfix.progress import Progress
from ddpfix.rules.context import Context, not_read
from ddpfix.rules.firewall import EGRESS_BLOCKED, FIREWALL_SOURCES, active_firewalls, ufw_managed
from ddpfix.rules.host import NOFILE_LOW
from ddpfix.rules.reachability import INCOMPLETE, INVALID
from ddpfix.rules.registry import RULES, fixed_by

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
FILE_RULES = {"hosts": tuple(sorted(HOSTS_IDS)), "env": tuple(sorted(ENV_IDS)), "cluster_file": tuple(sorted(ENV_IDS))}


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

    def to_vars(self) -> dict[str, Any]:
        return {"firewall": self.firewall, "hosts": self.hosts, "time": self.time, "env": self.env,
                "env_comment": self.env_comment,
                "env_key_comments": self.env_key_comments, "pin_ifname": self.pin_ifname, "limits": self.limits,
                "nofile": self.nofile, "arp": self.arp, "firewalld": self.firewalld,
                "firewalld_files": firewalld_files(self.firewalld)}


@dataclass
class Change:
    host: str
    task: str
    diff: str
    rules: tuple[str, ...] = ()  # the ids of the findings the change fixes (its task's rule-id tags, or its file's)


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


def nft_unfixable(state: Mapping[str, Any], findings: Iterable[Finding], name: str, cidr: str) -> str:
    """Why ddpfix cannot fix `name`'s nftables block (refused before anything changes), or "": no native input base
    chain that drops would take ddpfix's rule (the blocking table is iptables-nft's, firewalld's, or on a hook ddpfix
    does not change). Names the rule, its owner and what an operator would run."""
    fw = module_utils("ddpfix_fw")
    nft = state.get("nft") or {}
    owned = fw.nft_iptables_owned(nft, fw.iptables_nft_tables(state.get("iptables")),
                                  fw.iptables_nft_tables(state.get("ip6tables")))
    if fw.nft_blocking_input_chains(nft, owned):
        return ""
    ev = next((f.evidence for f in findings if f.host == name and f.id in FIREWALL_IDS), "the blocking rule")
    return (f"firewall not changed: {ev} is in a table ddpfix does not own as nftables ("
            f"{', '.join(' '.join(k) for k in sorted(owned)) or 'no native input base chain that drops'}); "
            f"add the accept where its owner keeps it (iptables-nft: iptables -I INPUT -s {cidr} -j ACCEPT and "
            f"its save file; a native table: nft insert rule <family> <table> <chain> ip saddr {cidr} accept in "
            "the file nftables.service loads)")


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
            why = nft_unfixable(facts.get("firewall") or {}, fl, name, ctx.cidr or "CIDR") if (
                hp.firewall == "nftables") else ""
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


def preflight(ctx: Context, plans: dict[str, HostPlan], *, apply: bool) -> None:
    """Refuse (exit 2, nothing touched) what must never reach a node: bad facts, an unknown, IPv6 or unacknowledged
    broad cluster CIDR. Runs after the read-only audit, before the remediation play."""
    c = ctx.cluster
    for host, problems in ctx.invalid.items():
        fact, value, why = problems[0]
        raise DdpfixError(
            f"{host} returned {fact} {value!r}: {why} ({INVALID.id}); nothing was changed on any node",
            ExitCode.INVALID_INPUT,
        )
    if not ctx.cidr:
        extra = f": the master {c.master} was not read" if c.master not in dict(ctx.audited()) else ""
        raise DdpfixError(
            f"cannot remediate: the cluster network is unknown{extra} (set ddp_cluster_cidr)", ExitCode.INVALID_INPUT
        )
    if ctx.net is not None and ctx.net.version == 6:
        raise DdpfixError(
            f"cannot remediate: the cluster network {ctx.cidr} is IPv6; ddpfix's firewall fixes are "
            "IPv4 only (set ddp_cluster_cidr to the cluster's IPv4 network)",
            ExitCode.INVALID_INPUT,
        )
    broad = cidr_needs_ack(ctx.cidr)
    if apply and broad and not c.cidr_ack_broad and any(p.firewall != "none" for p in plans.values()):
        raise DdpfixError(
            f"ddp_cluster_cidr {ctx.cidr!r} {broad}: "
            f"opening the firewall to it needs {ACK_BROAD}: true in the inventory",
            ExitCode.INVALID_INPUT,
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


def remediate_extravars(ctx: Context, plans: dict[str, HostPlan]) -> dict[str, Any]:
    c = ctx.cluster
    return {
        "ddpfix_plan": {h: p.to_vars() for h, p in plans.items()},
        "ddpfix_cidr": ctx.cidr or "",
        "ddpfix_hosts": hosts_entries(ctx.plan),
        "ddpfix_master": c.master,
        "ddpfix_master_address": ctx.plan[c.master].address if c.master in ctx.plan else "",
        "ddpfix_ntp_servers": list(c.ntp_servers),
        "ddpfix_ntp_local_master": c.ntp_local_master,
        "ddpfix_env_path": c.env_path,
        "ddpfix_env_adopt": c.env_adopt,
        "ddpfix_env_template": template_path(c.env_template),
        "ddpfix_env_cluster": clusterfile.build(ctx),
    }


def run_remediation(
    ctx: Context,
    plans: dict[str, HostPlan],
    *,
    apply: bool,
    limit: str | None,
    forks: int | None,
    verbosity: int,
    progress: Progress | None,
    interruptible: bool = False,
) -> tuple[RunResult, list[Change]]:
    preflight(ctx, plans, apply=apply)
    run = run_playbook(
        "remediate.yml",
        ctx.cluster.inventories,
        # the planned hosts are the play's target (in the extravars file), the user's --limit stays the limit:
        # no host list on the command line, whatever the cluster's size
        extravars={**remediate_extravars(ctx, plans), "ddpfix_target": ",".join(plans) or "none",
                   # their pre-flight is done (facts_preflight): no lock-and-pre-flight call in the per-node play
                   "ddpfix_remediate_checked": remediate_checked(ctx, plans)},
        limit=limit,
        forks=forks,
        n_hosts=len(plans),
        check=not apply,
        diff=True,
        verbosity=verbosity,
        on_event=progress.on_event if progress else None,
        name="remediate" if apply else "remediate-check",
        interruptible=interruptible,
    )
    for host, hr in run.hosts.items():  # e.g. "runtime only: ..." from the firewall role
        for t in hr.tasks:
            note = t.res.get("ddpfix_note") if isinstance(t.res, dict) else None
            if note and host in plans and str(note) not in plans[host].notes:
                plans[host].notes.append(str(note))
    return run, changes_of(run)


#: The step whose failure the dry run reports when the facts say a file cannot be written (the play's pre-flight).
PREFLIGHT_STEP = "Lock | Preflight | Files to be written are writable"


def facts_preflight(ctx: Context, plans: dict[str, HostPlan], *,
                    nofile: bool = False) -> tuple[set[str], dict[str, str]]:
    """The write pre-flight of the nodes whose only fix is their env file (and cluster.json), from the audit's facts
    (`env_file.unwritable`: what of the two cannot be written, and the node lock when the audit could not take it,
    read moments before): (the nodes it covers, the failures as failures_of words them). When it finds no failure,
    such nodes skip the per-node play's lock-and-pre-flight call (ddpfix_node_files checks their files again, under
    the lock, before it writes any); with a failure every node goes through the play's pre-flight, which stops the
    run everywhere before any change and names each node's reason. With `nofile` (the dry run's preview) it also
    covers the nodes whose fixes include the open-file limit's drop-ins (`limits.nofile_dropins.unwritable`)."""
    checked: set[str] = set()
    failed: dict[str, str] = {}
    for host, hp in plans.items():
        facts: Mapping[str, Any] = ctx.facts.get(host) or {}
        parts = ([(facts.get("env_file") or {}).get("unwritable")] if hp.env else []) + (
            [((facts.get("limits") or {}).get("nofile_dropins") or {}).get("unwritable")] if hp.nofile else [])
        if not (hp.previewable if nofile else hp.env_only) or not all(isinstance(x, Mapping) for x in parts):
            continue  # another fix (the play's pre-flight covers every file), or facts from an older ddpfix
        checked.add(host)
        bad = {k: v for x in parts if isinstance(x, Mapping) for k, v in x.items()}
        if bad:
            failed[host] = (f"{PREFLIGHT_STEP}: cannot write: "
                            + "; ".join(f"{k} ({v})" for k, v in sorted(bad.items()))
                            + "; nothing was changed on any node")
    return checked, failed


def remediate_checked(ctx: Context, plans: dict[str, HostPlan]) -> list[str]:
    """The nodes that skip the per-node play: facts_preflight's, when it found no failure anywhere."""
    checked, failed = facts_preflight(ctx, plans)
    return [] if failed else sorted(checked)


def preview(ctx: Context, plans: dict[str, HostPlan]) -> tuple[list[Change], dict[str, str], dict[str, HostPlan]]:
    """The dry run's changes computed here, from what the audit read, where that is enough: a node whose fixes are
    its env file (and the cluster file next to it) and the open-file limit's drop-ins, or one of them, whose facts
    carry the files' text (the env file redacted) and what of them cannot be written. The env file's new text comes
    from the same merge the node's module runs (module_utils ddpfix_envfile), the drop-ins' from the role's own
    templates (`nofile_files`). Returns (changes, failures as failures_of words them, the plans left for the
    check-mode play)."""
    checked, failed = facts_preflight(ctx, plans, nofile=True)
    if failed:  # the play's pre-flight words it, on every node, as --apply would meet it
        return [], {}, plans
    changes: list[Change] = []
    rest: dict[str, HostPlan] = {}
    for host, hp in plans.items():
        mine = _env_preview(ctx, host) if host in checked and hp.env else []
        if host in checked and hp.nofile and mine is not None:
            more = _nofile_preview(ctx, host, hp)
            mine = None if more is None else mine + more
        if host not in checked or mine is None:
            rest[host] = hp  # another fix, or facts from an older ddpfix or too large a file: the node is asked
            continue
        changes += mine
    return changes, failed, rest


def _env_preview(ctx: Context, host: str) -> list[Change] | None:
    """The env file's and the cluster file's changes on `host`, or None when its facts cannot tell them."""
    c = ctx.cluster
    lib, what = envfile_lib(), module_utils("ddpfix_files").WHAT
    ef: dict[str, Any] = dict((ctx.facts.get(host) or {}).get("env_file") or {})
    cf: dict[str, Any] = dict(ef.get("cluster_file") or {})
    if ("text" not in ef or "exists" not in cf
            or (ef.get("exists") and ef.get("text") is None) or (cf["exists"] and cf.get("text") is None)):
        return None
    path = c.env_path
    target = str(ef.get("target") or path)
    before = str(ef.get("text") or "")
    lines, values = render_body(c.env_template, ctx.plan[host])
    try:
        after, _ = lib.merge(before, values, "", adopt=lib.may_adopt(path, target, c.env_adopt),
                             block=lib.body_block(lines))
    except lib.NotOurs:
        return None  # the module words the refusal
    out = [Change(host, what["env"].format(path=path), render_diff(
        {"before": before, "after": after, "before_header": target if ef.get("exists") else "/dev/null",
         "after_header": target}), FILE_RULES["env"])]
    cluster_path = clusterfile.path_for(c.env_path)
    cluster_text = clusterfile.text(clusterfile.build(ctx))
    if not cf["exists"] or cf.get("text") != cluster_text:
        out.append(Change(host, what["cluster_file"].format(path=cluster_path), render_diff(
            {"before": str(cf.get("text") or ""), "after": cluster_text,
             "before_header": cluster_path if cf["exists"] else "/dev/null", "after_header": cluster_path}),
            FILE_RULES["cluster_file"]))
    return out


def _nofile_preview(ctx: Context, host: str, hp: HostPlan) -> list[Change] | None:
    """The open-file limit's drop-ins that change on `host`, or None when its facts cannot tell them."""
    dropins = ((ctx.facts.get(host) or {}).get("limits") or {}).get("nofile_dropins")
    if not isinstance(dropins, Mapping):
        return None
    files = nofile_files(hp.nofile, dropins)
    if files is None or any(f["exists"] and f.get("text") is None for _, f, _ in files):
        return None
    rules = (NOFILE_LOW.id,)
    return [Change(host, task, render_diff({"before": str(f.get("text") or ""), "after": text,
                                            "before_header": f["path"] if f["exists"] else "/dev/null",
                                            "after_header": f["path"]}), rules)
            for task, f, text in files if not f["exists"] or f.get("text") != text]


#: the open-file limit's fix (role ddpfix_limits, tasks_from nofile): its task names, as the check-mode play names them
NOFILE_TASK = f"Fix {NOFILE_LOW.id} | Write {{path}}"
UNIT_NOFILE_TASK = f"Fix {NOFILE_LOW.id} | LimitNOFILE drop-in for launcher units ({{unit}})"
#: the values the role's input check accepts (its first task): soft, hard (0: no hard line), the units' hard
_NOFILE_VALUES = {"soft": re.compile(r"[0-9]+"), "hard": re.compile(r"[0-9]+"),
                  "unit_hard": re.compile(r"[0-9]+|infinity")}


@functools.cache
def _limits_templates() -> Any:
    """The role ddpfix_limits' templates as its template tasks render them (trim_blocks, the trailing newline kept):
    one jinja2 environment per process, its templates compiled once for every node of a dry run."""
    # CLI start: jinja2 loads only where a dry run renders a drop-in
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.roles_dir() / "ddpfix_limits" / "templates")),
                              trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
                              autoescape=False)


def nofile_files(nofile: Mapping[str, str],
                 dropins: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]] | None:
    """What the open-file limit's fix writes on a node, rendered from the role's own templates as its template tasks
    render them (trim_blocks, the trailing newline kept; their first line is fixed, not ansible_managed): (task, the
    file as the audit read it (`limits.nofile_dropins`), its new text) for the pam_limits drop-in and each launcher
    unit's. None for values the role's input check refuses (the play then says so)."""
    if not all(rx.fullmatch(str(nofile.get(k, ""))) for k, rx in _NOFILE_VALUES.items()) or not (
            1024 <= int(nofile["soft"]) <= 1048576):
        return None
    env = _limits_templates()
    values = {"ddpfix_limits_nofile": str(nofile["soft"]), "ddpfix_limits_nofile_hard": str(nofile["hard"]),
              "ddpfix_limits_nofile_unit_hard": str(nofile["unit_hard"])}
    pam = dropins["pam"]
    unit_text = env.get_template("unit-nofile.conf.j2").render(values)
    return [(NOFILE_TASK.format(path=pam["path"]), pam, env.get_template("nofile.conf.j2").render(values))] + [
        (UNIT_NOFILE_TASK.format(unit=u), f, unit_text) for u, f in sorted(dropins["units"].items())]


def failures_of(run: RunResult) -> dict[str, str]:
    """host -> 'STEP: message' for every host that failed or was unreachable (STEP: the task it failed at)."""
    out: dict[str, str] = {}
    for h, r in sorted(run.hosts.items()):
        if not (r.failed or r.unreachable):
            continue
        # the last failure of a step (a rescue's report, e.g. "reverted"); a node lock release failing afterwards
        # (the node went away) only follows from it
        failures = [t for t in r.tasks if t.status in ("failed", "unreachable")]
        bad = next((t for t in reversed(failures) if not is_node_lock_task(t)), failures[-1] if failures else None)
        if bad is None:
            out[h] = r.message
            continue
        msg = (module_failure(bad.res) or bad.res.get("msg") or bad.res.get("stderr") or r.message
               if isinstance(bad.res, dict) else r.message)  # a module that broke on the node: its own error
        out[h] = f"{bad.task}: {' '.join(str(msg).split())[:800]}"
    return out


def cluster_files_refusal(plans: dict[str, HostPlan], failed: dict[str, str]) -> str | None:
    """The all-or-none rule of remediate.yml, in words: when any node failed, no node got the hosts block or env
    file."""
    if not failed or not any(p.hosts or p.env for p in plans.values()):
        return None
    who = ", ".join(f"{h} (at {msg.split(': ', 1)[0]})" for h, msg in sorted(failed.items()))
    return (
        f"hosts block and env files written on no node (all nodes or none): {who} failed before them; "
        "fix that and run the same command again"
    )


def changes_of(run: RunResult) -> list[Change]:
    """One change per changed task; a task that writes several files (ddpfix_node_files: its `files`) one per
    changed file, named by what it is."""
    out: list[Change] = []
    for host, hr in sorted(run.hosts.items()):
        for t in hr.tasks:
            if t.status != "changed":
                continue
            files = t.res.get("files") if isinstance(t.res, dict) and t.action.endswith("ddpfix_node_files") else None
            if isinstance(files, list) and files:
                out += [Change(host, str(f.get("what") or t.task), render_diff(f.get("diff")),
                               FILE_RULES.get(str(f.get("key")), ()))
                        for f in files if isinstance(f, dict) and f.get("changed")]
                continue
            out.append(Change(host, t.task, render_diff(t.res.get("diff")), tuple(x for x in t.tags if x in RULES)))
    return out


def render_diff(diff: Any) -> str:
    items = diff if isinstance(diff, list) else [diff] if isinstance(diff, dict) else []
    chunks = []
    for d in items:
        if not isinstance(d, dict):
            continue
        if "prepared" in d:
            chunks.append(redact_env(str(d["prepared"])).rstrip())
            continue
        before, after = d.get("before"), d.get("after")
        if isinstance(before, str) and isinstance(after, str):
            # the modules redact already; a diff from any other module gets the same treatment here
            before, after = redact_env(before), redact_env(after)
            a = d.get("before_header", "before")
            b = d.get("after_header", "after")
            chunks.append("".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), a, b)).rstrip())
        elif before is not None or after is not None:
            chunks.append(f"- {before}\n+ {after}")
    return "\n".join(c for c in chunks if c)


def not_effective(
    before: Iterable[Finding],
    after: Iterable[Finding],
    plans: dict[str, HostPlan],
    only: set[str] | None = None,
    failed: Iterable[str] = (),
) -> list[Finding]:
    """Fixable findings that a fix was planned for and that the re-audit still reports (on a host that did not fail):
    the fix ran but did not take effect."""
    done = {h for h, p in plans.items() if not p.empty} - set(failed)
    planned = {
        (f.id, f.host)
        for f in before
        if f.rule.fixable
        and f.severity.label != "info"
        and (only is None or f.id in only)
        and (f.host is None or f.host in done)
    }
    return [f for f in after if (f.id, f.host) in planned]


def remaining_fixable(result: AuditResult) -> list[Finding]:
    return [f for f in result.findings if f.rule.fixable and f.severity.label != "info"]
