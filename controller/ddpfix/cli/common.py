"""Options and helpers shared by subcommands."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ddpfix.ansible.args import AnsibleArgs, merge_extra_vars
from ddpfix.app import Application
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.formats import FORMATS, output_format
from ddpfix.inventory.derive import load_cluster
from ddpfix.model.cluster import Cluster
from ddpfix.safefile import write_atomic

#: What `emit` needs, not imported with the CLI: a run imports it while ansible-playbook starts (runner `preload`);
#: rich only for the table (json, text and the file formats do not use it).
OUTPUT_MODULES = ("ddpfix.render",)
TABLE_MODULES = ("rich.console", "rich.table")

F = TypeVar("F", bound=Callable[..., Any])


INVENTORY_HELP = "Ansible inventory: file, directory or ad-hoc host list 'host1,host2,'; repeatable"
LIMIT_HELP = "Ansible host pattern: restrict the run to matching hosts"
FORKS_HELP = "Parallel SSH connections; default: one per host up to 50"
SLURM_HELP = ("Inventory = this Slurm allocation (SLURM_JOB_NODELIST; master = first node); -i files then only "
              "add variables.")
VERBOSE_HELP = ("Ansible's own output, live on stderr, at this verbosity (-v to -vvvv, as ansible-playbook's), and "
                "tracebacks of internal errors.")
EXTRA_VARS_HELP = ("Extra variables as in ansible-playbook: key=value, YAML/JSON, or @file; repeatable, later wins; "
                   "ddp_* values count for the plan too; ddpfix_* names are refused")
USER_HELP = "Connect as this user (ansible-playbook -u) [env: ANSIBLE_REMOTE_USER, read by Ansible]"
BECOME_HELP = "Run operations with become (ansible-playbook -b) [env: ANSIBLE_BECOME, read by Ansible]"
PRIVATE_KEY_HELP = "SSH private key file (ansible-playbook --private-key) [env: ANSIBLE_PRIVATE_KEY_FILE]"
ASK_BECOME_PASS_HELP = ("Ask once for the become (sudo) password; it goes to ansible-playbook's prompt, never to "
                        "a file or a command line [env: ANSIBLE_BECOME_ASK_PASS]")


def check_user(value: str | None) -> str | None:
    """-u: one token, as ssh takes it (no option, no whitespace or control character)."""
    if value is not None and (not value or value.startswith("-") or any(c.isspace() or ord(c) < 32 for c in value)):
        raise DdpfixError(f"-u/--user {json.dumps(value)}: not a user name", ExitCode.INVALID_INPUT)
    return value


def check_private_key(value: str | None) -> str | None:
    """--private-key: an existing file, made absolute (ansible-playbook runs in this directory too)."""
    if value is None:
        return None
    p = Path(value).expanduser()
    if not p.is_file():
        raise DdpfixError(f"--private-key {json.dumps(value)}: no such file", ExitCode.INVALID_INPUT)
    return str(p.resolve())


def ask_become_pass(args: AnsibleArgs) -> None:
    """-K: prompt once (like ansible-playbook, before anything runs), keep the answer in memory."""
    args.ask_become_pass = True
    if args.become_password is None:
        try:
            args.become_password = click.prompt("BECOME password", hide_input=True, default="", show_default=False,
                                                err=True)
        except click.exceptions.Abort:  # end of input (no terminal, nothing piped): nothing has run
            raise DdpfixError("-K/--ask-become-pass: no password given (end of input)",
                              ExitCode.INVALID_INPUT) from None


def _override(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """Callback of a global option repeated after the subcommand: a value given there replaces the group's."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if ctx.get_parameter_source(param.name or "") is ParameterSource.COMMANDLINE:
            setattr(ctx.ensure_object(Application), attr, tuple(value) if isinstance(value, (list, tuple)) else value)

    return callback


def _ansible(ctx: click.Context) -> AnsibleArgs:
    return ctx.ensure_object(Application).ansible


def _given(ctx: click.Context, param: click.Parameter) -> bool:
    return ctx.get_parameter_source(param.name or "") is ParameterSource.COMMANDLINE


def _extra_vars_cb(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> None:
    if _given(ctx, param):  # after those before the subcommand: they add up, later ones win (ansible-playbook's -e)
        args = _ansible(ctx)
        args.extra_vars = merge_extra_vars(value, args.extra_vars)


def _user_cb(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if _given(ctx, param):
        _ansible(ctx).user = check_user(value)


def _private_key_cb(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if _given(ctx, param):
        _ansible(ctx).private_key = check_private_key(value)


def _become_cb(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if _given(ctx, param) and value:
        _ansible(ctx).become = True


def _ask_become_pass_cb(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if _given(ctx, param) and value:
        ask_become_pass(_ansible(ctx))


def ansible_options(f: F) -> F:
    """ansible-playbook's `-e/-u/-b/--private-key/-K` after the subcommand: callbacks updating the group's
    AnsibleArgs (the group's own options build it)."""
    f = click.option("-K", "--ask-become-pass", is_flag=True, expose_value=False, callback=_ask_become_pass_cb,
                     help=ASK_BECOME_PASS_HELP)(f)
    f = click.option("--private-key", "--key-file", "private_key", metavar="FILE", expose_value=False,
                     callback=_private_key_cb, help=PRIVATE_KEY_HELP)(f)
    f = click.option("-b", "--become", is_flag=True, expose_value=False, callback=_become_cb, help=BECOME_HELP)(f)
    f = click.option("-u", "--user", metavar="USER", expose_value=False, callback=_user_cb, help=USER_HELP)(f)
    f = click.option("-e", "--extra-vars", metavar="VARS", multiple=True, expose_value=False,
                     callback=_extra_vars_cb, help=EXTRA_VARS_HELP)(f)
    return f


def global_options(f: F) -> F:
    """`-i/-l/-f/-v` and ansible-playbook's `-e/-u/-b/--private-key/-K` also after the subcommand
    (`ddpfix audit -i INV -l node2`): a value given there replaces the group's (-e adds to them, later wins).

    The environment variables are read once, by the group's options; these only take the command line.
    """
    f = ansible_options(f)
    f = click.option("-v", "--verbose", "verbosity", count=True, expose_value=False, callback=_override("verbosity"),
                     help=VERBOSE_HELP)(f)
    f = click.option("-f", "--forks", type=click.IntRange(1, 500), expose_value=False, callback=_override("forks"),
                     help=f"{FORKS_HELP} [env: DDPFIX_FORKS].")(f)
    f = click.option("-l", "--limit", metavar="PATTERN", expose_value=False, callback=_override("limit"),
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
                          "else by extension (.json .html .xml=junit .prom=prometheus .txt=plain; default JSON); an "
                          "extension naming another format than --format is refused; '-' is stdout.")(f)
    f = click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="text", show_default=True,
                     help="text: grouped by host, root causes first; table: the wide table; json; plain: one line "
                          "per finding; junit; prometheus (node_exporter textfile); html (one self-contained file).")(f)
    return f


def render(doc: Mapping[str, Any], fmt: str, exit_line: str | None = None) -> str:
    if fmt == "json":
        # CLI start: the report module loads only to write a report
        from ddpfix.report import to_json

        return to_json(doc)
    # CLI start: the renderers load in the run's preload thread (OUTPUT_MODULES), while ansible-playbook starts
    from ddpfix.render import RENDERERS, render_text

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
    then, before any node is contacted, for this command until it ends: action ddpfix_cluster)."""
    # CLI start: ansible listing loads only for a command that reads the inventory
    from ddpfix.ansible.listing import check_inventory_paths

    inventories = app.require_inventory()
    check_inventory_paths(inventories)
    _command_owns_the_lock()
    return inventories


def _command_owns_the_lock() -> None:
    """The controller lock the command's first ansible-playbook takes is kept for the command, until it ends."""
    # CLI start: loaded only by a command that runs Ansible
    from ddpfix.lock import command_owner

    close = command_owner()
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(close)


def _hold_controller_lock(addresses: tuple[str, ...]) -> None:
    # CLI start: loaded only by a command that runs Ansible
    from ddpfix.lock import controller_lock

    lock = controller_lock(addresses)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(lock.release)


def output_target(fmt: str, output: str | None) -> tuple[str, str | None]:
    """(format of the -o file, the file; None: no file) for --format and -o, checked before anything runs: `-o -` is
    stdout (the report in --format there, as without -o); a contradiction (`--format plain -o x.prom`, a bare format
    name `-o json`) is invalid input, exit 2."""
    if output is None or output == "-":
        return fmt, None
    try:
        return output_format(fmt, output), output
    except ValueError as exc:
        raise DdpfixError(str(exc), ExitCode.INVALID_INPUT) from exc


def emit(doc: dict[str, Any], fmt: str, output: str | None, exit_line: str | None = None,
         code: int | None = None) -> None:
    """The report on stdout in `fmt`; with -o also into a file (a file format: html, junit and prometheus go only
    to the file when -o is given, and stdout gets the text report). `code` (the exit status) and the run's duration
    (since the CLI started) go into the document first: JUnit's times and Prometheus' success and duration."""
    if code is not None:
        doc["exit_code"] = int(code)
    ctx = click.get_current_context(silent=True)
    app = ctx.find_object(Application) if ctx is not None else None
    if app is not None:
        doc["duration_s"] = round(max(time.monotonic() - app.started, 0.0), 3)
    ffmt, output = output_target(fmt, output)
    if output:
        try:  # a private temporary file, then a rename: never through a planted link (ddpfix.safefile)
            write_atomic(output, render(doc, ffmt))
        except OSError as exc:
            raise DdpfixError(f"cannot write {output}: {exc.strerror}", ExitCode.INVALID_INPUT) from exc
        if fmt in ("html", "junit", "prometheus"):
            fmt = "text"
    if fmt == "table":
        # CLI start: rich and the table renderer load only to print a table
        from rich.console import Console

        # CLI start: the report module loads only to print a table
        from ddpfix.report import render_table

        render_table(doc, Console(soft_wrap=False))
        if exit_line:
            click.echo(exit_line)
    else:
        sys.stdout.write(render(doc, fmt, exit_line))
