"""The `ddpfix` command line."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from ddpfix import __version__
from ddpfix.app import Application, DdpfixError, ExitCode


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _usage_error(exc: click.UsageError) -> NoReturn:
    """Bad options (exit 2) as one line, like every other invalid input, instead of click's usage block."""
    if isinstance(exc, _NO_ARGS_IS_HELP):  # `ddpfix` / `ddpfix lab` alone: show the help as usual
        raise exc
    cmd = exc.ctx.command_path if exc.ctx else "ddpfix"
    click.echo(f"ddpfix: error: {' '.join(exc.format_message().split())} (see '{cmd} --help')", err=True)
    sys.exit(exc.exit_code)


class _Group(click.Group):
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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddpfix")
@click.option(
    "-i",
    "--inventory",
    "inventories",
    multiple=True,
    envvar="DDPFIX_INVENTORY",
    help="Ansible inventory file or directory; repeatable [env: DDPFIX_INVENTORY].",
)
@click.option("--limit", envvar="DDPFIX_LIMIT", help="Ansible host pattern to restrict the run [env: DDPFIX_LIMIT].")
@click.option(
    "--forks",
    type=click.IntRange(1, 500),
    envvar="DDPFIX_FORKS",
    help="Parallel SSH connections; default: one per host up to 50 [env: DDPFIX_FORKS].",
)
@click.option("-v", "--verbose", "verbosity", count=True, help="More output; -vvv passes -vvv to Ansible.")
@click.pass_context
def cli(ctx: click.Context, inventories: tuple[str, ...], limit: str | None, forks: int | None, verbosity: int) -> None:
    """Find and fix the host and network causes of multi-node PyTorch (DDP) failures.

    \b
    Typical flow:
      ddpfix audit -i inventories/prod            # report, change nothing
      ddpfix remediate -i inventories/prod        # dry run: show the diff
      ddpfix remediate -i inventories/prod --apply
      ddpfix verify -i inventories/prod --torch   # real torch.distributed all-reduce
    """
    if isinstance(inventories, str):  # envvar gives a single string
        inventories = tuple(inventories.split(","))
    ctx.obj = Application(inventories=tuple(inventories), limit=limit, forks=forks, verbosity=verbosity)


def _register() -> None:
    from ddpfix.cli import audit, env, lab, remediate, verify

    for mod in (audit, remediate, env, verify, lab):
        cli.add_command(mod.command)


_register()


def main() -> None:
    cli(prog_name="ddpfix")
