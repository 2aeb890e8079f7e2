"""`ddpfix remediate`: show (dry run) or make (--apply) the fixes for what the audit finds."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape

from ddpfix import pipeline
from ddpfix.app import Application
from ddpfix.cli.common import emit, global_options, inventory_of, output_options, output_target
from ddpfix.errors import ExitCode
from ddpfix.model.finding import Finding
from ddpfix.remediate import (
    Change,
    HostPlan,
)
from ddpfix.rules.registry import fixable_ids


@click.command("remediate")
@global_options
@click.option("--apply", "apply", is_flag=True, help="Make the changes (default: dry run, nothing touched).")
@click.option("--only", help="Comma-separated finding ids to fix (default: every fixable finding): "
              + ", ".join(fixable_ids()) + ".")
@click.option("--allow-partial", is_flag=True, help="Write env files even when some nodes are unreachable.")
@click.option("--pin-ifnames", is_flag=True,
              help="Also write a systemd .link file pinning each node's cluster NIC name to its MAC "
                   "(effective at next boot).")
@output_options
@click.pass_obj
def command(app: Application, apply: bool, only: str | None, allow_partial: bool, pin_ifnames: bool, fmt: str,
            output: str | None, skip: str | None) -> None:
    """Fix every fixable finding: firewall (cluster CIDR only), /etc/hosts block, chrony, env files.

    Without --apply: a dry run (Ansible check + diff mode) listing every change per host; exit 0 when
    nothing would change, 1 when changes are pending. With --apply: make them, re-audit, exit 0 when
    no fixable finding remains, else 1.
    """
    output_target(fmt, output)  # a contradicting -o is refused before anything runs
    only_ids = pipeline.parse_only(only, "--only")
    inventories = inventory_of(app)  # read once, by the audit's ansible-playbook (its first task derives the cluster)
    quiet = fmt not in ("text", "table")
    err = Console(stderr=True, soft_wrap=True)
    r = pipeline.remediate(None, inventories=inventories, apply=apply, only=only_ids, skip=skip,
                           allow_partial=allow_partial, pin_ifnames=pin_ifnames, limit=app.limit, forks=app.forks,
                           verbosity=app.verbosity, progress=None if not quiet else False)
    fixes, applied = r.fixes, r.applied
    changes, failed, refusals, plans = applied.changes, applied.failed, fixes.refusals, fixes.plans
    remaining, stuck = r.remaining, r.not_effective
    doc = r.doc
    if not quiet:
        _print_changes(err, changes, apply, failed, refusals, plans)
        for f in stuck:
            err.print(f"[red]not fixed[/] {escape(pipeline.not_effective_text(f))}", highlight=False)
    code = r.code
    emit(doc, fmt, output, _exit_line(code, apply, remaining, failed, refusals, changes), code)
    if applied.interrupted:
        run = applied.run
        if quiet:  # the JSON report on stdout has the diffs; stderr still says what changed where
            for c in changes:
                err.print(f"{'changed' if apply else 'would change'} {c.host}: {c.task}", highlight=False,
                          markup=False)
        done = ("the changes above were made" if apply else
                "nothing was changed (dry run); the changes above are those found before the signal, others may be "
                "missing")
        err.print(f"[red]interrupted[/]: no new task was started after the signal; {done} "
                  f"(run dir: {run.run_dir if run else '-'}); run the same command again to finish", highlight=False)
        raise SystemExit(int(ExitCode.INTERRUPTED))
    raise SystemExit(int(code))


def _exit_line(code: ExitCode, apply: bool, remaining: list[Finding], failed: dict[str, str], refusals: list[str],
               changes: list[Change]) -> str:
    if code == ExitCode.INTERRUPTED:
        return "exit 6: interrupted; run the same command again to finish"
    if not apply:
        return (f"exit 1: {len(changes)} change{'s' if len(changes) != 1 else ''} pending (dry run; --apply makes them)"
                if code else "exit 0: nothing to change")
    if code == ExitCode.OK:
        return "exit 0: no fixable finding remains"
    parts = [f"{len(remaining)} fixable finding{'s' if len(remaining) != 1 else ''} remain"] if remaining else []
    parts += [f"{len(failed)} host{'s' if len(failed) != 1 else ''} failed"] if failed else []
    parts += ["a write was refused"] if refusals else []
    return f"exit 1: {', '.join(parts) or 'see above'}"


def _print_changes(con: Console, changes: list[Change], apply: bool, failed: dict[str, str], refusals: list[str],
                   plans: dict[str, HostPlan]) -> None:
    verb = "changed" if apply else "would change"
    if not changes:
        con.print(f"[green]no changes[/] ({'applied' if apply else 'dry run'})")
    host = None
    for c in changes:
        if c.host != host:
            host = c.host
            con.rule(f"{host}: {verb}")
        con.print("[yellow]*[/] ", end="")
        con.print(c.task, highlight=False, markup=False)
        if c.diff:
            con.print(c.diff, highlight=False, markup=False)
    for h, msg in sorted(failed.items()):
        con.print(f"[red]failed[/] {h}: {msg}", highlight=False)
    for r in refusals:
        con.print(f"[red]refused[/] {r}", highlight=False)
    for h, p in sorted(plans.items()):
        for n in p.notes:
            con.print(f"[yellow]note[/] {h}: {n}", highlight=False)
