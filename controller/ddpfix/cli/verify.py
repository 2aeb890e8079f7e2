"""`ddpfix verify`: testinfra end-state checks, active probes, and optionally a real torch all-reduce."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ddpfix import pipeline
from ddpfix.app import Application
from ddpfix.cli.common import global_options, inventory_of
from ddpfix.errors import ExitCode
from ddpfix.report import to_json
from ddpfix.verify.nccl import DEFAULT_SIZES, format_size, nccl_skip_line, parse_sizes
from ddpfix.verify.torch import torch_missing_line


@click.command("verify")
@global_options
@click.option("--torch", "torch_", is_flag=True,
              help="Also run a real torch.distributed Gloo all-reduce with torchrun.")
@click.option("--no-checks", is_flag=True, help="Skip the testinfra end-state checks (e.g. only the torch run).")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True,
              help="gloo: CPU all-reduce, one process per node. nccl: GPU all-reduce sweep, one process per GPU, with "
                   "bus bandwidth and the transport NCCL chose (implies --torch).")
@click.option("--sizes", default=None, metavar="LIST",
              help="nccl: message sizes of the sweep, e.g. 8M,64M,1G (default 8M..1G, doubling).")
@click.option("--iters", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="nccl: timed all-reduces per size.")
@click.option("--min-busbw", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GBPS",
              help="nccl: fail when the bus bandwidth at the largest size is below GBPS (GB/s).")
@click.option("--pairs", is_flag=True,
              help="nccl: also run two-node sweeps over the ring of neighbour pairs (names the slow pair).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def command(app: Application, torch_: bool, no_checks: bool, backend: str, sizes: str | None, iters: int,
            min_busbw: float | None, pairs: bool, fmt: str) -> None:
    """Check the end state on every node; exit 0 only when every check (and the all-reduce) passes."""
    if backend != "nccl" and (sizes or min_busbw is not None or pairs):
        app.abort("--sizes, --min-busbw and --pairs need --backend nccl")
    try:
        size_list = parse_sizes(sizes) if sizes else DEFAULT_SIZES
    except ValueError as exc:
        app.abort(f"--sizes: {exc}")
    inventories = inventory_of(app)  # read once, by the audit's ansible-playbook (its first task derives the cluster)
    quiet = fmt == "json"
    v = pipeline.verify(None, inventories=inventories, checks=not no_checks, backend=backend, torch=torch_,
                        sizes=size_list, iters=iters, min_busbw=min_busbw, pairs=pairs, limit=app.limit,
                        forks=app.forks, verbosity=app.verbosity, progress=None if not quiet else False)
    checks, torch_results, nccl_doc, ok = v.checks, v.torch, v.nccl, v.ok
    nccl_skipped = nccl_skip_line(nccl_doc) if nccl_doc else None
    torch_missing = torch_missing_line(torch_results or [])
    doc = v.doc
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
                res = r.get("result") or {}
                detail = (f"rank {res['rank']}/{res['world_size']} sum={res['sum']} in {res['seconds']}s"
                          if r["ok"] else f"{r.get('error')}\nlikely cause: {r.get('cause')}")
                t.add_row(r["host"], "[green]ok[/]" if r["ok"] else "[red]FAIL[/]", detail.replace("[", r"\["))
            con.print(t)
        if nccl_skipped:
            click.echo(nccl_skipped)
        elif nccl_doc is not None:
            _print_nccl(con, nccl_doc)
        if ok:
            con.print("[green]verify: all checks passed[/]")
        elif not (torch_missing and all(c.ok for c in checks)):
            con.print("[red]verify: failures above[/]")
    raise SystemExit(int(ExitCode.OK if ok else ExitCode.FINDINGS))


def _print_nccl(con: Console, doc: dict[str, Any]) -> None:
    t = Table(title="NCCL all-reduce sweep (torchrun, one process per GPU); busbw = algbw * 2(n-1)/n",
              title_justify="left")
    for col in ("host", "result", "transport", "size", "time (us)", "algbw GB/s", "busbw GB/s"):
        t.add_column(col, overflow="fold")
    for e in doc["gang"]:
        kind = (e.get("transport") or {}).get("kind", "?")
        res = "[green]ok[/]" if e["ok"] else "[red]FAIL[/]"
        if not e.get("sweep"):
            t.add_row(e["host"], res, kind, "", "", "", (e.get("error") or "").replace("[", r"\["))
        for i, p in enumerate(e.get("sweep") or []):
            first = i == 0
            t.add_row(e["host"] if first else "", res if first else "", kind if first else "", format_size(p["size"]),
                      f"{p['time_us']:g}", f"{p['algbw']:g}", f"{p['busbw']:g}")
        if e.get("sweep") and e.get("error"):
            detail = e["error"] + "\nlikely cause: " + str(e.get("cause"))
            t.add_row("", "", "", "", "", "", detail.replace("[", r"\["))
    con.print(t)
    if doc.get("pairs") is not None:
        pt = Table(title="NCCL two-node sweeps over the ring of pairs", title_justify="left")
        for col in ("pair", "result", "transport", "busbw GB/s (largest size)", "detail"):
            pt.add_column(col, overflow="fold")
        for p in doc["pairs"]:
            pt.add_row(" - ".join(p["pair"]), "[green]ok[/]" if p["ok"] else "[red]FAIL[/]", str(p.get("transport")),
                       "" if p.get("busbw") is None else f"{p['busbw']:g}", (p.get("error") or "").replace("[", r"\["))
        con.print(pt)
