"""`ddpfix audit`: report every host/network cause of torch.distributed failures; change nothing."""

from __future__ import annotations

import click

from ddpfix.app import Application, ExitCode
from ddpfix.audit import run_audit
from ddpfix.causes import attribute_causes
from ddpfix.checks import Thresholds, not_evaluated
from ddpfix.cli.common import (
    cluster_of,
    emit,
    global_options,
    host_summaries,
    output_options,
    probe_options,
    split_skipped,
)
from ddpfix.findings import Severity
from ddpfix.matrix import connectivity_matrix, render_matrix_text
from ddpfix.progress import Progress
from ddpfix.report import document


@click.command("audit")
@global_options
@output_options
@click.option("--fail-on", type=click.Choice(["error", "warning", "info"]), default="warning", show_default=True,
              help="Exit 1 when a finding of this severity or worse is reported.")
@probe_options
@click.option("--max-skew", type=click.FloatRange(0.001, 3600), default=1.0, show_default=True,
              help="Clock difference between nodes above which time.skew is reported, seconds.")
@click.option("--matrix", is_flag=True, help="Also show the N x N reachability/resolution matrix (rows dial columns).")
@click.pass_obj
def command(app: Application, fmt: str, output: str | None, skip: str | None, fail_on: str, probe: bool,
            probe_peers: int, probe_timeout: float, max_skew: float, matrix: bool) -> None:
    """Collect facts on every node, probe the network between nodes, report findings.

    Read-only: the only thing started on a node is a short-lived probe listener, stopped again.
    Exit 0: nothing at or above --fail-on; 1: findings; 2: invalid input; 3: the run failed.
    """
    cluster = cluster_of(app)
    with Progress(cluster.names, "ddpfix audit", enabled=None if fmt in ("text", "table") else False) as progress:
        result = run_audit(cluster, limit=app.limit, forks=app.forks, verbosity=app.verbosity, probe=probe,
                           probe_peers=probe_peers, probe_timeout=probe_timeout, progress=progress,
                           thresholds=Thresholds(max_skew_s=max_skew))
    ctx = result.context
    findings, skipped = split_skipped(attribute_causes(result.findings, cluster.master), skip, cluster)
    grid = connectivity_matrix(ctx)
    doc = document("audit", cluster.inventories,
                   host_summaries(ctx.hosts, ctx.plan, ctx.cluster, not_evaluated(ctx, result.findings)), findings,
                   {"cluster": {"master": cluster.master, "master_port": cluster.master_port, "cidr": ctx.cidr,
                                "world_size": cluster.world_size},
                    "matrix": grid if probe else None},
                   skipped=skipped)
    threshold = Severity.parse(fail_on)
    failing = [f for f in findings if f.severity >= threshold]
    code = ExitCode.FINDINGS if failing else ExitCode.OK
    exit_line = (f"exit {int(code)}: {len(failing)} finding{'s' if len(failing) != 1 else ''} at or above {fail_on}"
                 if failing else f"exit 0: nothing at or above {fail_on}")
    if matrix and fmt in ("text", "table"):
        click.echo(render_matrix_text(grid) + "\n")
    emit(doc, fmt, output, exit_line)
    if code:
        raise SystemExit(int(code))
