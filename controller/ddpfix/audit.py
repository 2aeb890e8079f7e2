"""Run the read-only audit: one playbook run (facts + probes), then the pure checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from ddpfix.checks import Context, HostFacts, Thresholds, parse_event_time, run_checks
from ddpfix.findings import Finding
from ddpfix.inventory import GROUP, Cluster
from ddpfix.nodefacts import NodeFacts, ProbeResult
from ddpfix.progress import Progress
from ddpfix.runner import RunResult, TaskResult, run_playbook

#: Where the facts module (`ddpfix_node_facts`) returns a node's facts: `ansible_facts[FACTS_KEY]`.
FACTS_KEY = "ddpfix_node"
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
        found = hr.fact(FACTS_KEY)
        facts_task = found[0] if found else None
        node_facts = cast(NodeFacts, found[1]) if found else None
        probe_task = hr.find(PROBE_MODULE, has=PROBE_RESULT_KEY)
        hosts[node.name] = HostFacts(
            name=node.name,
            reachable=not hr.unreachable and node_facts is not None,
            error=hr.message,
            node=node_facts,
            probe=cast(ProbeResult, probe_task.res) if probe_task else None,
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
