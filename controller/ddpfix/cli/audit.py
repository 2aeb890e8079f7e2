"""`ddpfix audit`: report every host/network cause of torch.distributed failures; change nothing."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from ddpfix import factsdir, pipeline
from ddpfix.app import Application
from ddpfix.cli.common import (
    OUTPUT_MODULES,
    TABLE_MODULES,
    emit,
    global_options,
    inventory_of,
    output_options,
    output_target,
    probe_options,
)
from ddpfix.factsdir import DEFAULT_MAX_AGE_S
from ddpfix.inventory.derive import load_cluster
from ddpfix.progress import Progress
from ddpfix.rules.context import Thresholds
from ddpfix.rules.time import SKEW


@click.command("audit")
@global_options
@output_options
@click.option("--fail-on", type=click.Choice(["error", "warning", "info", "none"]), default="warning",
              show_default=True,
              help="Exit 1 when a finding of this severity or worse is reported; none: never (report only).")
@probe_options
@click.option("--max-skew", type=click.FloatRange(0.001, 3600), default=1.0, show_default=True,
              help=f"Clock difference between nodes above which {SKEW.id} is reported, seconds.")
@click.option("--matrix", is_flag=True, help="Also show the N x N reachability/resolution matrix (rows dial columns).")
@click.option("--facts-out", metavar="DIR",
              help="Also save this run's facts in DIR, one file per node (a --limit batch of a fleet; "
                   "docs/fleet.md).")
@click.option("--facts-in", metavar="DIR", multiple=True,
              help="Contact no node: audit the whole inventory from the facts batches saved with --facts-out in "
                   "these directories; repeatable. A node without a file, or with one past --facts-max-age, is not "
                   "read.")
@click.option("--facts-max-age", type=click.FloatRange(1, 30 * 86400), default=DEFAULT_MAX_AGE_S, show_default=True,
              metavar="SECONDS", help="With --facts-in: saved facts older than this are not read.")
@click.pass_obj
def command(app: Application, fmt: str, output: str | None, skip: str | None, fail_on: str, probe: bool,
            probe_peers: int, probe_timeout: float, max_skew: float, matrix: bool, facts_out: str | None,
            facts_in: tuple[str, ...], facts_max_age: float) -> None:
    """Collect facts on every node, probe the network between nodes, report findings.

    Read-only: the only thing started on a node is a short-lived probe listener, stopped again.
    Exit 0: nothing at or above --fail-on; 1: findings; 2: invalid input; 3: the run failed.
    """
    output_target(fmt, output)  # a contradicting -o is refused before anything runs
    app.slurm_count_as_finding = True  # the user asked for a check: a finding, not a refusal
    if facts_in:
        if facts_out or app.limit:
            app.abort("--facts-in reads saved batches and runs nothing: without --facts-out and --limit")
        ctx = click.get_current_context()
        for name, flag, value in (("probe_peers", "--probe-peers", probe_peers),
                                  ("probe_timeout", "--probe-timeout", probe_timeout)):
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:  # it would be silently ignored
                app.abort(f"{flag} {value}: --facts-in runs no probe (it reads the probes the batches ran); "
                          f"give {flag} to the batches' audits")
        _merged(app, facts_in, facts_max_age, fmt=fmt, output=output, skip=skip, fail_on=fail_on, probe=probe,
                max_skew=max_skew, matrix=matrix)
        return
    if facts_out:
        factsdir.prepare(facts_out)  # refused before anything runs
    inventories = inventory_of(app)  # read once, by the audit's ansible-playbook (its first task derives the cluster)
    with Progress(None, "ddpfix audit", enabled=None if fmt in ("text", "table") else False) as progress:
        result = pipeline.audit(None, inventories=inventories, limit=app.limit, forks=app.forks,
                                verbosity=app.verbosity, probe=probe, probe_peers=probe_peers,
                                probe_timeout=probe_timeout, progress=progress,
                                thresholds=Thresholds(max_skew_s=max_skew),
                                preload=OUTPUT_MODULES + (TABLE_MODULES if fmt == "table" else ()))
    extra = None
    if facts_out:
        saved = factsdir.save_facts(facts_out, result.context.hosts, run_id=result.run.run_dir.name,
                                    inventory=result.cluster.inventories, limit=app.limit)
        extra = {"facts_out": {"dir": str(factsdir.prepare(facts_out)), "run_id": result.run.run_dir.name,
                               "hosts": len(saved)}}
        app.info(f"ddpfix: facts of {len(saved)} node{'s' if len(saved) != 1 else ''} saved in {facts_out}")
    _report(pipeline.verdict(result, probe=probe, skip=skip, fail_on=fail_on), fmt, output, matrix, extra)


def _merged(app: Application, dirs: tuple[str, ...], max_age: float, *, fmt: str, output: str | None,
            skip: str | None, fail_on: str, probe: bool, max_skew: float, matrix: bool) -> None:
    """`--facts-in`: the whole inventory's audit from saved batches, no node contacted."""
    cluster = load_cluster(app.require_inventory())
    result, saved = pipeline.analyze_saved(cluster, dirs, max_age=max_age, thresholds=Thresholds(max_skew_s=max_skew))
    for note in saved.notes:
        app.info(f"ddpfix: --facts-in: {note}")
    _report(pipeline.verdict(result, probe=probe, skip=skip, fail_on=fail_on), fmt, output, matrix,
            {"facts_in": saved.doc(dirs, max_age)})


def _report(v: pipeline.Verdict, fmt: str, output: str | None, matrix: bool, extra: dict[str, Any] | None) -> None:
    doc, code = v.doc, v.code
    doc.update(extra or {})
    exit_line = f"exit {int(code)}: {v.line}"
    if matrix and fmt in ("text", "table"):
        # CLI start: loaded in the run's preload thread meanwhile (ddpfix.audit.ANALYSIS_MODULES)
        from ddpfix.matrix import render_matrix_text

        click.echo(render_matrix_text(doc["matrix"]) + "\n")
    emit(doc, fmt, output, exit_line, code)
    if code:
        raise SystemExit(int(code))
