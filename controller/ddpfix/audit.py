"""Run the read-only audit: one playbook run (facts + probes in one task per node), then the pure checks."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddpfix.checks import Context, HostFacts, Thresholds, parse_event_time, run_checks
from ddpfix.findings import Finding
from ddpfix.inventory import GROUP, Cluster
from ddpfix.progress import Progress
from ddpfix.runner import RunResult, TaskResult, run_playbook

#: The one task every node runs (it takes and releases the node lock itself; its name keeps the runner's lock prefix).
FACTS_TASK = "lock | Take the ddpfix node lock, collect node facts"
#: Only when the nodes do not all run at once: the detached probers' results (set_fact into ddpfix_node).
PROBE_FACT_TASK = "probe | Keep the probe result"
#: Tag of the second round's tasks (collect detached probers), left out when every node runs at once.
COLLECT_TAG = "ddpfix_facts_collect"
#: Probe listener ports are picked per run inside the default ephemeral range (32768-60999), away from its ends.
PROBE_PORTS = (40000, 59999)


@dataclass
class AuditResult:
    cluster: Cluster
    context: Context
    findings: list[Finding]
    run: RunResult


def audit_extravars(cluster: Cluster, probe: bool, probe_peers: int, probe_timeout: float, forks: int | None = None,
                    probe_port: int | None = None) -> dict[str, object]:
    """The audit play's variables. `forks`: Ansible's forks for the run (None: every node at once); below the
    number of nodes the probers run detached and a second task collects them."""
    port = probe_port or random.Random().randint(*PROBE_PORTS)
    return {
        "ddpfix_target": GROUP,
        "ddpfix_facts_master": cluster.master,
        "ddpfix_facts_master_port": cluster.master_port,
        "ddpfix_facts_cluster_cidr": cluster.cluster_cidr or "",
        "ddpfix_facts_env_path": cluster.env_path,
        "ddpfix_facts_order": cluster.names,
        "ddpfix_facts_addresses": {n.name: n.address for n in cluster.nodes},
        "ddpfix_facts_probe": probe,
        "ddpfix_facts_probe_peers": probe_peers,
        "ddpfix_facts_probe_timeout": probe_timeout,
        "ddpfix_facts_probe_port": port if port != cluster.master_port else port + 1,
        "ddpfix_facts_forks": forks or len(cluster.nodes),
    }


def host_facts(name: str, ansible_facts: Mapping[str, Any] | None, *, error: str = "", unreachable: bool = False,
               collected_at: float | None = None, window: tuple[float, float] | None = None) -> HostFacts:
    """One host's `HostFacts` from the facts it returned (`ansible_facts`, holding `ddpfix_node`; from the run's
    events, hostvars or the fact cache). The probe's results (connects, and the resolution and route deviations) are
    inside `ddpfix_node.probe`. `window`: the controller's task start..result window; it is narrowed by the node's
    own `now_elapsed` (the module's start to its clock reading)."""
    node = (ansible_facts or {}).get("ddpfix_node")
    node = node if isinstance(node, dict) else None
    pr = (node or {}).get("probe")
    probe = None
    if isinstance(pr, dict) and ("connects" in pr or "resolve" in pr):
        probe = {k: pr[k] for k in ("connects", "resolve", "routes", "checked") if k in pr}
    if window is not None and node is not None:
        try:
            lo = window[0] + max(0.0, float(node.get("now_elapsed") or 0))
            window = (lo, window[1]) if lo <= window[1] else window
        except (TypeError, ValueError):
            pass
    return HostFacts(name=name, reachable=not unreachable and node is not None, error=error, node=node, probe=probe,
                     collected_at=collected_at, window=window)


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
    from ddpfix import ansiblecfg
    from ddpfix.runner import default_forks

    nforks = default_forks(len(cluster.nodes), forks, ansiblecfg.user_forks(ansiblecfg.load(cluster.inventories)))
    run = run_playbook(
        "audit.yml",
        cluster.inventories,
        extravars=audit_extravars(cluster, probe, probe_peers, probe_timeout, nforks),
        limit=limit,
        forks=forks,
        # every node at once: the second round's tasks are left out of the play, not skipped per node
        skip_tags=COLLECT_TAG if nforks >= len(cluster.nodes) or not probe else None,
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
        returned = dict((facts_task.res if facts_task else {}).get("ansible_facts") or {})
        kept = hr.task(PROBE_FACT_TASK)  # the second round's result, when there was one
        if kept is not None and isinstance((kept.res.get("ansible_facts") or {}).get("ddpfix_node"), dict):
            returned["ddpfix_node"] = kept.res["ansible_facts"]["ddpfix_node"]
        hosts[node.name] = host_facts(
            node.name, returned, error=hr.message, unreachable=hr.unreachable,
            collected_at=parse_event_time(facts_task.created) if facts_task else None, window=_window(facts_task))
    # The cluster stays whole under --limit: ranks, NNODES, WORLD_SIZE, MASTER_ADDR and the hosts block come from
    # the whole inventory; nodes outside the limit are simply not in `hosts` (not read, not a finding).
    ctx = Context(cluster, hosts, thresholds or Thresholds())
    return ctx, run


def probe_rounds(ctx: Context) -> dict[str, Any]:
    """How the probes ran: `rounds` 1 (every node in one task) or 2 (detached probers collected by a second task,
    because the nodes did not all run at once), and the nodes whose prober ran detached."""
    detached = sorted(n for n, f in ctx.facts.items() if f and (f.get("probe") or {}).get("mode") == "detached")
    return {"rounds": 2 if detached else 1, "detached": detached}


def _window(task: TaskResult | None) -> tuple[float, float] | None:
    if task is None:
        return None
    lo, hi = parse_event_time(task.start), parse_event_time(task.end)
    return (lo, hi) if lo is not None and hi is not None and lo <= hi else None


def run_audit(cluster: Cluster, **kwargs: object) -> AuditResult:
    ctx, run = collect(cluster, **kwargs)  # type: ignore[arg-type]
    return AuditResult(cluster, ctx, run_checks(ctx), run)
