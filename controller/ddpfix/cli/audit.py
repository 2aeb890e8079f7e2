"""`ddpfix audit`: report every host/network cause of torch.distributed failures; change nothing."""

from __future__ import annotations

import click

from ddpfix.app import Application, ExitCode
from ddpfix.audit import run_audit
from ddpfix.checks import Thresholds, not_evaluated
from ddpfix.cli.common import cluster_of, emit, host_summaries, output_options, probe_options
from ddpfix.findings import Severity
from ddpfix.progress import Progress
from ddpfix.report import document


@click.command("audit")
@output_options
@click.option("--fail-on", type=click.Choice(["error", "warning", "info"]), default="warning", show_default=True,
              help="Exit 1 when a finding of this severity or worse is reported.")
@probe_options
@click.option("--max-skew", type=click.FloatRange(0.001, 3600), default=1.0, show_default=True,
              help="Clock difference between nodes above which time.skew is reported, seconds.")
@click.pass_obj
def command(app: Application, fmt: str, output: str | None, fail_on: str, probe: bool, probe_peers: int,
            probe_timeout: float, max_skew: float) -> None:
    """Collect facts on every node, probe the network between nodes, report findings.

    Read-only: the only thing started on a node is a short-lived probe listener, stopped again.
    Exit 0: nothing at or above --fail-on; 1: findings; 2: invalid input; 3: the run failed.
    """
    cluster = cluster_of(app)
    with Progress(cluster.names, "ddpfix audit", enabled=None if fmt == "table" else False) as progress:
        result = run_audit(cluster, limit=app.limit, forks=app.forks, verbosity=app.verbosity, probe=probe,
                           probe_peers=probe_peers, probe_timeout=probe_timeout, progress=progress,
                           thresholds=Thresholds(max_skew_s=max_skew))
    ctx = result.context
    doc = document("audit", cluster.inventories,
                   host_summaries(ctx.hosts, ctx.plan, ctx.cluster, not_evaluated(ctx, result.findings)), result.findings,
                   {"cluster": {"master": cluster.master, "master_port": cluster.master_port, "cidr": ctx.cidr,
                                "world_size": cluster.world_size}})
    emit(doc, fmt, output)
    threshold = Severity.parse(fail_on)
    if any(f.severity >= threshold for f in result.findings):
        raise SystemExit(int(ExitCode.FINDINGS))
