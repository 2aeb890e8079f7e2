"""Run the read-only audit: one playbook run (facts + probes in one task per node), then the pure checks."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ddpfix.ansible import collection
from ddpfix.ansible import config as ansiblecfg
from ddpfix.ansible.env import MAX_DEFAULT_FORKS, default_forks
from ddpfix.ansible.results import HostResult, RunResult, TaskResult, module_failure
from ddpfix.ansible.run import run_playbook
from ddpfix.ansible.rundirs import discard_run_dir, last_run_dir
from ddpfix.clock import parse_event_time
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.contract import parse_skip
from ddpfix.inventory.derive import cluster_from_inventory_data, load_cluster
from ddpfix.lock import cluster_addresses, note_held
from ddpfix.model.cluster import Cluster, Node
from ddpfix.model.facts import NodeFacts, ProbeResult
from ddpfix.model.finding import Finding, Severity
from ddpfix.progress import Progress
from ddpfix.rules.context import Context, HostFacts, Thresholds, unread_of

if TYPE_CHECKING:
    from ddpfix.plan import NodePlan


#: The facts module: its task takes and releases the node lock, collects the facts and runs the probes (one per node).
FACTS_MODULE = "ddpfix_node_facts"
#: Tasks the CLI leaves out (it has their information from its own events): the play's run marker, the facts'
#: controller clock window, which the standalone analysis (action plugin) needs, and the set_fact that folds a
#: detached prober's collected result into the facts (`fold_collected` does it from the collect task's event).
CLI_SKIP_TAGS = ("ddpfix_facts_window", "ddpfix_audit_mark", "ddpfix_facts_fold", "ddpfix_facts_registered")
#: ...and the facts task it runs instead of the registered one (roles/ddpfix_facts/tasks/facts.yml: the same task,
#: its result read from the CLI's events, not registered; tagged `never`, so every other task it runs is `always`).
CLI_TAGS = ("ddpfix_facts_events",)
#: What a Context of the facts loads (the fact guards, the plan), and what an audit's analysis loads besides (the
#: checks, causes, matrix, report): imported inside the functions that use them, so that the CLI reaches
#: ansible-playbook without them; the run's preload thread imports them while ansible-playbook starts (about
#: 0.03-0.04 s of a 2-core controller's CLI start). `collect` preloads the first, `run_audit` both.
CONTEXT_MODULES = ("ddpfix.factguard.facts", "ddpfix.factguard.reach", "ddpfix.plan")
ANALYSIS_MODULES = (*CONTEXT_MODULES, "ddpfix.rules.engine", "ddpfix.causes", "ddpfix.matrix", "ddpfix.report")
#: Probe listener ports are picked per run inside the default ephemeral range (32768-60999), away from its ends.
PROBE_PORTS = (40000, 59999)


@dataclass
class AuditResult:
    cluster: Cluster
    context: Context
    findings: list[Finding]
    run: RunResult


def audit_extravars(cluster: Cluster | None, probe: bool, probe_peers: int, probe_timeout: float,
                    forks: int | None = None, probe_port: int | None = None) -> dict[str, object]:
    """The audit play's variables. `forks`: Ansible's forks for the run (None: every node at once); below the
    number of nodes the probe is rolling (each prober outlives its task for the nodes after it; `ddpfix.rolling`).
    `cluster` None: the play derives the cluster from the inventory itself (its first task, ddpfix_cluster), and the
    CLI reads it from that task."""
    out: dict[str, object] = {
        # the probe plan (filter ddpfix_probe_plan) moves it off the master port when the two coincide
        "ddpfix_facts_probe_port": probe_port or random.Random().randint(*PROBE_PORTS),
        "ddpfix_facts_forks": forks or (len(cluster.nodes) if cluster is not None else MAX_DEFAULT_FORKS),
        "ddpfix_facts_probe": probe,
        "ddpfix_facts_probe_peers": probe_peers,
        "ddpfix_facts_probe_timeout": probe_timeout,
        "ddpfix_analyze": False,  # the CLI analyses the run itself (its options, progress and formats)
    }
    if cluster is not None:  # what the play's first task (ddpfix_cluster) would derive: it is skipped
        out["ddpfix_audit_cluster"] = cluster.play_view()
    return out


def collect(
    cluster: Cluster | None,
    *,
    inventories: Sequence[str] = (),
    limit: str | None = None,
    forks: int | None = None,
    verbosity: int = 0,
    probe: bool = True,
    probe_peers: int = 2,
    probe_timeout: float = 2.0,
    progress: Progress | None = None,
    thresholds: Thresholds | None = None,
    preload: Sequence[str] = (),
) -> tuple[Context, RunResult]:
    """Run the facts play and gather every node's facts. `cluster` None: the inventory `inventories` is read only
    by ansible-playbook, whose first task (ddpfix_cluster, on the controller) derives and validates the cluster
    before any node is contacted; the cluster is then taken from that task's result."""

    sources = tuple(cluster.inventories) if cluster is not None else tuple(inventories)
    n_hosts = len(cluster.nodes) if cluster is not None else MAX_DEFAULT_FORKS  # Ansible caps forks at the hosts
    nforks = default_forks(n_hosts, forks, ansiblecfg.user_forks(ansiblecfg.load(sources)))
    try:
        run = run_playbook(
            "audit.yml",
            sources,
            extravars=audit_extravars(cluster, probe, probe_peers, probe_timeout, nforks),
            limit=limit,
            forks=nforks,
            tags=",".join(CLI_TAGS),
            # the facts role's plan task is the first task's (ddpfix_cluster) when that task runs (no cluster given)
            skip_tags=",".join((*CLI_SKIP_TAGS, *(("ddpfix_facts_plan",) if cluster is None else ()))),
            n_hosts=n_hosts,
            verbosity=verbosity,
            on_event=progress.on_event if progress else None,
            name="audit",
            preload=(*CONTEXT_MODULES, *preload),
            payloads=(FACTS_MODULE,),
        )
    except DdpfixError as exc:
        if cluster is None and exc.code in (ExitCode.RUN_FAILED, ExitCode.INVALID_INPUT):
            _input_error_first(lambda: load_cluster(sources))  # the inventory's own error, as if the CLI read it
        raise
    if cluster is None:
        cluster = _input_error_first(lambda: cluster_of_run(run, sources), run.run_dir)
        # the run's first task took the cluster's controller lock for this command (lock.OWNER_ENV): the command's
        # later runs (remediate's apply and re-audit) hold it already
        addresses = cluster_addresses(cluster.play_view())
        if addresses:
            note_held(addresses)
    hosts: dict[str, HostFacts] = {}
    for node in cluster.nodes:
        hr = run.hosts.get(node.name)
        if hr is None:
            if limit:
                continue  # outside --limit: not audited, not a finding
            hosts[node.name] = HostFacts(node.name, reachable=False, error=NOT_RUN)
            continue
        hosts[node.name] = host_facts_of(hr)
    # The cluster stays whole under --limit: ranks, NNODES, WORLD_SIZE, MASTER_ADDR and the hosts block come from
    # the whole inventory; nodes outside the limit are simply not in `hosts` (not read, not a finding).
    ctx = Context(cluster, hosts, thresholds or Thresholds())
    if probe:
        for name, why in unprobed(ctx).items():
            ctx.unanalysed.setdefault(name, {})["probe"] = why
    return ctx, run


def unprobed(ctx: Context) -> dict[str, str]:
    """{node: why} for each audited node with a cluster address on which no probe ran although the run asked for
    probes (no probe result, `HostFacts.probe`, and no listener error): the probe checks are then not evaluated
    there, never passed (a skipped probe task, a playbook that lost the probe plan). A run of one node has no
    peer to probe."""
    audited = ctx.audited()
    if len(audited) < 2:
        return {}
    out: dict[str, str] = {}
    for name, f in audited:
        listener: Mapping[str, Any] = f.get("probe") or {}
        cluster: Mapping[str, Any] = f.get("cluster") or {}
        if cluster.get("address") and ctx.hosts[name].probe is None and not listener.get("error"):
            out[name] = "no probe ran on this node (its facts task returned no prober result)"
    return out


def host_facts_of(hr: HostResult) -> HostFacts:
    """One node's HostFacts from its run result (the CLI's events): a node whose module failed (SSH worked) is
    `failed`, with the module's own error, never unreachable."""
    # by identity: the module, whatever the task is named; its facts task (a second, probe-only one returns none)
    facts_task = hr.find(FACTS_MODULE, ran=True, has="ansible_facts")
    # the last task that returned the facts: the second round's (probe result folded in) when there was one
    found = hr.fact(FACTS_KEY)
    return host_facts(
        hr.name,
        fold_collected(hr, found),
        error=hr.module_error or hr.message,
        unreachable=hr.unreachable,
        failed=hr.failed,
        collected_at=parse_event_time(facts_task.created) if facts_task else None,
        window=_window(facts_task),
    )


#: The facts role's second round: the module that collects a detached prober's result (`probe`).
COLLECT_MODULE = "ddpfix_probe"


def fold_collected(hr: HostResult, found: tuple[TaskResult, Any] | None) -> Mapping[str, Any] | None:
    """The node's facts (`found`: the last task that returned them) with the probe result its second round collected
    folded into `probe`, as the role's set_fact after the collect task does (tag ddpfix_facts_fold: the CLI leaves
    that task out and folds here, sparing a task per node). A collect result that came before the facts was folded
    by that set_fact already; a collect task that failed or was skipped folds nothing."""
    node = found[1] if found else None
    collected = hr.find(COLLECT_MODULE, ran=True, has="probe")
    if (not isinstance(node, Mapping) or found is None or collected is None or collected.status != "ok"
            or not isinstance(collected.res.get("probe"), Mapping)
            or hr.tasks.index(collected) < hr.tasks.index(found[0])):
        return node
    return {**node, "probe": {**(node.get("probe") or {}), **collected.res["probe"]}}


#: The audit play's first task: the cluster derived and validated from the inventory, on the controller.
CLUSTER_ACTION = "ddpfix_cluster"


def _input_error_first(read: Callable[[], Cluster], run_dir: Path | None = None) -> Cluster:
    """`read()`; when it finds invalid input, the run stopped before any node was contacted: its run directory
    (`run_dir`, else this command's newest) holds nothing to keep and goes, as if nothing had run."""
    try:
        return read()
    except DdpfixError:
        spent = run_dir or last_run_dir()
        if spent is not None:
            discard_run_dir(spent)
        raise


def cluster_of_run(run: RunResult, inventories: Sequence[str]) -> Cluster:
    """The cluster the audit play's first task derived from the inventory (the one read of it, by ansible-playbook).
    Its validation error is the CLI's (one line, its exit code). When the task did not run (the play matched no
    host, or stopped before it), the inventory is read here, and its own error, if it has one, is raised."""
    for hr in run.hosts.values():
        task = hr.find(CLUSTER_ACTION, ran=True)
        if task is None:
            continue
        if task.status == "failed":
            raise DdpfixError(str(task.res.get("msg") or "invalid inventory"),
                              ExitCode(int(task.res.get("ddpfix_exit_code") or ExitCode.INVALID_INPUT)))
        derived = task.res.get("cluster")
        if isinstance(derived, Mapping):
            return cluster_from_data(derived, inventories)
        data = task.res.get("inventory")
        if isinstance(data, Mapping):
            return cluster_from_inventory_data(data, inventories)
    return load_cluster(inventories)


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def cluster_from_data(data: Mapping[str, Any], inventories: Sequence[str] = ()) -> Cluster:
    """The cluster the audit play's first task derived (`dataclasses.asdict` of it, in its result `cluster`), handed
    along as it is: derived and validated once per run, by that task, not again here."""
    fields = {k: _frozen(v) for k, v in data.items() if k != "nodes"}
    nodes = tuple(Node(**{k: _frozen(v) for k, v in n.items()}) for n in data.get("nodes") or ())
    return Cluster(**{**fields, "nodes": nodes, "inventories": tuple(inventories) or fields.get("inventories", ())})


#: What the facts module returns a node's facts as: `ansible_facts[FACTS_KEY]`.
FACTS_KEY = "ddpfix_node"
#: Keys of a probe result, inside the facts' `probe` (with the listener's state; `checked`: deviations-only mode).
PROBE_RESULT_KEYS = frozenset({"connects", "resolve", "routes", "checked"})
NOT_RUN = "host did not run (not matched by the play)"
#: The facts role's registered result of its probe-only task (when the probes wait for the facts' cluster addresses).
PROBED_VAR = "__ddpfix_facts_probed"


def node_from_wire(node: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the facts as the facts module sent them (`schema` 2), with its one packed field read back:
    `hosts_lines` (one string, `ddpfix_nodeinfo.pack_hosts_entries`) becomes the `hosts_file` entries the checks
    read (schema 1's form), parsed here by the node's own line parser (`unpack_hosts_lines`). Facts without it
    (recorded or saved in schema 1's form) as they are."""
    out = dict(node)
    if "hosts_lines" in out:
        packed = out.pop("hosts_lines")
        out["hosts_file"] = collection.module_utils("ddpfix_nodeinfo").unpack_hosts_lines(packed)
        if not isinstance(packed, str):  # not what the module sends: /etc/hosts was not read, never an empty file
            unread = out.get("unread")
            out["unread"] = [*(unread if isinstance(unread, list) else []), {
                "source": "hosts_file", "reason": f"the node sent its /etc/hosts entries as {type(packed).__name__}, "
                                                  "not the facts module's text: not read"}]
        if out.get("schema") == 2:
            out["schema"] = 1
    return out


def host_facts(name: str, node: Mapping[str, Any] | None, *, probe: Mapping[str, Any] | None = None,
               error: str = "", unreachable: bool = False, failed: bool = False, collected_at: float | None = None,
               window: tuple[float, float] | None = None) -> HostFacts:
    """One node's HostFacts from what the facts play returned: `ansible_facts.ddpfix_node` (`node`), and the probe
    result, read from the facts (`ddpfix_node.probe`, once folded there) when they carry one, else from the probe
    task's result (`probe`). The one conversion, for the CLI (runner events) and the action plugin (hostvars).
    `window` (the controller's task start..result) is narrowed by the node's own `now_elapsed` (the module's start
    to its clock reading)."""
    folded = (node or {}).get("probe")
    if isinstance(folded, Mapping) and PROBE_RESULT_KEYS & set(folded):
        probe = folded
    elif probe is not None and not PROBE_RESULT_KEYS & set(probe):
        probe = None  # skipped, failed or unreachable: no probe result
    if window is not None and node is not None:
        try:
            lo = window[0] + max(0.0, float(node.get("now_elapsed") or 0))
            window = (lo, window[1]) if lo <= window[1] else window
        except (TypeError, ValueError):
            pass
    return HostFacts(
        name=name,
        reachable=not unreachable and node is not None,
        error=error,
        failed=failed and not unreachable,
        node=cast(NodeFacts, node_from_wire(node)) if node is not None else None,
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
        window = clock_window(*win) if isinstance(win, (list, tuple)) and len(win) == 2 else None
        if from_run:
            if not hv.get("ddpfix_audit_in_run"):
                if limit:
                    continue
                out[n.name] = HostFacts(n.name, reachable=False, error=NOT_RUN)
                continue
            res = hv.get("ddpfix_facts_result")
            if not isinstance(res, Mapping) or res.get("unreachable") or res.get("failed") or res.get("skipped"):
                why = (res or {}).get("msg") if isinstance(res, Mapping) else None
                broke = isinstance(res, Mapping) and bool(res.get("failed")) and not res.get("unreachable")
                out[n.name] = HostFacts(n.name, reachable=False, failed=broke, error=_one_line(
                    (module_failure(res) if broke and isinstance(res, Mapping) else None) or why
                    or "no facts in this run: unreachable or failed before the facts task"))
                continue
            got = (res.get("ansible_facts") or {}).get(FACTS_KEY)
            probed = hv.get(PROBED_VAR)  # the second, probe-only task of this run (probes at cluster addresses)
            if isinstance(got, Mapping) and isinstance(probed, Mapping) and isinstance(probed.get("probe"), Mapping):
                got = {**got, "probe": {**(got.get("probe") or {}), **probed["probe"]}}
            rp = ((got or {}).get("probe") or {}).get("result_path") if isinstance(got, Mapping) else None
            if rp and isinstance(node, Mapping) and (node.get("probe") or {}).get("result_path") == rp:
                pass  # a detached prober of this run: its result was folded into the facts by the second task
            else:
                node = got if got is not None else node
        elif node is None:
            out[n.name] = HostFacts(n.name, reachable=False, error="no facts in the fact cache")
            continue
        out[n.name] = host_facts(n.name, node, probe=hv.get("ddpfix_facts_probe_result") if from_run else None,
                                 window=window)
    return out


def probe_rounds(ctx: Context) -> dict[str, Any]:
    """How the probes ran: `rounds` 1 (one task per node) or 2 (detached probers collected by a second task: a plan
    that asked for them, `probe.rolling` false); `detached`, the nodes whose prober was collected so; `rolling`, the
    nodes whose prober outlived their task because not every node ran at once (forks below the nodes: their dials
    to later nodes were seen by those nodes' listeners, `observed`, and `unobserved` of them were not evaluated)."""
    def mode(f: Any) -> Any:
        return (f.get("probe") or {}).get("mode") if f else None

    detached = sorted(n for n, f in ctx.facts.items() if mode(f) == "detached")
    rolling = sorted(n for n, f in ctx.facts.items() if mode(f) == "rolling")
    probes: list[Any] = [(h.probe or {}) for n, h in ctx.hosts.items() if n in rolling]
    return {"rounds": 2 if detached else 1, "detached": detached, "rolling": rolling,
            "observed": sum(1 for p in probes for c in p.get("connects") or [] if c.get("observed")),
            "unobserved": sum(len(p.get("unobserved") or []) for p in probes)}


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:400]


def audit_report(ctx: Context, findings: list[Finding], *, probe: bool = True,
                 skip: str | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """The `ddpfix.report/v1` document of an audit (`ddpfix audit --format json`, the action plugin) and the
    findings it counts (causes attributed; accepted ones, --skip or ddp_skip_findings, moved to `skipped`)."""
    # CLI start: the analysis loads in the run's preload thread (ANALYSIS_MODULES), while ansible-playbook starts
    from ddpfix.causes import attribute_causes
    from ddpfix.matrix import connectivity_matrix
    from ddpfix.report import document
    from ddpfix.rules.engine import not_evaluated

    cluster = ctx.cluster
    kept, skipped = split_skipped(attribute_causes(findings, cluster.master), skip, cluster)
    doc = document("audit", cluster.inventories,
                   host_summaries(ctx.hosts, ctx.plan, cluster, not_evaluated(ctx, findings)), kept,
                   {"cluster": {"master": cluster.master, "master_port": cluster.master_port, "cidr": ctx.cidr,
                                "world_size": cluster.world_size},
                    "matrix": connectivity_matrix(ctx) if probe else None,
                    "probe_rounds": probe_rounds(ctx) if probe else None},
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
    from ddpfix.rules.firewall import active_firewalls  # CLI start: as audit_report's imports

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
            if h.failed:
                out[node.name]["module_failed"] = True  # SSH worked; `error` is the module's own error
    return out


def _window(task: TaskResult | None) -> tuple[float, float] | None:
    return clock_window(parse_event_time(task.start), parse_event_time(task.end)) if task is not None else None


def clock_window(lo: object, hi: object) -> tuple[float, float] | None:
    """The controller's clock window around a node's facts task (its start .. its result), read one way from either
    source: the CLI's runner events (`_window`) and the play's `ddpfix_facts_window` fact (the action plugin). None
    when an end is missing or not a number, or the two are out of order (never a window that could pass a check)."""
    try:
        start, end = float(lo), float(hi)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return (start, end) if start <= end else None


def run_audit(cluster: Cluster | None, **kwargs: object) -> AuditResult:
    """The audit: facts and probes, then the checks. `cluster` None: the play derives it (see `collect`)."""
    preload = (*ANALYSIS_MODULES, *kwargs.pop("preload", ()))  # type: ignore[misc]
    ctx, run = collect(cluster, preload=preload, **kwargs)  # type: ignore[arg-type]
    from ddpfix.rules.engine import run_checks  # CLI start: as audit_report's imports

    return AuditResult(ctx.cluster, ctx, run_checks(ctx), run)
