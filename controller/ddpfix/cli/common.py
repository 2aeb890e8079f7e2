"""Options and helpers shared by subcommands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ddpfix.app import Application, DdpfixError, ExitCode
from ddpfix.inventory import Cluster, load_cluster
from ddpfix.render import EXTENSIONS, FORMATS, RENDERERS, render_text

#: What `emit` needs, not imported with the CLI: a run imports it while ansible-playbook starts (runner `preload`).
OUTPUT_MODULES = ("rich.console", "rich.table")

F = TypeVar("F", bound=Callable[..., Any])


INVENTORY_HELP = "Ansible inventory: file, directory or ad-hoc host list 'host1,host2,'; repeatable"
LIMIT_HELP = "Ansible host pattern: restrict the run to matching hosts"
FORKS_HELP = "Parallel SSH connections; default: one per host up to 50"
SLURM_HELP = ("Inventory = this Slurm allocation (SLURM_JOB_NODELIST; master = first node); -i files then only "
              "add variables.")
VERBOSE_HELP = "More output (and tracebacks of internal errors); -vvv passes -vvv to Ansible."


def _override(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """Callback of a global option repeated after the subcommand: a value given there replaces the group's."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if ctx.get_parameter_source(param.name or "") is ParameterSource.COMMANDLINE:
            setattr(ctx.ensure_object(Application), attr, tuple(value) if isinstance(value, (list, tuple)) else value)

    return callback


def global_options(f: F) -> F:
    """`-i/--limit/--forks/-v` also after the subcommand (`ddpfix audit -i INV`), overriding those before it.

    The environment variables are read once, by the group's options; these only take the command line.
    """
    f = click.option("-v", "--verbose", "verbosity", count=True, expose_value=False, callback=_override("verbosity"),
                     help=VERBOSE_HELP)(f)
    f = click.option("--forks", type=click.IntRange(1, 500), expose_value=False, callback=_override("forks"),
                     help=f"{FORKS_HELP} [env: DDPFIX_FORKS].")(f)
    f = click.option("--limit", metavar="PATTERN", expose_value=False, callback=_override("limit"),
                     help=f"{LIMIT_HELP} [env: DDPFIX_LIMIT].")(f)
    f = click.option("--slurm", is_flag=True, expose_value=False, callback=_override("slurm"), help=SLURM_HELP)(f)
    f = click.option("-i", "--inventory", "inventories", metavar="INV", multiple=True, expose_value=False,
                     callback=_override("inventories"), help=f"{INVENTORY_HELP} [env: DDPFIX_INVENTORY].")(f)
    return f


def output_options(f: F) -> F:
    f = click.option("--skip", "skip", metavar="ID[@HOST],...",
                     help="Accept these findings (also ddp_skip_findings): reported as skipped, not counted.")(f)
    f = click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
                     help="Also write the report to this file: in --format's format when that is a file format, "
                          "else by extension (.json .html .xml=junit .prom=prometheus .txt=plain; default JSON).")(f)
    f = click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="text", show_default=True,
                     help="text: grouped by host, root causes first; table: the wide table; json; plain: one line "
                          "per finding; junit; prometheus (node_exporter textfile); html (one self-contained file).")(f)
    return f


def render(doc: Mapping[str, Any], fmt: str, exit_line: str | None = None) -> str:
    if fmt == "json":
        from ddpfix.report import to_json

        return to_json(doc)
    if fmt == "text":
        return render_text(doc, exit_line=exit_line)
    return RENDERERS[fmt](doc)


def probe_options(f: F) -> F:
    f = click.option("--probe-timeout", type=click.FloatRange(0.1, 30), default=2.0, show_default=True,
                     help="TCP connect timeout of each probe, seconds.")(f)
    f = click.option("--probe-peers", type=click.IntRange(0, 64), default=2, show_default=True,
                     help="Peers each node dials besides the master (ring successors): (1+K)*N connections.")(f)
    f = click.option("--probe/--no-probe", default=True, show_default=True, help="Run the active network probes.")(f)
    return f


def cluster_of(app: Application) -> Cluster:
    """The inventory's cluster, under the cluster's controller lock (keyed on its node addresses, held until the
    command ends)."""
    cluster = load_cluster(app.require_inventory())
    _hold_controller_lock(tuple(n.address for n in cluster.nodes))
    return cluster


def inventory_of(app: Application) -> tuple[str, ...]:
    """The inventory's paths, checked to exist, without reading them (the audit's ansible-playbook reads the
    inventory, once, and the cluster comes from its first task; that process takes the cluster's controller lock
    then, before any node is contacted: strategy ddpfix_linear)."""
    from ddpfix.runner import check_inventory_paths

    inventories = app.require_inventory()
    check_inventory_paths(inventories)
    return inventories


def _hold_controller_lock(addresses: tuple[str, ...]) -> None:
    from ddpfix.lock import controller_lock

    lock = controller_lock(addresses)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(lock.release)


def emit(doc: dict[str, Any], fmt: str, output: str | None, exit_line: str | None = None) -> None:
    """The report on stdout in `fmt`; with -o also into a file (a file format: html, junit and prometheus go only
    to the file when -o is given, and stdout gets the text report)."""
    if output:
        ffmt = fmt if fmt not in ("text", "table") else EXTENSIONS.get(Path(output).suffix.lower(), "json")
        path = Path(output)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(render(doc, ffmt))
            tmp.replace(path)
        except OSError as exc:
            raise DdpfixError(f"cannot write {output}: {exc.strerror}", ExitCode.INVALID_INPUT) from exc
        if fmt in ("html", "junit", "prometheus"):
            fmt = "text"
    if fmt == "table":
        from rich.console import Console

        from ddpfix.report import render_table

        render_table(doc, Console(soft_wrap=False))
        if exit_line:
            click.echo(exit_line)
    else:
        sys.stdout.write(render(doc, fmt, exit_line))
