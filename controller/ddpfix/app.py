"""The application object every subcommand receives (click `ctx.obj`)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import NoReturn

import click

from ddpfix.ansible.args import AnsibleArgs
from ddpfix.ansible.config import user_inventory
from ddpfix.errors import ExitCode


@dataclass
class Application:
    inventories: tuple[str, ...] = ()
    limit: str | None = None
    forks: int | None = None
    verbosity: int = 0
    slurm: bool = False  # --slurm: the inventory is the current Slurm allocation
    #: the audit: a Slurm node count that disagrees with the node list is a finding, not a refusal
    slurm_count_as_finding: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    ansible: AnsibleArgs = field(default_factory=AnsibleArgs)  # -e/-u/-b/--private-key/-K
    started: float = field(default_factory=time.monotonic)  # the run's duration in reports (JUnit, Prometheus)

    def abort(self, text: str, code: ExitCode = ExitCode.INVALID_INPUT) -> NoReturn:
        click.echo(f"ddpfix: error: {text}", err=True)
        sys.exit(int(code))

    def info(self, text: str) -> None:
        click.echo(text, err=True)

    def require_inventory(self) -> tuple[str, ...]:
        """The inventory paths for Ansible; an ad-hoc host list (`-i host1,host2,`) becomes a YAML file. With no
        -i (nor DDPFIX_INVENTORY, nor --slurm): the inventory the user's Ansible would read (ANSIBLE_INVENTORY, or
        `inventory` in ansible.cfg's [defaults])."""
        if not self.inventories and not self.slurm:
            origin, found = user_inventory()
            if not found:
                self.abort("no inventory given: pass -i/--inventory PATH (or set DDPFIX_INVENTORY or "
                           "ANSIBLE_INVENTORY, or inventory in ansible.cfg's [defaults]), or --slurm")
            self.info(f"ddpfix: inventory {', '.join(found)} (from {origin})")
            self.inventories = found
        # CLI start: the inventory code (and the plan it needs) loads only when a command reads an inventory
        from ddpfix.inventory.sources import resolve_inventories

        paths = resolve_inventories(self.inventories)
        if self.slurm:
            from ddpfix.inventory.slurm import write_allocation_inventory  # CLI start (see above)

            paths = (write_allocation_inventory(as_finding=self.slurm_count_as_finding), *paths)
        return paths

