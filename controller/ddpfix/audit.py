"""Run the read-only audit: one playbook run (facts + probes), then the pure checks."""

from __future__ import annotations

from dataclasses import dataclass

from ddpfix.checks import Context, HostFacts, Thresholds, parse_event_time, run_checks
from ddpfix.findings import Finding
from ddpfix.inventory import GROUP, Cluster
from ddpfix.progress import Progress
from ddpfix.runner import RunResult, TaskResult, run_playbook

FACTS_TASK = "facts | Collect node facts"
PROBE_TASK = "probe | Resolve peers"


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
            hosts[node.name] = HostFacts(node.name, reachable=False, error="host did not run (not matched by the play)")
            continue
        facts_task = hr.task(FACTS_TASK)
        node_facts = ((facts_task.res if facts_task else {}).get("ansible_facts") or {}).get("ddpfix_node")
        hosts[node.name] = HostFacts(
            name=node.name,
            reachable=not hr.unreachable and node_facts is not None,
            error=hr.message,
            node=node_facts,
            probe=hr.result(PROBE_TASK),
            collected_at=parse_event_time(facts_task.created) if facts_task else None,
            window=_window(facts_task),
        )
    # The cluster stays whole under --limit: ranks, NNODES, WORLD_SIZE, MASTER_ADDR and the hosts block come from
    # the whole inventory; nodes outside the limit are simply not in `hosts` (not read, not a finding).
    ctx = Context(cluster, hosts, thresholds or Thresholds())
    return ctx, run


def _window(task: TaskResult | None) -> tuple[float, float] | None:
    if task is None:
        return None
    lo, hi = parse_event_time(task.start), parse_event_time(task.end)
    return (lo, hi) if lo is not None and hi is not None and lo <= hi else None


def run_audit(cluster: Cluster, **kwargs: object) -> AuditResult:
    ctx, run = collect(cluster, **kwargs)  # type: ignore[arg-type]
    return AuditResult(cluster, ctx, run_checks(ctx), run)
