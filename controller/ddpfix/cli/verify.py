"""`ddpfix verify`: testinfra end-state checks, active probes, and optionally a real torch all-reduce."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from ddpfix.app import Application, ExitCode
from ddpfix.audit import run_audit
from ddpfix.cli.common import cluster_of, global_options
from ddpfix.progress import Progress
from ddpfix.report import SCHEMA, to_json
from ddpfix.verify import run_torch, testinfra_checks, torch_missing_line


@click.command("verify")
@global_options
@click.option("--torch", "torch_", is_flag=True, help="Also run a real torch.distributed Gloo all-reduce with torchrun.")
@click.option("--no-checks", is_flag=True, help="Skip the testinfra end-state checks (e.g. only the torch run).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def command(app: Application, torch_: bool, no_checks: bool, fmt: str) -> None:
    """Check the end state on every node; exit 0 only when every check (and the all-reduce) passes."""
    cluster = cluster_of(app)
    quiet = fmt == "json"
    with Progress(cluster.names, "ddpfix verify: probes", enabled=None if not quiet else False) as progress:
        audit = run_audit(cluster, limit=app.limit, forks=app.forks, verbosity=app.verbosity, progress=progress)
    checks = [] if no_checks else testinfra_checks(audit.context, audit.findings)
    for f in audit.findings:
        if f.id == "host.unreachable":
            from ddpfix.verify import Check

            checks.append(Check(f.host or "", "reachable over SSH", False, f.evidence))
    torch_results = None
    if torch_:
        with Progress(cluster.names, "ddpfix verify: torch all-reduce", enabled=None if not quiet else False) as progress:
            torch_results = run_torch(cluster, limit=app.limit, forks=app.forks, verbosity=app.verbosity,
                                      progress=progress, findings=audit.findings)
    ok = all(c.ok for c in checks) and (torch_results is None or all(r["ok"] for r in torch_results))
    torch_missing = torch_missing_line(torch_results or [])
    doc = {"schema": SCHEMA, "command": "verify", "inventory": list(cluster.inventories), "ok": ok,
           "checks": [c.to_json() for c in checks], "torch": torch_results}
    if quiet:
        sys.stdout.write(to_json(doc))
    else:
        con = Console()
        if checks:
            t = Table(title="ddpfix verify: end state", title_justify="left")
            for col in ("host", "check", "result", "detail"):
                t.add_column(col, overflow="fold")
            for c in checks:
                t.add_row(c.host, c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", c.detail.replace("[", r"\["))
            con.print(t)
        if torch_missing:  # one line, not a table of tracebacks from every node
            click.echo(torch_missing)
        elif torch_results is not None:
            t = Table(title="torch.distributed all-reduce (Gloo, torchrun)", title_justify="left")
            for col in ("host", "result", "detail"):
                t.add_column(col, overflow="fold")
            for r in torch_results:
                detail = (f"rank {r['result']['rank']}/{r['result']['world_size']} sum={r['result']['sum']} in {r['result']['seconds']}s"
                          if r["ok"] else f"{r.get('error')}\nlikely cause: {r.get('cause')}")
                t.add_row(r["host"], "[green]ok[/]" if r["ok"] else "[red]FAIL[/]", detail.replace("[", r"\["))
            con.print(t)
        if ok:
            con.print("[green]verify: all checks passed[/]")
        elif not (torch_missing and all(c.ok for c in checks)):
            con.print("[red]verify: failures above[/]")
    raise SystemExit(int(ExitCode.OK if ok else ExitCode.FINDINGS))
