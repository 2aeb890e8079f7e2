"""`ddpfix inventory`: write an inventory in the contract's format from where jobs are launched (Slurm)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.slurm import inventory_from_allocation, inventory_yaml, parse_het_groups
from ddpfix.safefile import write_atomic


@click.group("inventory")
def command() -> None:
    """Write a ddpfix inventory from a scheduler's allocation."""


@command.command("slurm")
@click.option("--nodelist", help="Slurm hostlist expression (default: $SLURM_JOB_NODELIST).")
@click.option("--vars", "vars_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML mapping of group variables to add (ansible_user, ddp_cluster_cidr, ...).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the inventory here (default: stdout).")
@click.option("--het-group", metavar="N[,M]", envvar="DDPFIX_HET_GROUP",
              help="Heterogeneous job: only these components' nodes, in this order [env: DDPFIX_HET_GROUP].")
def slurm(nodelist: str | None, vars_file: str | None, output: str | None, het_group: str | None) -> None:
    """The allocation's nodes as group ddp_nodes: master = first node, ranks = node order,
    ddp_nproc_per_node from SLURM_GPUS_ON_NODE or SLURM_NTASKS_PER_NODE. A heterogeneous job (SLURM_HET_SIZE)
    needs --het-group; a node count (SLURM_JOB_NUM_NODES, SLURM_NNODES) other than the list's is refused (exit 2)."""


    extra: dict[str, Any] = {}
    if vars_file:
        extra = yaml.safe_load(Path(vars_file).read_text()) or {}
        if not isinstance(extra, dict):
            raise DdpfixError(f"--vars {vars_file}: expected a YAML mapping of variables", ExitCode.INVALID_INPUT)
    data = inventory_from_allocation(os.environ, nodelist, extra, parse_het_groups(het_group) if het_group else ())
    source = f"--nodelist {nodelist}" if nodelist is not None else "SLURM_JOB_NODELIST"
    text = inventory_yaml(data, source)
    if output:
        try:  # a private temporary file, then a rename: never through a planted link (ddpfix.safefile)
            write_atomic(output, text)
        except OSError as exc:
            raise DdpfixError(f"cannot write {output}: {exc.strerror}", ExitCode.INVALID_INPUT) from exc
        click.echo(f"ddpfix: wrote {output} ({len(data['ddp_nodes']['hosts'])} nodes)", err=True)
    else:
        sys.stdout.write(text)
