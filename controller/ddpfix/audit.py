"""Run the read-only audit: one playbook run (facts + probes), then the pure checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from ddpfix.causes import attribute_causes
from ddpfix.checks import (
    Context,
    HostFacts,
    Thresholds,
    active_firewalls,
    not_evaluated,
    parse_event_time,
    run_checks,
    unread_of,
)
from ddpfix.findings import Finding, Severity
from ddpfix.inventory import GROUP, Cluster
from ddpfix.matrix import connectivity_matrix
from ddpfix.nodefacts import NodeFacts, ProbeResult
from ddpfix.plan import NodePlan
from ddpfix.progress import Progress
from ddpfix.report import document
from ddpfix.runner import RunResult, TaskResult, run_playbook

#: The probe module; its check run (not the listener's stop) returns the probe result, with key PROBE_RESULT_KEY.
PROBE_MODULE = "ddpfix_probe"
PROBE_RESULT_KEY = "connects"


@dataclass
class AuditResult:
    cluster: Cluster
    context: Context
    findings: list[Finding]
    run: RunResult


def audit_extravars(cluster: Cluster, probe: bool, probe_peers: int, probe_timeout: float) -> dict[str, object]:
    return {
        "ddpfix_target": GROUP,
        "ddpfix_facts_master": cluster.master,
        "ddpfix_facts_master_port": cluster.master_port,
        "ddpfix_facts_cluster_cidr": cluster.cluster_cidr or "",
        "ddpfix_facts_env_path": cluster.env_path,
        "ddpfix_facts_order": cluster.names,
        "ddpfix_facts_probe": probe,
        "ddpfix_facts_probe_peers": probe_peers,
        "ddpfix_facts_probe_timeout": probe_timeout,
        "ddpfix_analyze": False,  # the CLI analyses the run itself (its options, progress and formats)
    }


def collect(
    cluster: Cluster,
    *,
    limit: str | None = None,
    forks: int | None = None,
    verbosity: int = 0,
    probe: bool = True,
    probe_peers: int = 2,
    probe_timeout: float = 2.0,
    progress: Progress | None = None,
    thresholds: Thresholds | None = None,
) -> tuple[Context, RunResult]:
    run = run_playbook(
        "audit.yml",
        cluster.inventories,
        extravars=audit_extravars(cluster, probe, probe_peers, probe_timeout),
        limit=limit,
        forks=forks,
        n_hosts=len(cluster.nodes),
        verbosity=verbosity,
        on_event=progress.on_event if progress else None,
        name="audit",
    )
    hosts: dict[str, HostFacts] = {}
    for node in cluster.nodes:
        hr = run.hosts.get(node.name)
        if hr is None:
            if limit:
                continue  # outside --limit: not audited, not a finding
            hosts[node.name] = HostFacts(node.name, reachable=False, error=NOT_RUN)
            continue
        found = hr.fact(FACTS_KEY)  # by identity: the facts module's key, whatever the task is named
        facts_task = found[0] if found else None
        probe_task = hr.find(PROBE_MODULE, has=PROBE_RESULT_KEY)  # the check run, not the listener's stop
        hosts[node.name] = host_facts(
            node.name,
            found[1] if found else None,
            probe=probe_task.res if probe_task else None,
            error=hr.message,
            unreachable=hr.unreachable,
            collected_at=parse_event_time(facts_task.created) if facts_task else None,
            window=_window(facts_task),
        )
    # The cluster stays whole under --limit: ranks, NNODES, WORLD_SIZE, MASTER_ADDR and the hosts block come from
    # the whole inventory; nodes outside the limit are simply not in `hosts` (not read, not a finding).
    ctx = Context(cluster, hosts, thresholds or Thresholds())
    return ctx, run


#: What the facts module returns a node's facts as: `ansible_facts[FACTS_KEY]`.
FACTS_KEY = "ddpfix_node"
#: Keys of a probe result (`ddpfix_probe` mode check), folded or not into the facts' `probe` (the listener's state).
PROBE_RESULT_KEYS = frozenset({"connects", "resolve", "routes"})
NOT_RUN = "host did not run (not matched by the play)"


def host_facts(name: str, node: Mapping[str, Any] | None, *, probe: Mapping[str, Any] | None = None,
               error: str = "", unreachable: bool = False, collected_at: float | None = None,
               window: tuple[float, float] | None = None) -> HostFacts:
    """One node's HostFacts from what the facts play returned: `ansible_facts.ddpfix_node` (`node`), and the probe
    result, read from the facts (`ddpfix_node.probe`, once folded there) when they carry one, else from the probe
    task's result (`probe`). The one conversion, for the CLI (runner events) and the action plugin (hostvars)."""
    folded = (node or {}).get("probe")
    if isinstance(folded, Mapping) and PROBE_RESULT_KEYS & set(folded):
        probe = folded
    elif probe is not None and not PROBE_RESULT_KEYS & set(probe):
        probe = None  # skipped, failed or unreachable: no probe result
    return HostFacts(
        name=name,
        reachable=not unreachable and node is not None,
        error=error,
        node=cast(NodeFacts, dict(node)) if node is not None else None,
        probe=cast(ProbeResult, dict(probe)) if probe is not None else None,
        collected_at=collected_at,
        window=window,
    )


def hosts_from_vars(cluster: Cluster, hostvars: Mapping[str, Mapping[str, Any]], *, from_run: bool,
                    limit: str | None = None) -> dict[str, HostFacts]:
    """Every node's HostFacts from the variables a play sees (the action plugin `ddpfix_analyze`).

    `from_run`: the facts play ran in this ansible-playbook run. A node counts as read only when its facts task
    returned facts in this run (`ddpfix_facts_result`, a registered result, never cached), so facts a fact cache
    still holds from an earlier run never stand in for a node that is unreachable now; a node the facts play did
    not match (no `ddpfix_audit_in_run` marker) is outside --limit (left out, as the CLI does) or, without a limit,
    did not run. Otherwise (analysis of a fact cache, the sliced pattern) every node's cached facts are read; a node
    without facts in the cache was not read.
    """
    out: dict[str, HostFacts] = {}
    for n in cluster.nodes:
        hv = hostvars.get(n.name) or {}
        facts = hv.get("ansible_facts") or {}
        node = facts.get(FACTS_KEY)
        win = facts.get("ddpfix_facts_window")
        window = (float(win[0]), float(win[1])) if isinstance(win, (list, tuple)) and len(win) == 2 else None
        if window is not None and window[0] > window[1]:
            window = None
        if from_run:
            if not hv.get("ddpfix_audit_in_run"):
                if limit:
                    continue
                out[n.name] = HostFacts(n.name, reachable=False, error=NOT_RUN)
                continue
            res = hv.get("ddpfix_facts_result")
            if not isinstance(res, Mapping) or res.get("unreachable") or res.get("failed") or res.get("skipped"):
                why = (res or {}).get("msg") if isinstance(res, Mapping) else None
                out[n.name] = HostFacts(n.name, reachable=False, error=_one_line(
                    why or "no facts in this run: unreachable or failed before the facts task"))
                continue
            node = (res.get("ansible_facts") or {}).get(FACTS_KEY, node)
        elif node is None:
            out[n.name] = HostFacts(n.name, reachable=False, error="no facts in the fact cache")
            continue
        out[n.name] = host_facts(n.name, node, probe=hv.get("ddpfix_facts_probe_result") if from_run else None,
                                 window=window)
    return out


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:400]


def audit_report(ctx: Context, findings: list[Finding], *, probe: bool = True,
                 skip: str | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """The `ddpfix.report/v1` document of an audit (`ddpfix audit --format json`, the action plugin) and the
    findings it counts (causes attributed; accepted ones, --skip or ddp_skip_findings, moved to `skipped`)."""
    cluster = ctx.cluster
    kept, skipped = split_skipped(attribute_causes(findings, cluster.master), skip, cluster)
    doc = document("audit", cluster.inventories,
                   host_summaries(ctx.hosts, ctx.plan, cluster, not_evaluated(ctx, findings)), kept,
                   {"cluster": {"master": cluster.master, "master_port": cluster.master_port, "cidr": ctx.cidr,
                                "world_size": cluster.world_size},
                    "matrix": connectivity_matrix(ctx) if probe else None},
                   skipped=skipped)
    return doc, kept


def failing(findings: Iterable[Finding], fail_on: str) -> list[Finding]:
    """The findings at or above `fail_on` (error, warning, info; `none`: never)."""
    if fail_on == "none":
        return []
    threshold = Severity.parse(fail_on)
    return [f for f in findings if f.severity >= threshold]


def split_skipped(findings: list[Finding], skip: str | None, cluster: Cluster) -> tuple[list[Finding], list[Finding]]:
    """(kept, skipped): findings accepted by --skip or ddp_skip_findings (`ID` anywhere, `ID@HOST` on one host)."""
    from ddpfix.inventory import parse_skip

    rules = set(cluster.skip_findings) | set(parse_skip(skip or "", "--skip"))
    if not rules:
        return findings, []
    kept: list[Finding] = []
    skipped: list[Finding] = []
    for f in findings:
        (skipped if f.id in rules or f"{f.id}@{f.host or 'cluster'}" in rules else kept).append(f)
    return kept, skipped


def host_summaries(hosts: dict[str, HostFacts], plans: dict[str, NodePlan], cluster: Cluster,
                   not_evaluated: dict[str, list[dict[str, str]]] | None = None) -> dict[str, Any]:
    """Per host: reachability, the main facts, what could not be read (`facts.unread`) and the checks that were
    therefore not evaluated (`not_evaluated: [{id, reason}]`, present on every reachable host)."""
    out: dict[str, Any] = {}
    for node in cluster.nodes:
        h = hosts.get(node.name)
        if h is None:
            continue
        f = h.node or {}
        plan = plans.get(node.name)
        t: Mapping[str, Any] = f.get("time") or {}
        envf: Mapping[str, Any] = f.get("env_file") or {}
        sysctl: Mapping[str, Any] = f.get("sysctl") or {}
        fw = f.get("firewall") or {}
        out[node.name] = {
            "reachable": bool(h.reachable),
            "address": node.address,
            "rank": node.rank,
            "facts": {} if not h.reachable else {
                "hostname": f.get("hostname"),
                "cluster_address": plan.address if plan else None,
                "cluster_ifname": plan.ifname if plan else None,
                "time_daemons": t.get("daemons"),
                "chrony_synchronised": (t.get("chrony_tracking") or {}).get("synchronised"),
                "firewall": active_firewalls(fw),
                "env_file": envf.get("exists"),
                "ephemeral_range": sysctl.get("ip_local_port_range"),
                "unread": [{"source": k, "reason": v} for k, v in sorted(unread_of(f).items())],
            },
        }
        if h.reachable:
            out[node.name]["not_evaluated"] = list((not_evaluated or {}).get(node.name, []))
        if not h.reachable:
            out[node.name]["error"] = h.error
    return out


def _window(task: TaskResult | None) -> tuple[float, float] | None:
    if task is None:
        return None
    lo, hi = parse_event_time(task.start), parse_event_time(task.end)
    return (lo, hi) if lo is not None and hi is not None and lo <= hi else None


def run_audit(cluster: Cluster, **kwargs: object) -> AuditResult:
    ctx, run = collect(cluster, **kwargs)  # type: ignore[arg-type]
    return AuditResult(cluster, ctx, run_checks(ctx), run)
