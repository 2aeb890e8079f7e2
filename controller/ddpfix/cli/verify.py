"""`ddpfix verify`."""

from __future__ import annotations

import click

from ddpfix.app import Application, ExitCode


@click.command("verify")
@click.pass_obj
def command(app: Application) -> None:
    """(not implemented yet)"""
    app.abort("'verify' is not implemented yet", ExitCode.RUN_FAILED)
