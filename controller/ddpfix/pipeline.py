"""The one orchestrator of a run: audit -> plan -> apply -> verify.

The CLI commands (`ddpfix audit`, `remediate`, `verify`) and the action plugin `ddpfix_analyze` (the playbooks run
with plain ansible-playbook) call these functions and nothing else to sequence a run, so the two paths cannot drift:
the same `--only` validation, the same split of accepted findings, the same plan and pre-flight, the same verdict.
The cluster is derived once per run (the audit play's first task, or the CLI's read of the inventory) and handed
along to every later step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ddpfix.ansible.results import RunResult
from ddpfix.audit import (
    AuditResult,
    audit_report,
    cluster_from_data,
    collect,
    failing,
    host_summaries,
    hosts_from_vars,
    run_audit,
    split_skipped,
)
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.derive import cluster_from_hostvars
from ddpfix.model.cluster import Cluster
from ddpfix.model.finding import Finding
from ddpfix.progress import Progress
from ddpfix.rules.context import Context, Thresholds
from ddpfix.rules.registry import RULES, fixable_ids

if TYPE_CHECKING:
    from ddpfix.factsdir import Saved
    from ddpfix.remediate import Change, HostPlan
    from ddpfix.verify.endstate import Check

# CLI start: the checks, the remediation and the verification are imported inside the functions that run them, so
# that a command reaches its ansible-playbook without loading them; the run's preload thread imports them meanwhile
# (`ddpfix.audit.ANALYSIS_MODULES`, PLAN_MODULES, VERIFY_MODULES).
#: What the plan and the apply load (`remediate`, `plan`, `apply`).
PLAN_MODULES = ("ddpfix.remediate",)
#: What `verify` loads after its audit (the end-state checks; the collectives).
VERIFY_MODULES = ("ddpfix.verify.endstate", "ddpfix.verify.torch", "ddpfix.verify.nccl")

# ------------------------------------------------------------------------------------------------------------- audit


def audit(cluster: Cluster | None, **kwargs: Any) -> AuditResult:
    """Facts and probes on every node, then the checks (`audit.collect`'s options). `cluster` None: the audit play's
    first task derives it from the inventory (the one read of it) and the result carries it."""
    return run_audit(cluster, **kwargs)


def facts(cluster: Cluster, **kwargs: Any) -> Context:
    """The facts of every node, without the probes or the checks (`ddpfix env`: what its plan needs)."""
    ctx, _ = collect(cluster, probe=False, **kwargs)
    return ctx


def analyze(cluster: Cluster, hostvars: Mapping[str, Mapping[str, Any]], *, from_run: bool, limit: str | None = None,
            thresholds: Thresholds | None = None) -> AuditResult:
    """The audit of facts a play already gathered (the action plugin: this run's facts play, or a fact cache)."""
    from ddpfix.rules.engine import run_checks  # CLI start: see the note at the top

    ctx = Context(cluster, hosts_from_vars(cluster, hostvars, from_run=from_run, limit=limit),
                  thresholds or Thresholds())
    return AuditResult(cluster, ctx, run_checks(ctx), None)  # type: ignore[arg-type]


def analyze_saved(cluster: Cluster, dirs: Sequence[str], *, max_age: float,
                  thresholds: Thresholds | None = None) -> tuple[AuditResult, Saved]:
    """The audit of the facts batches saved (`ddpfix audit --facts-in`): no node contacted; every node of the
    inventory's cluster from its newest saved file (`factsdir.load_facts`), the same checks over all of them."""
    # CLI start: see the note at the top
    from ddpfix.factsdir import load_facts
    from ddpfix.rules.engine import run_checks

    saved = load_facts(dirs, cluster, max_age=max_age)
    ctx = Context(cluster, saved.hosts, thresholds or Thresholds())
    return AuditResult(cluster, ctx, run_checks(ctx), None), saved  # type: ignore[arg-type]


def cluster_of_play(task_vars: Mapping[str, Any], tree: Mapping[str, Any]) -> Cluster:
    """The cluster a play runs on (the action plugin): the one the audit play's first task (ddpfix_cluster) derived
    this run, handed along in its registered result; derived from the play's inventory (`tree`, `hostvars`) only
    when that task did not run (the analysis of a fact cache)."""
    sources = [str(s) for s in task_vars.get("ansible_inventory_sources") or []]
    registered = task_vars.get("ddpfix_audit_cluster")
    derived = registered.get("cluster") if isinstance(registered, Mapping) else None
    if isinstance(derived, Mapping):
        return cluster_from_data(derived, sources)
    return cluster_from_hostvars(tree, task_vars.get("hostvars") or {}, sources)


@dataclass
class Verdict:
    """What an audit reports: the `ddpfix.report/v1` document, the findings it counts and those at `fail_on`."""

    doc: dict[str, Any]
    findings: list[Finding]
    failing: list[Finding]
    fail_on: str

    @property
    def code(self) -> ExitCode:
        return ExitCode.FINDINGS if self.failing else ExitCode.OK

    @property
    def line(self) -> str:
        """The verdict in words (the CLI's exit line without its `exit N: `, the play's message)."""
        n = len(self.failing)
        if n:
            return f"{n} finding{'s' if n != 1 else ''} at or above {self.fail_on}"
        return "--fail-on none (report only)" if self.fail_on == "none" else f"nothing at or above {self.fail_on}"


def verdict(result: AuditResult, *, probe: bool = True, skip: str | None = None, fail_on: str = "warning") -> Verdict:
    doc, kept = audit_report(result.context, result.findings, probe=probe, skip=skip)
    return Verdict(doc, kept, failing(kept, fail_on), fail_on)


# -------------------------------------------------------------------------------------------------------------- plan


def parse_only(value: str | Iterable[str] | None, option: str) -> set[str] | None:
    """`--only` (`ddpfix_only` in the playbook): the finding ids to fix, None for every fixable one. An unknown id or
    a detect-only one (remediate fixes nothing for it) is invalid input, named with `option`: exit 2, nothing run."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    ids = {str(s).strip() for s in items if str(s).strip()}
    if not ids:
        return None
    unknown = sorted(ids - set(RULES))
    if unknown:
        raise DdpfixError(f"{option}: unknown finding id(s): {', '.join(unknown)}", ExitCode.INVALID_INPUT)
    detect_only = [i for i in RULES if i in ids and not RULES[i].fixable]
    if detect_only:
        raise DdpfixError(f"{option}: not fixed by remediate (detect-only): {', '.join(detect_only)}; fixable ids: "
                          f"{', '.join(fixable_ids())}", ExitCode.INVALID_INPUT)
    return ids


@dataclass
class Plan:
    """The fixes of every node, from an audit: `findings` (accepted ones moved to `skipped`), the per-host plans and
    the writes refused."""

    findings: list[Finding]
    skipped: list[Finding]
    plans: dict[str, HostPlan]
    refusals: list[str]
    only: set[str] | None = None

    @property
    def todo(self) -> dict[str, HostPlan]:
        return {h: p for h, p in self.plans.items() if not p.empty}


def plan(result: AuditResult, *, only: set[str] | None = None, skip: str | None = None, allow_partial: bool = False,
         pin_ifnames: bool = False, apply: bool = False) -> Plan:
    """The remediation plan, refused (DdpfixError, nothing changed) where a node returned values ddpfix will not
    write or the cluster CIDR is unknown or unacknowledged (`remediate.preflight`)."""
    from ddpfix.remediate import build_plan, preflight  # CLI start: see the note at the top

    kept, skipped = split_skipped(result.findings, skip, result.cluster)  # accepted: not fixed, not counted
    plans, refusals = build_plan(result.context, kept, only=only, allow_partial=allow_partial, pin_ifnames=pin_ifnames)
    out = Plan(kept, skipped, plans, refusals, only)
    if result.context.invalid or out.todo:
        preflight(result.context, out.todo, apply=apply)
    return out


# ------------------------------------------------------------------------------------------------------------- apply


@dataclass
class Applied:
    """What the dry run would change or the apply changed: the changes, per host the count and the failures."""

    changes: list[Change] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    changed: dict[str, int] = field(default_factory=dict)
    run: RunResult | None = None
    interrupted: bool = False


def apply(result: AuditResult, fixes: Plan, *, apply: bool, limit: str | None = None, forks: int | None = None,
          verbosity: int = 0, progress: bool | None = None) -> Applied:
    """The dry run (check mode; what the audit's facts tell is computed without a play) or the apply of `fixes`.
    A refused cluster-wide write is added to `fixes.refusals`. `progress` False: no progress display."""
    # CLI start: see the note at the top
    from ddpfix.remediate import cluster_files_refusal, failures_of, preview, run_remediation

    ctx = result.context
    out = Applied(changed=dict.fromkeys(sorted(fixes.plans), 0))
    todo = fixes.todo
    if not todo:  # nothing planned anywhere: no play to run
        return out
    out.changes, out.failed, rest = ([], {}, todo) if apply else preview(ctx, todo)
    if rest:
        with Progress(list(rest), f"ddpfix remediate: {'apply' if apply else 'dry run'}", enabled=progress) as prog:
            out.run, played = run_remediation(ctx, rest, apply=apply, limit=limit, forks=forks, verbosity=verbosity,
                                              progress=prog, interruptible=True)
        out.changes = sorted(out.changes + played, key=lambda c: c.host)  # stable: each host's changes in task order
        out.failed.update(failures_of(out.run))
        out.interrupted = out.run.interrupted
    run = out.run
    # a change per file written (one task may write several: ddpfix_node_files)
    out.changed.update({h: max(run.changed(h) if run else 0, sum(1 for c in out.changes if c.host == h))
                        for h in todo})
    refusal = cluster_files_refusal(todo, out.failed)
    if refusal:
        fixes.refusals.append(refusal)
    return out


_apply = apply  # for `remediate`, whose flag of the same name shadows it


@dataclass
class Remediation:
    """A whole `remediate`: the audit before, the plan, what was (or would be) changed, the re-audit after."""

    before: AuditResult
    fixes: Plan
    applied: Applied
    after: AuditResult | None
    apply: bool

    @property
    def final(self) -> AuditResult:
        return self.after or self.before

    @property
    def remaining(self) -> list[Finding]:
        from ddpfix.remediate import remaining_fixable  # CLI start: see the note at the top

        return remaining_fixable(self.final)

    @property
    def not_effective(self) -> list[Finding]:
        """Fixes applied whose finding is still open after the re-audit."""
        if not (self.apply and self.fixes.todo):
            return []
        from ddpfix.remediate import not_effective  # CLI start: see the note at the top

        return not_effective(self.before.findings, self.final.findings, self.fixes.plans, self.fixes.only,
                             self.applied.failed)

    @property
    def doc(self) -> dict[str, Any]:
        """The `ddpfix.report/v1` document of the remediation (its findings and hosts: the re-audit's, else the
        audit's)."""
        # CLI start: see the note at the top
        from ddpfix.causes import attribute_causes
        from ddpfix.report import document
        from ddpfix.rules.engine import not_evaluated

        final, fixes, a, cluster = self.final, self.fixes, self.applied, self.before.cluster
        ctx = final.context
        return document(
            "remediate", cluster.inventories,
            host_summaries(ctx.hosts, ctx.plan, cluster, not_evaluated(ctx, final.findings)),
            attribute_causes(final.findings, cluster.master),
            {
                "apply": self.apply,
                "interrupted": a.interrupted,
                "changes": [{"host": c.host, "task": c.task, "diff": c.diff, "rules": list(c.rules)}
                            for c in a.changes],
                "changed": a.changed,
                "failed_hosts": a.failed,
                "refused": fixes.refusals,
                "notes": {h: p.notes for h, p in fixes.plans.items() if p.notes},
                "remaining_fixable": [f.to_json() for f in self.remaining] if self.apply else None,
                "not_effective": [{"id": f.id, "host": f.host, "message": not_effective_text(f)}
                                  for f in self.not_effective] if self.apply else None,
            },
            skipped=fixes.skipped,
        )

    @property
    def code(self) -> ExitCode:
        a = self.applied
        if a.interrupted:
            return ExitCode.INTERRUPTED
        if self.apply:
            return ExitCode.OK if not self.remaining and not a.failed and not self.fixes.refusals else ExitCode.FINDINGS
        return ExitCode.FINDINGS if a.changes or a.failed or self.fixes.refusals else ExitCode.OK


def not_effective_text(f: Finding) -> str:
    why = RULES[f.id].still_open
    return (f"{f.id} on {f.host or 'the cluster'} is still open after the fix was applied (the fix did not take "
            f"effect): {f.message}; {f.evidence}" + (f"; {why}" if why else ""))


def remediate(cluster: Cluster | None, *, apply: bool, only: set[str] | None = None, skip: str | None = None,
              allow_partial: bool = False, pin_ifnames: bool = False, limit: str | None = None,
              forks: int | None = None, verbosity: int = 0, progress: bool | None = None,
              inventories: Sequence[str] = ()) -> Remediation:
    """audit -> plan -> apply (or dry run) -> re-audit (after an apply that changed or failed something).
    `cluster` None: the audit's play derives it from `inventories` (the one read of them; its first task takes the
    controller lock for the rest of this command) and the later steps take it from the audit."""
    run_opts: dict[str, Any] = {"limit": limit, "forks": forks, "verbosity": verbosity}
    with Progress(cluster.names if cluster else None, "ddpfix remediate: audit", enabled=progress) as prog:
        before = audit(cluster, progress=prog, preload=PLAN_MODULES, inventories=inventories, **run_opts)
    cluster = before.cluster
    fixes = plan(before, only=only, skip=skip, allow_partial=allow_partial, pin_ifnames=pin_ifnames, apply=apply)
    before.findings = fixes.findings
    applied = _apply(before, fixes, apply=apply, progress=progress, **run_opts)
    after = None
    if apply and not applied.interrupted and (any(applied.changed.values()) or applied.failed):
        try:
            with Progress(cluster.names, "ddpfix remediate: re-audit", enabled=progress) as prog:
                after = audit(cluster, progress=prog, **run_opts)
        except DdpfixError as exc:
            if exc.code != ExitCode.INTERRUPTED:
                raise
            applied.interrupted = True  # during the re-audit: still report what the apply changed
    if after is not None:
        after.findings, fixes.skipped = split_skipped(after.findings, skip, cluster)
    return Remediation(before, fixes, applied, after, apply)



# ------------------------------------------------------------------------------------------------------------ verify


@dataclass
class Verification:
    """`ddpfix verify`: the end-state checks (the audit's judgements, plus what only a live look can see), and the
    real collective (a Gloo all-reduce, or the NCCL sweep) when asked for."""

    cluster: Cluster
    checks: list[Check]
    torch: list[dict[str, Any]] | None = None
    nccl: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        ok = all(c.ok for c in self.checks) and (self.torch is None or all(r["ok"] for r in self.torch))
        if self.nccl is not None:
            ok = ok and all(e["ok"] for e in self.nccl["gang"]) and all(p["ok"] for p in self.nccl["pairs"] or [])
        return ok

    @property
    def doc(self) -> dict[str, Any]:
        from ddpfix.verify.endstate import document as verify_document  # CLI start: see the note at the top

        return verify_document(self.cluster, self.ok, self.checks, self.torch, self.nccl)


def verify(cluster: Cluster | None, *, checks: bool = True, backend: str = "gloo", torch: bool = False,
           sizes: Sequence[int] = (), iters: int = 20, min_busbw: float | None = None, pairs: bool = False,
           limit: str | None = None, forks: int | None = None, verbosity: int = 0,
           progress: bool | None = None, inventories: Sequence[str] = ()) -> Verification:
    """audit (facts, live probes) -> the end-state checks from its findings -> the collective (`backend` nccl: the
    NCCL sweep; `torch`: a Gloo all-reduce). `cluster` None: the audit's play derives it from `inventories`, as
    for `remediate`."""
    # CLI start: see the note at the top
    from ddpfix.rules.reachability import NOT_AUDITED, UNREACHABLE
    from ddpfix.verify.endstate import Check, testinfra_checks
    from ddpfix.verify.nccl import run_nccl
    from ddpfix.verify.torch import run_torch

    run_opts: dict[str, Any] = {"limit": limit, "forks": forks, "verbosity": verbosity}
    with Progress(cluster.names if cluster else None, "ddpfix verify: probes", enabled=progress) as prog:
        result = audit(cluster, progress=prog, preload=VERIFY_MODULES, inventories=inventories, **run_opts)
    cluster = result.cluster
    out = Verification(cluster, testinfra_checks(result.context, result.findings) if checks else [])
    for f in result.findings:
        if f.id in NOT_AUDITED:
            what = "reachable over SSH" if f.id == UNREACHABLE.id else "ddpfix's module runs on the node"
            out.checks.append(Check(f.host or "", what, False, f.evidence))
    if backend == "nccl":
        with Progress(cluster.names, "ddpfix verify: NCCL all-reduce sweep", enabled=progress) as prog:
            out.nccl = run_nccl(result.context, sizes=tuple(sizes), iters=iters, min_busbw=min_busbw, pairs=pairs,
                                progress=prog, findings=result.findings, **run_opts)
    elif torch:
        with Progress(cluster.names, "ddpfix verify: torch all-reduce", enabled=progress) as prog:
            out.torch = run_torch(cluster, progress=prog, findings=result.findings, **run_opts)
    return out
