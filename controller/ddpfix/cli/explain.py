"""`ddpfix explain`: which known failure an error log shows, the checks that look at its cause, and (with -i) the
answer."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from typing import IO

import click

from ddpfix.app import Application
from ddpfix.cli.common import global_options
from ddpfix.diagnose.bounded import MAX_LINE, MAX_LOG_BYTES, cap_bytes, long_lines, shown
from ddpfix.diagnose.events import Event
from ddpfix.diagnose.match import FALLBACK_ADVICE, against_inventory, explain, finding_ids, log_facts
from ddpfix.diagnose.model import Diagnosis, Explanation, LogFacts
from ddpfix.errors import DdpfixError, ExitCode


@click.command("explain")
@global_options
@click.argument("logs", nargs=-1, type=click.File("rb"))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_obj
def command(app: Application, logs: tuple[IO[bytes], ...], fmt: str) -> None:
    """Name the known failure in error LOGS (files, or - for stdin; none: stdin): torchrun, torch.distributed,
    Gloo, NCCL. Several files are read as one log (one rank's file after another); bytes that are not UTF-8 are
    replaced, ANSI colours and launcher prefixes ([rank3]:, Slurm's 0:, DeepSpeed's) are ignored.

    \b
    For each failure: what it means, the finding ids whose checks look at its cause, and the audit to run.
    With an inventory (-i INV) the audit runs at once and the causes it finds are printed.
    Exit 1 when the audit (-i) found one of the causes, else 0; the JSON's `known` says whether the log
    showed a known failure.
    """
    stdin: IO[bytes] = sys.stdin.buffer
    streams: tuple[IO[bytes], ...] = logs or (stdin,)
    if not logs and sys.stdin.isatty():
        raise DdpfixError("explain: no log given: pass a file, or pipe the log into `ddpfix explain -`")
    lines, cuts = read_logs(streams)
    ex = explain(lines)
    diagnoses = ex.diagnoses
    facts = log_facts(lines)
    inv = " ".join(f"-i {i}" for i in app.inventories) or "-i INV"
    found_any = False
    notes: list[str] = []
    if diagnoses and app.inventories:
        found_any, notes = _confirm(app, diagnoses, facts)
    if fmt == "json":
        doc = {"schema": "ddpfix.explain/v1", "known": bool(diagnoses), "failures": [d.to_json() for d in diagnoses],
               "audit": f"ddpfix audit {inv}", "audited": bool(app.inventories),
               "advice": None if diagnoses else JOB_FIRST_ADVICE if ex.job_first else FALLBACK_ADVICE,
               "log": facts.to_json(), "inventory": notes,
               "events": ex.to_json(), "input": cuts}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        for cut in cuts:
            click.echo(_wrap("input: " + cut, ""))
        if ex.job_first:
            _print_job_first(ex)
        else:
            _print_text(diagnoses, inv, audited=bool(app.inventories))
            _print_hosts(ex)
            _print_consequences(ex)
        for n in notes:
            click.echo(_wrap("against the inventory: " + n, ""))
    raise SystemExit(int(ExitCode.FINDINGS if found_any else ExitCode.OK))


def read_logs(streams: tuple[IO[bytes], ...], cap: int = MAX_LOG_BYTES) -> tuple[list[str], list[str]]:
    """The lines of all streams, read up to `cap` bytes together, and a line for each cut: the input beyond the cap
    (not read), lines longer than what is matched of them. Bytes that are not UTF-8 are replaced."""
    lines: list[str] = []
    cuts: list[str] = []
    budget = cap
    for stream in streams:
        data = stream.read(budget + 1)  # one byte more: whether the input goes on past the cap
        more = len(data) > budget
        data = data[:budget]
        budget -= len(data)
        capped = cap_bytes(data, cap, more=more)
        lines += capped.text.splitlines()
        if more:
            name = str(getattr(stream, "name", "-"))
            name = "stdin" if name in ("-", "<stdin>") else shown(name, 120)
            cuts.append(capped.note(f"the log ({name} and what follows it)", cap) or "")
            break
    n = long_lines(lines)
    if n:
        cuts.append(f"{n} line{'s are' if n > 1 else ' is'} longer than {MAX_LINE} characters: only the first "
                    f"{MAX_LINE} of each were matched")
    return lines, cuts


def _confirm(app: Application, diagnoses: list[Diagnosis], facts: LogFacts) -> tuple[bool, list[str]]:
    from ddpfix import pipeline  # only with -i: the CLI's start without it stays fast
    from ddpfix.cli.common import cluster_of

    cluster = cluster_of(app)
    notes = against_inventory(diagnoses, facts, cluster)
    result = pipeline.audit(cluster, limit=app.limit, forks=app.forks, verbosity=app.verbosity)
    any_found = False
    for d in diagnoses:
        ids = set(d.pattern.finding_ids)
        d.found = [f.to_json() for f in result.findings if f.id in ids]
        any_found = any_found or bool(d.found)
    return any_found, notes


def _wrap(text: str, indent: str) -> str:
    width = max(60, min(120, shutil.get_terminal_size((100, 24)).columns))
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent)


def _where(e: Event) -> str:
    at = [f"line {e.line_no}"] + ([f"rank {e.rank}"] if e.rank is not None else []) + ([e.node] if e.node else [])
    errno = f", errno {e.errno}: {e.meaning}" if e.meaning else ""
    return f"{', '.join(at)} ({e.layer}{errno})"


def _print_job_first(ex: Explanation) -> None:
    assert ex.first is not None
    click.echo("ddpfix explain: the job failed first, not the network: no host check applies")
    click.echo(f"\n* first failure: {_where(ex.first)}: {ex.first.text}")
    click.echo(_wrap(JOB_FIRST_ADVICE, "  "))
    _print_consequences(ex)


JOB_FIRST_ADVICE = ("An error of the job itself (memory, data, the training code) came before any network failure; "
                    "what follows it (other ranks' timeouts and resets, the launcher's SIGTERM and ChildFailedError) "
                    "is its consequence: fix this error first. No host check applies.")


def _print_hosts(ex: Explanation) -> None:
    """What the log says about the hosts that matters: interfaces no peer reaches, versions that differ."""
    odd = ex.hosts.odd_interfaces()
    if not ex.diagnoses or not odd:
        return
    click.echo("\nthe log says about the hosts:")
    for i in odd[:6]:
        click.echo(f"  {i.who} uses {shown(i.name, 64)} {shown(i.address, 64)}: a {i.kind} address, no peer on "
                   "another node reaches it")


def _print_consequences(ex: Explanation) -> None:
    if not ex.consequences:
        return
    click.echo(f"\nafter the first failure, {ex.n_consequences} line{'s' if ex.n_consequences > 1 else ''} that any "
               "failure brings (consequences, not causes):")
    for e in ex.consequences:
        what = f"{e.key}: " if e.key else ""
        click.echo(f"  {_where(e)}: {what}{e.text[:160]}")
    if ex.n_consequences > len(ex.consequences):
        click.echo(f"  ... and {ex.n_consequences - len(ex.consequences)} more")


def _print_text(diagnoses: list[Diagnosis], inv: str, *, audited: bool) -> None:
    if not diagnoses:
        click.echo("ddpfix explain: no known failure in this log.")
        click.echo(_wrap(FALLBACK_ADVICE.replace("-i INV", inv), "  "))
        return
    n = len(diagnoses)
    click.echo(f"ddpfix explain: {n} known failure{'s' if n > 1 else ''}")
    for d in diagnoses:
        detail = f" ({', '.join(d.detail)})" if d.detail else ""
        click.echo(f"\n* {d.pattern.key}: {d.pattern.title}{detail}")
        more = f", and {d.count - 1} more line{'s' if d.count > 2 else ''}" if d.count > 1 else ""
        click.echo(f"  line {d.line_no}{more}: {d.line}")
        click.echo(_wrap(d.pattern.meaning, "  "))
        if d.pattern.finding_ids:
            if d.checks and d.why:
                click.echo(_wrap(f"look first at: {', '.join(d.checks)} ({d.why})", "  "))
            click.echo(f"  checked by: {', '.join(d.pattern.finding_ids)}")
        else:
            click.echo("  checked by: no host check (not the network: the audit will not find this)")
        click.echo(_wrap("fix: " + d.pattern.advice, "  "))
        for note in d.notes:
            click.echo(_wrap("against the inventory: " + note, "  "))
        if audited:
            if d.found:
                click.echo("  the audit found:")
                for f in d.found:
                    click.echo(f"    {f['severity']} {f['id']} on {f['host'] or 'cluster'}: {f['message']}")
            elif d.pattern.finding_ids:
                click.echo("  the audit found none of these causes: look outside the hosts (a cloud security group,"
                           " a switch ACL, the job's own arguments)")
    if not audited:
        ids = finding_ids(diagnoses)
        if ids:
            click.echo(f"\nrun: ddpfix audit {inv}    (the checks above: {', '.join(ids)})")
