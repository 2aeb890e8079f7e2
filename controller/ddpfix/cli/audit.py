"""`ddpfix audit`: report every host/network cause of torch.distributed failures; change nothing."""

from __future__ import annotations

import click

from ddpfix import pipeline
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
from ddpfix.matrix import render_matrix_text
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
@click.pass_obj
def command(app: Application, fmt: str, output: str | None, skip: str | None, fail_on: str, probe: bool,
            probe_peers: int, probe_timeout: float, max_skew: float, matrix: bool) -> None:
    """Collect facts on every node, probe the network between nodes, report findings.

    Read-only: the only thing started on a node is a short-lived probe listener, stopped again.
    Exit 0: nothing at or above --fail-on; 1: findings; 2: invalid input; 3: the run failed.
    """
    output_target(fmt, output)  # a contradicting -o is refused before anything runs
    app.slurm_count_as_finding = True  # the user asked for a check: a finding, not a refusal
    inventories = inventory_of(app)  # read once, by the audit's ansible-playbook (its first task derives the cluster)
    with Progress(None, "ddpfix audit", enabled=None if fmt in ("text", "table") else False) as progress:
        result = pipeline.audit(None, inventories=inventories, limit=app.limit, forks=app.forks,
                                verbosity=app.verbosity, probe=probe, probe_peers=probe_peers,
                                probe_timeout=probe_timeout, progress=progress,
                                thresholds=Thresholds(max_skew_s=max_skew),
                                preload=OUTPUT_MODULES + (TABLE_MODULES if fmt == "table" else ()))
    v = pipeline.verdict(result, probe=probe, skip=skip, fail_on=fail_on)
    doc, code = v.doc, v.code
    exit_line = f"exit {int(code)}: {v.line}"
    if matrix and fmt in ("text", "table"):
        click.echo(render_matrix_text(doc["matrix"]) + "\n")
    emit(doc, fmt, output, exit_line, code)
    if code:
        raise SystemExit(int(code))
