"""`ddpfix env`."""

from __future__ import annotations

import click

from ddpfix.app import Application, ExitCode


@click.command("env")
@click.pass_obj
def command(app: Application) -> None:
    """(not implemented yet)"""
    app.abort("'env' is not implemented yet", ExitCode.RUN_FAILED)
