"""The `ddpfix` command line."""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from ddpfix.ansible import args as ansibleargs
from ddpfix.app import Application
from ddpfix.cli.common import (
    ASK_BECOME_PASS_HELP,
    BECOME_HELP,
    EXTRA_VARS_HELP,
    FORKS_HELP,
    INVENTORY_HELP,
    LIMIT_HELP,
    PRIVATE_KEY_HELP,
    SLURM_HELP,
    USER_HELP,
    VERBOSE_HELP,
    check_private_key,
    check_user,
)
from ddpfix.cli.common import ask_become_pass as ask
from ddpfix.errors import EXIT_CODE_MEANING, DdpfixError, ExitCode

_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _usage_error(exc: click.UsageError) -> NoReturn:
    """Bad options (exit 2) as one line, like every other invalid input, instead of click's usage block."""
    if isinstance(exc, _NO_ARGS_IS_HELP):  # `ddpfix` / `ddpfix lab` alone: show the help as usual
        raise exc
    cmd = exc.ctx.command_path if exc.ctx else "ddpfix"
    click.echo(f"ddpfix: error: {' '.join(exc.format_message().split())} (see '{cmd} --help')", err=True)
    sys.exit(exc.exit_code)


def _one_line(text: object, limit: int = 400) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _where(exc: BaseException) -> str:
    """The innermost ddpfix function the exception passed through (`runner.run_playbook`), or ''."""
    pkg = Path(__file__).resolve().parents[1]
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            rel = Path(frame.filename).resolve().relative_to(pkg)
        except ValueError:
            continue
        where = f"{'.'.join(rel.with_suffix('').parts)}.{frame.name}"
    return where


def _run_failed(ctx: click.Context, exc: BaseException) -> NoReturn:
    """An internal error of ddpfix or of the run: exit 3 with one line; the traceback only with -v."""
    # CLI start: loaded only when a command fails
    from ddpfix.ansible.rundirs import last_run_dir

    app = ctx.find_object(Application)
    if app is not None and app.verbosity > 0:
        traceback.print_exception(exc, file=sys.stderr)
    sub = ctx.invoked_subcommand
    what = f"ddpfix {sub} failed" if sub else "ddpfix failed"
    where = _where(exc)
    if where:
        what += f" in {where}"
    run_dir = last_run_dir()
    line = f"ddpfix: error: {what} ({type(exc).__name__}: {_one_line(exc) or 'no message'})"
    if run_dir is not None:
        line += f"; run log: {run_dir}"
    if app is None or app.verbosity == 0:
        line += " (-v shows the traceback)"
    click.echo(line, err=True)
    sys.exit(int(ExitCode.RUN_FAILED))


#: The subcommands, each in its module ddpfix.cli.<name>, imported when it runs or help lists it: a command pays for its
#: own imports only (importing them all took 0.17 s of every run).
SUBCOMMANDS = ("audit", "check", "env", "explain", "inventory", "lab", "remediate", "verify")


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(SUBCOMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            self.add_command(importlib.import_module(f"ddpfix.cli.{cmd_name}").command)
        return self.commands.get(cmd_name)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            _usage_error(exc)
        except DdpfixError as exc:
            click.echo(f"ddpfix: error: {exc}", err=True)
            ctx.exit(int(exc.code))
        except KeyboardInterrupt:
            click.echo("ddpfix: error: interrupted", err=True)
            ctx.exit(int(ExitCode.INTERRUPTED))
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as exc:  # noqa: BLE001 - a failure of ddpfix is never a finding (exit 3, one line)
            _run_failed(ctx, exc)


def _exit_codes_epilog() -> str:
    lines = [f"  {int(code)}  {meaning}" for code, meaning in sorted(EXIT_CODE_MEANING.items())]
    return "\b\nExit codes (every subcommand):\n" + "\n".join(lines)


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """`ddpfix --version`: as `ansible --version`, the versions and the places in use."""
    if not value or ctx.resilient_parsing:
        return
    # CLI start: --version only
    from ddpfix.ansible.version import version_lines

    click.echo("\n".join(version_lines()))
    ctx.exit(0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_exit_codes_epilog())
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show ddpfix's, ansible-core's and Python's versions, the config file and the collections in use.")
@click.option("-i", "--inventory", "inventories", metavar="INV", multiple=True, envvar="DDPFIX_INVENTORY",
              help=f"{INVENTORY_HELP} [env: DDPFIX_INVENTORY, comma-separated].")
@click.option("-l", "--limit", metavar="PATTERN", envvar="DDPFIX_LIMIT", help=f"{LIMIT_HELP} [env: DDPFIX_LIMIT].")
@click.option("-f", "--forks", type=click.IntRange(1, 500), envvar="DDPFIX_FORKS",
              help=f"{FORKS_HELP} [env: DDPFIX_FORKS].")
@click.option("-e", "--extra-vars", "extra_vars", metavar="VARS", multiple=True, help=EXTRA_VARS_HELP)
@click.option("-u", "--user", metavar="USER", help=USER_HELP)
@click.option("-b", "--become", is_flag=True, help=BECOME_HELP)
@click.option("--private-key", "--key-file", "private_key", metavar="FILE", help=PRIVATE_KEY_HELP)
@click.option("-K", "--ask-become-pass", is_flag=True, envvar="ANSIBLE_BECOME_ASK_PASS", help=ASK_BECOME_PASS_HELP)
@click.option("--slurm", is_flag=True, help=SLURM_HELP)
@click.option("-v", "--verbose", "verbosity", count=True, help=VERBOSE_HELP)
@click.pass_context
def cli(ctx: click.Context, inventories: tuple[str, ...], limit: str | None, forks: int | None,
        extra_vars: tuple[str, ...], user: str | None, become: bool, private_key: str | None, ask_become_pass: bool,
        slurm: bool, verbosity: int) -> None:
    """Find and fix the host and network causes of multi-node PyTorch (DDP) failures.

    \b
    Typical flow:
      ddpfix audit -i inventories/prod            # report, change nothing
      ddpfix remediate -i inventories/prod        # dry run: show the diff
      ddpfix remediate -i inventories/prod --apply
      ddpfix verify -i inventories/prod --torch   # real torch.distributed all-reduce

    -i, -l/--limit, -f/--forks, -v and ansible-playbook's -e, -u, -b, --private-key, -K go before or after the
    subcommand; after it, they override (-e adds, later wins).
    """
    # CLI start: --help and completion never load the run-dir code
    from ddpfix.ansible.rundirs import forget_run_dirs

    forget_run_dirs()
    if ctx.get_parameter_source("inventories") is ParameterSource.ENVIRONMENT:
        # CLI start: loads yaml
        from ddpfix.inventory.sources import split_inventory_env

        inventories = split_inventory_env(os.environ.get("DDPFIX_INVENTORY", ""))  # click splits on whitespace

    args = ansibleargs.AnsibleArgs(user=check_user(user), become=become, private_key=check_private_key(private_key),
                                   extra_vars=ansibleargs.merge_extra_vars(extra_vars) if extra_vars else {})
    ansibleargs.use(args)  # the runs read it when they start: options after the subcommand update this object
    if ask_become_pass:
        ask(args)
    ctx.obj = Application(inventories=tuple(inventories), limit=limit, forks=forks, verbosity=verbosity, slurm=slurm,
                          ansible=args)


def load_commands() -> dict[str, click.Command]:
    """Every subcommand, imported (for documentation and tests; a run imports only its own)."""
    ctx = click.Context(cli)
    return {name: cmd for name in cli.list_commands(ctx) if (cmd := cli.get_command(ctx, name)) is not None}


def main() -> None:
    """The `ddpfix` process: the command, then an exit without Python's final garbage collections over everything it
    loaded (click, ansible-runner, the rules): registered first, `gc.freeze` runs after every other exit handler, and
    the collections it skips would only delay the exit the user waits for (about 0.05 s)."""
    atexit.register(gc.freeze)
    cli(prog_name="ddpfix")
