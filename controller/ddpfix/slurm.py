"""A ddpfix inventory from a Slurm allocation (SLURM_JOB_NODELIST and friends), in the inventory contract's format.

Master = the first node of the allocation, ranks = the allocation's node order (what SLURM_NODEID numbers),
ddp_nproc_per_node from SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE. Hostlist expressions are expanded with
`scontrol show hostnames` where Slurm is installed (it knows the site's syntax) and python-hostlist elsewhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from ddpfix.app import DdpfixError, ExitCode
from ddpfix.inventory import GROUP

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_COUNT = re.compile(r"^\s*(\d+)")


def _bad(msg: str) -> DdpfixError:
    return DdpfixError(msg, ExitCode.INVALID_INPUT)


def expand_hostlist(expr: str, *, use_scontrol: bool = True) -> list[str]:
    """`gpu-[01-04,07],login[1-2]` -> gpu-01 .. gpu-04, gpu-07, login1, login2 (order kept, duplicates dropped)."""
    expr = expr.strip()
    if not expr:
        raise _bad("SLURM_JOB_NODELIST is empty: run inside an allocation (salloc/sbatch) or pass --nodelist")
    names: list[str]
    scontrol = shutil.which("scontrol") if use_scontrol else None
    if scontrol:
        r = subprocess.run([scontrol, "show", "hostnames", expr], capture_output=True, text=True, timeout=30,
                           check=False)
        if r.returncode != 0:
            raise _bad(f"SLURM_JOB_NODELIST {expr!r} is not a valid hostlist: {' '.join(r.stderr.split())}")
        names = r.stdout.split()
    else:
        import hostlist  # python-hostlist

        try:
            names = hostlist.expand_hostlist(expr)
        except hostlist.BadHostlist as exc:
            raise _bad(f"SLURM_JOB_NODELIST {expr!r} is not a valid hostlist: {exc}") from None
    unique: list[str] = []
    for n in names:
        if not _HOSTNAME.match(n):
            raise _bad(f"SLURM_JOB_NODELIST {expr!r} expands to an invalid host name {n!r}")
        if n not in unique:
            unique.append(n)
    return unique


def _count(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value in (None, ""):
        return None
    m = _COUNT.match(str(value))  # SLURM_NTASKS_PER_NODE may read "8(x2)" in some versions
    if not m or int(m.group(1)) < 1:
        raise _bad(f"{key} must be a positive integer, got {value!r}")
    return int(m.group(1))


def nproc_per_node(env: Mapping[str, str]) -> int | None:
    """GPUs on the node, else tasks per node: a task-based allocation without GPUs (SLURM_GPUS_ON_NODE unset, or 0
    as some sites export it) runs one process per task."""
    if str(env.get("SLURM_GPUS_ON_NODE", "")).strip() == "0":
        return _count(env, "SLURM_NTASKS_PER_NODE")
    return _count(env, "SLURM_GPUS_ON_NODE") or _count(env, "SLURM_NTASKS_PER_NODE")


def inventory_from_allocation(env: Mapping[str, str], nodelist: str | None = None,
                              group_vars: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The inventory (as YAML-ready data) for the allocation: group `ddp_nodes`, hosts in node-id order."""
    expr = nodelist if nodelist is not None else env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = expand_hostlist(expr)
    nnodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if nodelist is None and nnodes not in (None, "") and str(nnodes).strip() != str(len(hosts)):
        key = "SLURM_JOB_NUM_NODES" if env.get("SLURM_JOB_NUM_NODES") else "SLURM_NNODES"
        raise _bad(f"{key}={nnodes!r} but SLURM_JOB_NODELIST {expr!r} expands to {len(hosts)} nodes: the allocation's "
                   "variables disagree (a heterogeneous job, or variables from another job step)")
    gvars: dict[str, Any] = {"ddp_master": hosts[0]}
    nproc = nproc_per_node(env)
    if nproc:
        gvars["ddp_nproc_per_node"] = nproc
    gvars.update(dict(group_vars or {}))
    return {GROUP: {"vars": gvars, "hosts": {h: {"ddp_node_rank": rank} for rank, h in enumerate(hosts)}}}


def inventory_yaml(data: Mapping[str, Any], source: str) -> str:
    import yaml

    header = (f"# Written by `ddpfix inventory slurm` from {source}.\n"
              "# Master = the first node of the allocation; ranks = the allocation's node order.\n")
    return header + yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


def write_allocation_inventory(env: Mapping[str, str] | None = None) -> str:
    """`--slurm`: the allocation's inventory as a file in a run directory of its own (read like any -i file)."""
    import os

    from ddpfix.runner import new_run_dir

    data = inventory_from_allocation(os.environ if env is None else env)
    path = new_run_dir("slurm-inventory") / "hosts.yml"
    path.write_text(inventory_yaml(data, "SLURM_JOB_NODELIST (--slurm)"))
    return str(path)
