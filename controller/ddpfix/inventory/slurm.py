"""Slurm allocations: a ddpfix inventory from SLURM_JOB_NODELIST and friends (the inventory contract's format), and a
job step's per-job launch values (`ddpfix env --slurm --export`), derived at run time with nothing written.

Master = the first node of the allocation, ranks = the allocation's node order (what SLURM_NODEID numbers),
ddp_nproc_per_node from SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE. Hostlist expressions are expanded with
`scontrol show hostnames` where Slurm is installed (it knows the site's syntax) and python-hostlist elsewhere.
A heterogeneous job (SLURM_HET_SIZE) gives ranks only to the components named with --het-group.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Mapping
from typing import Any

import yaml

from ddpfix.ansible.rundirs import new_run_dir
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.contract import GROUP, parse_port_range
from ddpfix.model.net import ip
from ddpfix.plan import node_env

#: A Slurm node name: RFC 1123 labels plus `_` (slurm.conf's NodeName accepts `gpu_01`; names reach the inventory,
#: MASTER_ADDR and shell `export` lines, so nothing else: no whitespace, quote, `$`, `;`, bracket or comma).
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_COUNT = re.compile(r"^\s*(\d+)")
#: The inventory variable the --slurm audit's inventory carries a node-count disagreement in (its one writer).
COUNT_MISMATCH_VAR = "ddp_slurm_count_mismatch"


def _bad(msg: str) -> DdpfixError:
    return DdpfixError(msg, ExitCode.INVALID_INPUT)


def expand_hostlist(expr: str, *, use_scontrol: bool = True, var: str = "SLURM_JOB_NODELIST") -> list[str]:
    """`gpu-[01-04,07],login[1-2]` -> gpu-01 .. gpu-04, gpu-07, login1, login2 (order kept, duplicates dropped)."""
    expr = expr.strip()
    if not expr:
        raise _bad(f"{var} is empty: run inside an allocation (salloc/sbatch) or pass --nodelist")
    names: list[str]
    scontrol = shutil.which("scontrol") if use_scontrol else None
    if scontrol:
        r = subprocess.run([scontrol, "show", "hostnames", expr], capture_output=True, text=True, timeout=30,
                           check=False)
        if r.returncode != 0:
            raise _bad(f"{var} {expr!r} is not a valid hostlist: {' '.join(r.stderr.split())}")
        names = r.stdout.split()
    else:
        import hostlist  # python-hostlist: optional, and only for a hostlist expression

        try:
            names = hostlist.expand_hostlist(expr)
        except hostlist.BadHostlist as exc:
            raise _bad(f"{var} {expr!r} is not a valid hostlist: {exc}") from None
    unique: list[str] = []
    for n in names:
        if not _HOSTNAME.match(n):
            raise _bad(f"{var} {expr!r} expands to an invalid host name {n!r}")
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


def het_size(env: Mapping[str, str]) -> int:
    """SLURM_HET_SIZE: the number of components of a heterogeneous job (0: not a heterogeneous job)."""
    value = str(env.get("SLURM_HET_SIZE") or "").strip()
    if not value:
        return 0
    if not value.isdigit() or int(value) < 1:
        raise _bad(f"SLURM_HET_SIZE must be a positive integer, got {value!r}")
    return int(value)


def parse_het_groups(text: str) -> tuple[int, ...]:
    """`--het-group 0,2` (srun's own syntax: indexes, ranges `0-1`, comma separated) -> (0, 2), in the order given."""
    groups: list[int] = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(\d{1,4})(?:-(\d{1,4}))?\s*", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise _bad(f"--het-group {text!r} is not a list of component indexes (N, N-M, comma separated)")
        for g in range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1):
            if g in groups:
                raise _bad(f"--het-group {text!r} names component {g} twice")
            groups.append(g)
    return tuple(groups)


def _check_count(env: Mapping[str, str], keys: tuple[str, ...], expr: str, var: str, n: int,
                 found: list[str] | None = None) -> None:
    """The allocation's own node count (the first of `keys` that is set) must be the expanded list's length: a
    disagreement means variables from another job, step or component, and a wrong world size. Refused (exit 2),
    or, with `found` (the audit: a check the user asked for), appended to it."""
    key = next((k for k in keys if str(env.get(k) or "").strip()), None)
    if key is not None and str(env[key]).strip() != str(n):
        why = (f"{key}={env[key]!r} but {var} {expr!r} expands to {n} nodes: the allocation's variables disagree (a "
               "heterogeneous job, or variables from another job step)")
        if found is None:
            raise _bad(why)
        found.append(why)


def allocation_nodes(env: Mapping[str, str], nodelist: str | None = None, het_groups: tuple[int, ...] = (),
                     *, step: bool = False, mismatches: list[str] | None = None) -> list[str]:
    """The nodes that become ranks, in rank order. `nodelist`: the user's explicit list (no count is compared).
    A heterogeneous job needs `het_groups` (its SLURM_JOB_NODELIST is the first component's alone): the named
    components' SLURM_JOB_NODELIST_HET_GROUP_<N>, concatenated in the order given. `step`: inside a job step, the
    step's nodes (SLURM_STEP_NODELIST, which SLURM_NODEID numbers) where Slurm sets them. `mismatches`: a node
    count that disagrees with a list is appended there instead of refused."""
    if nodelist is not None:
        if het_groups:
            raise _bad("--het-group selects components of the allocation: drop --nodelist")
        return expand_hostlist(nodelist)
    size = het_size(env)
    if het_groups and not size:
        raise _bad(f"--het-group {','.join(map(str, het_groups))}: this is not a heterogeneous job (SLURM_HET_SIZE is "
                   "not set); drop --het-group")
    if size and not het_groups:
        raise _bad(f"this is a heterogeneous job (SLURM_HET_SIZE={size}): name the components that train with "
                   f"--het-group N[,M] (0..{size - 1}); only their nodes become ranks")
    if het_groups:
        hosts: list[str] = []
        for g in het_groups:
            var = f"SLURM_JOB_NODELIST_HET_GROUP_{g}"
            if g >= size or not str(env.get(var) or "").strip():
                raise _bad(f"--het-group {g}: no component {g} in this job ({var} is not set; SLURM_HET_SIZE={size})")
            part = expand_hostlist(str(env[var]), var=var)
            _check_count(env, (f"SLURM_JOB_NUM_NODES_HET_GROUP_{g}", f"SLURM_NNODES_HET_GROUP_{g}"), str(env[var]),
                         var, len(part), mismatches)
            twice = sorted(set(part) & set(hosts))
            if twice:
                raise _bad(f"--het-group {','.join(map(str, het_groups))}: node {twice[0]} is in two of the components "
                           "named (one rank per node)")
            hosts += part
        return hosts
    step_list = str(env.get("SLURM_STEP_NODELIST") or "").strip() if step else ""
    if step_list:
        hosts = expand_hostlist(step_list, var="SLURM_STEP_NODELIST")
        _check_count(env, ("SLURM_STEP_NUM_NODES",), step_list, "SLURM_STEP_NODELIST", len(hosts), mismatches)
        return hosts
    var = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    expr = str(env.get(var) or "")
    hosts = expand_hostlist(expr, var=var)
    _check_count(env, ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"), expr, var, len(hosts), mismatches)
    return hosts


def inventory_from_allocation(env: Mapping[str, str], nodelist: str | None = None,
                              group_vars: Mapping[str, Any] | None = None,
                              het_groups: tuple[int, ...] = (), *, as_finding: bool = False) -> dict[str, Any]:
    """The inventory (as YAML-ready data) for the allocation: group `ddp_nodes`, hosts in node-id order.
    `as_finding` (the audit): a node count that disagrees with the list is not refused but kept in
    `ddp_slurm_count_mismatch`, which the audit reports as a finding (``rules.env``)."""
    mismatches: list[str] | None = [] if as_finding else None
    hosts = allocation_nodes(env, nodelist, het_groups, mismatches=mismatches)
    gvars: dict[str, Any] = {"ddp_master": hosts[0]}
    if mismatches:
        gvars[COUNT_MISMATCH_VAR] = "; ".join(mismatches)
    nproc = nproc_per_node(env)
    if nproc:
        gvars["ddp_nproc_per_node"] = nproc
    gvars.update(dict(group_vars or {}))
    return {GROUP: {"vars": gvars, "hosts": {h: {"ddp_node_rank": rank} for rank, h in enumerate(hosts)}}}


#: The port range MASTER_PORT is taken from when the site sets none (ddp_job_port_range in the cluster file, or
#: --port-range): torch's default port and the 499 above it, below Linux's default ephemeral range (32768-60999).
DEFAULT_PORT_RANGE = (29500, 29999)
EPHEMERAL_SYSCTL = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range(path: str = EPHEMERAL_SYSCTL) -> tuple[int, int]:
    """This node's ephemeral port range (net.ipv4.ip_local_port_range); unreadable: exit 3 (not checked, not a pass)."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError) as exc:
        raise DdpfixError(f"cannot read this node's ephemeral port range {path}: {exc}; MASTER_PORT not chosen",
                          ExitCode.RUN_FAILED) from None
    return lo, hi


def job_port(job_id: str, port_range: tuple[int, int], ephemeral: tuple[int, int], source: str) -> int:
    """MASTER_PORT for a job: LO + SLURM_JOB_ID mod the range's size, so two jobs whose masters share a node get
    different ports unless their ids are a multiple of the range's size apart. The whole range must lie outside the
    ephemeral range (an outgoing connection's source port could hold the master's port: EADDRINUSE at random)."""
    jid = str(job_id or "").strip()
    if not jid.isdigit():
        raise _bad(f"SLURM_JOB_ID must be a job id (digits), got {job_id!r}: run inside a job (srun, sbatch)")
    lo, hi = port_range
    if lo <= ephemeral[1] and ephemeral[0] <= hi:
        raise _bad(f"port range {lo}-{hi} ({source}) overlaps this node's ephemeral range "
                   f"{ephemeral[0]}-{ephemeral[1]} (net.ipv4.ip_local_port_range): choose a range outside it")
    return lo + int(jid) % (hi - lo + 1)


def this_node(env: Mapping[str, str]) -> str:
    """This node's Slurm name: SLURMD_NODENAME (slurmd sets it in every task), else the short host name."""
    return str(env.get("SLURMD_NODENAME") or "").strip() or socket.gethostname().split(".")[0]


def node_rank(env: Mapping[str, str], hosts: list[str], het: bool) -> int:
    """NODE_RANK: SLURM_NODEID (the node's index in the step), checked against this node's place in `hosts`; in a
    heterogeneous job (SLURM_NODEID counts within a component) the node's place in the selected components."""
    me = this_node(env)
    where = "the components --het-group names" if het else "the allocation's node list"
    if het:
        if me not in hosts:
            raise _bad(f"this node ({me}, SLURMD_NODENAME) is not in {where} ({','.join(hosts[:8])}...): run the "
                       "step on the selected components (srun --het-group)")
        return hosts.index(me)
    raw = str(env.get("SLURM_NODEID") or "").strip()
    if not raw.isdigit() or int(raw) >= len(hosts):
        raise _bad(f"SLURM_NODEID must be this node's index in {where} (0..{len(hosts) - 1}), got "
                   f"{env.get('SLURM_NODEID')!r}: run `ddpfix env --slurm --export` inside the step (srun), on each "
                   "node")
    rank = int(raw)
    if env.get("SLURMD_NODENAME") and me in hosts and hosts.index(me) != rank:
        raise _bad(f"SLURM_NODEID={raw!r} but this node ({me}) is node {hosts.index(me)} of {where}: the variables "
                   "come from another step")
    if env.get("SLURMD_NODENAME") and me not in hosts:
        raise _bad(f"this node ({me}, SLURMD_NODENAME) is not in {where}: the variables come from another job")
    return rank


def master_address(master: str, doc: Mapping[str, Any] | None) -> tuple[str, str]:
    """(MASTER_ADDR, where it came from): the master's cluster address as the cluster file lists it (matched by
    inventory name or host name, each also without its domain), else the Slurm node name itself."""
    for n in (doc or {}).get("nodes") or []:
        full = (str(n.get("name") or ""), str(n.get("hostname") or ""))
        names = {*full, *(x.split(".")[0] for x in full)}
        if master in names and n.get("address"):
            if (addr := ip(str(n["address"]), scoped=False)) is None:
                raise _bad(f"cluster file: the address of {master} is not an IP address: {n['address']!r}")
            return str(addr), "cluster file"
    return master, "node name"


def job_env(env: Mapping[str, str], *, het_groups: tuple[int, ...] = (), port_range: tuple[int, int] | None = None,
            port_source: str = "", nproc: int | None = None, doc: Mapping[str, Any] | None = None,
            ephemeral: tuple[int, int] | None = None) -> tuple[dict[str, str], list[str]]:
    """(the per-job launch values of this node in this job step, notes for stderr), from the SLURM_* variables of
    the step, this node's cluster file `doc` (its port range, the master's cluster address) and its ephemeral range.
    The keys are the env file's launch keys (plan.node_env): MASTER_ADDR/PORT, NNODES, NODE_RANK, NPROC_PER_NODE and
    torchrun's PET_* names; nothing per node (interfaces, fabric) and nothing written."""
    hosts = allocation_nodes(env, None, het_groups, step=True)
    rank = node_rank(env, hosts, bool(het_groups))
    notes: list[str] = []
    resv = str(env.get("SLURM_STEP_RESV_PORTS") or "").strip()
    if port_range is None and resv and not het_groups:
        # ports Slurm reserved for this step (srun --resv-ports, MpiParams=ports=...): the same on every node of
        # the step and no other step's; a heterogeneous job's components are steps of their own, so not there
        m = re.match(r"(\d{1,5})(?:[-,]|$)", resv)
        if not m or not 1024 <= int(m.group(1)) <= 65535:
            raise _bad(f"SLURM_STEP_RESV_PORTS must start with a port (1024..65535), got {resv!r}")
        port_range, port_source = (int(m.group(1)), int(m.group(1))), "SLURM_STEP_RESV_PORTS"
    if port_range is None:
        site = (doc or {}).get("job_port_range")
        port_range, port_source = ((parse_port_range(site, "job_port_range of the cluster file"), "cluster file")
                                   if site else (DEFAULT_PORT_RANGE, "the default"))
    # a heterogeneous job's components have job ids of their own (SLURM_JOB_ID differs between them): every node
    # derives the port from the job's id, the first component's (SLURM_JOB_ID_HET_GROUP_0)
    job_id = env.get("SLURM_JOB_ID_HET_GROUP_0") if het_groups else None
    port = job_port(str(job_id or env.get("SLURM_JOB_ID") or ""), port_range,
                    ephemeral if ephemeral is not None else ephemeral_range(), port_source)
    addr, source = master_address(hosts[0], doc)
    if source != "cluster file":
        notes.append(f"NOTE: ddpfix: MASTER_ADDR={addr} is the Slurm node name ({hosts[0]} is not in the cluster "
                     "file): it must resolve to its cluster address on every node")
    nproc = nproc or nproc_per_node(env) or 1
    return node_env(addr, port, len(hosts), rank, nproc, None), notes


def export_lines(values: Mapping[str, str]) -> str:
    """`export KEY=VALUE` lines for `eval` or `source` (values quoted for the shell)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


def inventory_yaml(data: Mapping[str, Any], source: str) -> str:

    header = (f"# Written by `ddpfix inventory slurm` from {source}.\n"
              "# Master = the first node of the allocation; ranks = the allocation's node order.\n")
    return header + yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


def write_allocation_inventory(env: Mapping[str, str] | None = None, *, as_finding: bool = False) -> str:
    """`--slurm`: the allocation's inventory as a file in a run directory of its own (read like any -i file).
    `as_finding`: see inventory_from_allocation (the audit's; every other command refuses the disagreement)."""
    env = os.environ if env is None else env
    groups = str(env.get("DDPFIX_HET_GROUP") or "").strip()
    data = inventory_from_allocation(env, het_groups=parse_het_groups(groups) if groups else (), as_finding=as_finding)
    path = new_run_dir("slurm-inventory") / "hosts.yml"
    path.write_text(inventory_yaml(data, "SLURM_JOB_NODELIST (--slurm)"))
    return str(path)
