"""Remediation's run: the play's extra vars, the play (check+diff or apply), and its outcome read back."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ddpfix import clusterfile
from ddpfix.ansible.results import RunResult, is_node_lock_task, module_failure
from ddpfix.ansible.run import run_playbook
from ddpfix.audit import AuditResult
from ddpfix.envtemplate import render_text, template_path
from ddpfix.model.finding import Finding
from ddpfix.plan import hosts_entries
from ddpfix.progress import Progress
from ddpfix.remediate.changes import Change, changes_of
from ddpfix.remediate.plan import HostPlan
from ddpfix.remediate.preflight import preflight, remediate_checked
from ddpfix.remediate.writes import node_writes
from ddpfix.rules.context import Context


def remediate_extravars(ctx: Context, plans: dict[str, HostPlan]) -> dict[str, Any]:
    c = ctx.cluster
    cluster_file = clusterfile.build(ctx)
    return {
        # each node's fixes, and the files they write (`writes`: the per-node play's pre-flight, the cluster-wide
        # play's hosts block and cluster file)
        # and the env file's body, rendered here (one template compile per run, not one per node in the play)
        "ddpfix_plan": {h: {**p.to_vars(), **node_writes(p, c.node(h), c.env_path, bool(cluster_file), c.memlock_kib),
                            "env_body": render_text(c.env_template, ctx.plan[h]) if p.env else ""}
                        for h, p in plans.items()},
        "ddpfix_cidr": ctx.cidr or "",
        "ddpfix_hosts": hosts_entries(ctx.plan),
        "ddpfix_master": c.master,
        "ddpfix_master_address": ctx.plan[c.master].address if c.master in ctx.plan else "",
        "ddpfix_ntp_servers": list(c.ntp_servers),
        "ddpfix_ntp_local_master": c.ntp_local_master,
        "ddpfix_env_path": c.env_path,
        "ddpfix_env_adopt": c.env_adopt,
        "ddpfix_env_template": template_path(c.env_template),
        "ddpfix_env_cluster": cluster_file,
        # the cluster file as written (the same text on every node, rendered once here: to_nice_json of the whole
        # cluster in the play was one O(N) template per node, O(N^2) per run)
        "ddpfix_env_cluster_text": clusterfile.text(cluster_file) if cluster_file else "",
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
        payloads=("ddpfix_node_files",),
    )
    for host, hr in run.hosts.items():  # e.g. "runtime only: ..." from the firewall role
        for t in hr.tasks:
            note = t.res.get("ddpfix_note") if isinstance(t.res, dict) else None
            if note and host in plans and str(note) not in plans[host].notes:
                plans[host].notes.append(str(note))
    return run, changes_of(run)


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
