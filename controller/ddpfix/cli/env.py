"""`ddpfix env`: the per-node env file (MASTER_ADDR, ranks, socket interface) for launch scripts and torchrun, and
`--slurm --export`: a Slurm job step's per-job values, derived on the node at run time (no SSH, no root, nothing
written)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from ddpfix import clusterfile, pipeline
from ddpfix.app import Application
from ddpfix.cli.check import DEFAULT_CLUSTER_FILE
from ddpfix.cli.common import cluster_of, global_options
from ddpfix.envtemplate import render_file
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.contract import parse_port_range
from ddpfix.inventory.slurm import export_lines, job_env, parse_het_groups
from ddpfix.model.cluster import Cluster
from ddpfix.plan import env_comment, env_not_ours, env_refusal, redact_env
from ddpfix.progress import Progress
from ddpfix.remediate import HostPlan, master_unknown, run_remediation
from ddpfix.rules.context import not_read
from ddpfix.rules.reachability import INVALID
from ddpfix.safefile import write_atomic


@click.command("env")
@global_options
@click.option("--apply", "apply", is_flag=True, help="Write the env file on every node (default: print them).")
@click.option("--local-dir", type=click.Path(file_okay=False),
              help="Also write <host>.env files here, on this machine.")
@click.option("--allow-partial", is_flag=True,
              help="Proceed when some nodes are unreachable (their ranks stay reserved).")
@click.option("--node", "node", metavar="NAME", help="Only this node's file (an inventory name).")
@click.option("--stdout", "to_stdout", is_flag=True,
              help="Print only the file of --node, as the block would be written, for a launch script "
                   "(nothing is written); secret-looking values as *** unless --show-secrets.")
@click.option("--show-secrets", is_flag=True,
              help="With --stdout: print secret-looking values as they are (for a file a launch script sources).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "sbatch"]), default="text", show_default=True,
              help="sbatch: print a batch script for these nodes (#SBATCH directives, then a step that evaluates "
                   "`ddpfix env --slurm --export` and starts torchrun on each node); reads no node.")
@click.option("--export", "export", is_flag=True,
              help="With --slurm, inside a job step on each node: print this node's per-job values as `export` "
                   "lines for eval (no SSH, no root, nothing written).")
@click.option("--het-group", metavar="N[,M]", envvar="DDPFIX_HET_GROUP",
              help="Heterogeneous job: the components whose nodes become ranks, in this order [env: DDPFIX_HET_GROUP].")
@click.option("--port-range", metavar="LO-HI", envvar="DDPFIX_PORT_RANGE",
              help="--export: MASTER_PORT = LO + SLURM_JOB_ID mod the range's size; must lie outside the node's "
                   "ephemeral range (default: the step's SLURM_STEP_RESV_PORTS, else the cluster file's "
                   "job_port_range, else 29500-29999) "
                   "[env: DDPFIX_PORT_RANGE].")
@click.option("--nproc-per-node", type=click.IntRange(1, 1024), envvar="DDPFIX_NPROC_PER_NODE",
              help="--export: processes per node (default: SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE, else 1) "
                   "[env: DDPFIX_NPROC_PER_NODE].")
@click.option("--cluster-file", type=click.Path(dir_okay=False), envvar="DDPFIX_CLUSTER_FILE",
              default=DEFAULT_CLUSTER_FILE, show_default=True,
              help="--export: the node's cluster file (the master's cluster address, the site's port range) "
                   "[env: DDPFIX_CLUSTER_FILE].")
@click.argument("script", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def command(app: Application, apply: bool, local_dir: str | None, allow_partial: bool, node: str | None,
            to_stdout: bool, show_secrets: bool, fmt: str, export: bool, het_group: str | None,
            port_range: str | None, nproc_per_node: int | None, cluster_file: str, script: tuple[str, ...]) -> None:
    """Render each node's env file from the inventory and the nodes' facts; --apply writes it on the nodes.

    ddpfix's keys live in a managed block; the file's other lines are kept. An existing file ddpfix did not
    write is refused (exit 2) unless ddp_env_adopt is true.

    Ranks: explicit ddp_node_rank, else inventory order with the master first. An unreachable node never
    makes the others renumber: with one missing, nothing is written (exit 1) unless --allow-partial.

    --apply also writes cluster.json next to the env file, the cluster view of `ddpfix check --local`.
    --format sbatch [SCRIPT ARGS...] prints a batch script for these nodes: #SBATCH directives, then one srun task
    per node that sources the node's env file, evaluates `ddpfix env --slurm --export` and starts torchrun.

    Slurm (`--slurm --export`, in a job step on each node, as the job's user): MASTER_ADDR (the first node of the
    step's node list, at its cluster address from the cluster file, else its Slurm name), MASTER_PORT (from
    SLURM_JOB_ID inside --port-range, outside the ephemeral range), NNODES, NODE_RANK (SLURM_NODEID), NPROC_PER_NODE
    and torchrun's PET_* names, as `export` lines: `v=$(ddpfix env --slurm --export) && eval "$v"`. A
    heterogeneous job needs --het-group. Exit 2 on a bad or inconsistent SLURM_* variable, naming it. With
    ddp_env_scope: node, --apply (the operator's, once) writes only per-node keys (interfaces, fabric) and the
    cluster file.

    Secret-looking values (keys naming KEY, TOKEN, SECRET, PASS, PWD, AUTH, CREDENTIAL, DSN, COOKIE, SESSION, PAT,
    WEBHOOK; URL userinfo, webhook URLs, provider token formats) are printed as ***; --local-dir files hold them
    (mode 0600), --stdout --show-secrets prints them.
    """
    if show_secrets and not to_stdout:
        raise DdpfixError("--show-secrets goes with --stdout --node NAME only (the other outputs never show secrets)",
                          ExitCode.INVALID_INPUT)
    if export:
        if not app.slurm or apply or to_stdout or local_dir or node or fmt != "text" or script:
            raise DdpfixError("--export prints this job step's values: it goes with --slurm alone (no --apply, "
                              "--stdout, --local-dir, --node, --format or script)", ExitCode.INVALID_INPUT)
        _export(het_group, port_range, nproc_per_node, cluster_file)
        return
    if het_group is not None and not app.slurm and \
            click.get_current_context().get_parameter_source("het_group") == ParameterSource.COMMANDLINE:
        raise DdpfixError("--het-group selects components of a Slurm allocation: add --slurm", ExitCode.INVALID_INPUT)
    if het_group:
        os.environ["DDPFIX_HET_GROUP"] = het_group  # the --slurm inventory reads it
    cluster = cluster_of(app)
    if fmt == "sbatch":
        if apply or to_stdout or local_dir or node:
            raise DdpfixError("--format sbatch prints a batch script only: drop --apply/--stdout/--local-dir/--node",
                              ExitCode.INVALID_INPUT)
        click.echo(sbatch_script(cluster, script), nl=False)
        return
    if script:
        raise DdpfixError(f"unexpected argument {script[0]!r} (a training script goes with --format sbatch)",
                          ExitCode.INVALID_INPUT)
    if node is not None and node not in cluster.names:
        raise DdpfixError(f"--node {node!r} is not a host of the inventory ({', '.join(cluster.names)})",
                          ExitCode.INVALID_INPUT)
    if to_stdout and (not node or apply or fmt != "text"):
        raise DdpfixError("--stdout prints one node's file: give --node NAME (and no --apply/--format)",
                          ExitCode.INVALID_INPUT)
    if node and apply:
        raise DdpfixError("--node chooses the file printed; to write on some nodes use --limit", ExitCode.INVALID_INPUT)
    with Progress(cluster.names, "ddpfix env: facts",
                  enabled=None if fmt == "text" and not to_stdout else False) as progress:
        ctx = pipeline.facts(cluster, limit=app.limit, forks=app.forks, verbosity=app.verbosity, progress=progress)
    # written: the nodes read (--limit chooses them); the plan itself is the whole inventory's
    missing = [n.name for n in ctx.cluster.nodes if n.name in ctx.hosts and not ctx.facts.get(n.name)]
    for host, problems in ctx.invalid.items():
        fact, value, why = problems[0]
        raise DdpfixError(f"{host} returned {fact} {value!r}: {why} ({INVALID.id}); no env file written",
                          ExitCode.INVALID_INPUT)
    if not ctx.cidr:
        why = f": the master {cluster.master} was not read" if not ctx.facts.get(cluster.master) else ""
        raise DdpfixError(f"the cluster network is unknown{why} (set ddp_cluster_cidr)", ExitCode.INVALID_INPUT)
    if not ctx.plan[cluster.master].address:
        click.echo(f"ddpfix: refused: {master_unknown(ctx)}", err=True)
        raise SystemExit(int(ExitCode.FINDINGS))
    unusable = [n for n, p in ctx.plan.items() if n in ctx.hosts and n not in missing and not p.address]
    if missing and not allow_partial:
        click.echo(f"ddpfix: refused: {not_read(ctx, missing)}; writing env files now would leave an "
                   "incomplete rank set (ranks never shift). Fix the node or pass --allow-partial.", err=True)
        raise SystemExit(int(ExitCode.FINDINGS))
    if unusable:
        raise DdpfixError(f"no address in the cluster network {ctx.cidr} on: {', '.join(unusable)} "
                          "(or the master has none); run ddpfix audit", ExitCode.FINDINGS)
    files = {n: render_file(cluster.env_template, p) for n, p in ctx.plan.items()
             if n in ctx.hosts and n not in missing and (node is None or n == node)}
    if node is not None and node not in files:
        raise DdpfixError(f"--node {node}: not read (outside --limit or unreachable); its file is unknown",
                          ExitCode.FINDINGS)
    if to_stdout:
        text = files[node]  # type: ignore[index]
        sys.stdout.write(text if show_secrets else redact_env(text))
        return
    if apply:
        not_ours = {n: reason for n in files if (reason := env_not_ours((ctx.facts.get(n) or {}).get("env_file") or {},
                                                                  cluster.env_adopt))}
        if not_ours:  # refused before any node is touched, so no node gets a new file
            raise DdpfixError(env_refusal(not_ours), ExitCode.INVALID_INPUT)
    if local_dir:
        d = Path(local_dir)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, text in files.items():
            _atomic_write(d / f"{name}.env", text)
    shown = {n: redact_env(text) for n, text in files.items()}  # what is printed never holds a secret
    if fmt == "json":
        sys.stdout.write(json.dumps({"schema": "ddpfix.env/v1", "files": shown, "missing": missing}, indent=2) + "\n")
    elif not apply:
        for name, text in shown.items():
            click.echo(f"==> {name}:{cluster.env_path} <==\n{text}")
    if apply:
        plans = {n: HostPlan(env=dict(ctx.plan[n].env), env_comment=env_comment(ctx.plan[n]),
                          env_key_comments=dict(ctx.plan[n].comments)) for n in files}
        run, _changes = run_remediation(ctx, plans, apply=True, limit=app.limit, forks=app.forks,
                                       verbosity=app.verbosity, progress=None)
        failed = {h: r.message for h, r in run.hosts.items() if r.failed or r.unreachable}
        for h in sorted(files):
            state = "failed: " + failed[h] if h in failed else ("written" if run.changed(h) else "unchanged")
            click.echo(f"{h}: {cluster.env_path} {state}", err=True)
        if failed:
            raise SystemExit(int(ExitCode.FINDINGS))


def _export(het_group: str | None, port_range: str | None, nproc: int | None, cluster_file: str) -> None:
    """`env --slurm --export`: this node's per-job values as `export` lines on stdout, notes on stderr."""

    doc = clusterfile.load(cluster_file)[1] if os.path.lexists(cluster_file) else None
    values, notes = job_env(os.environ, het_groups=parse_het_groups(het_group) if het_group else (),
                            port_range=parse_port_range(port_range, "--port-range") if port_range else None,
                            port_source="--port-range", nproc=nproc, doc=doc)
    for note in notes:
        click.echo(note, err=True)
    sys.stdout.write(export_lines(values))


#: What each task of the batch script's step runs on its node: the node's own env file (interfaces, fabric), then
#: this job's values (they come after, so they win over any launch key an older file still holds), then torchrun.
STEP = ('if [ -r {env} ]; then set -a; . {env}; set +a; fi; '
        'v=$(${{DDPFIX:-ddpfix}} env --slurm --export) && eval "$v" && exec torchrun --max-restarts=0 "$@"')


def sbatch_script(cluster: Cluster, script: tuple[str, ...]) -> str:
    """A batch script for the inventory's nodes: #SBATCH directives (one task per node: torchrun starts the
    node's processes), then the step. Per-job values come from `env --slurm --export` inside the step, at run time
    on each node, so nothing of this job is written to /etc and two jobs never share a file."""
    n = len(cluster.nodes)
    args = " ".join(shlex.quote(a) for a in script) if script else '"$@"'
    step = STEP.format(env=shlex.quote(cluster.env_path))
    return (f"#!/bin/bash\n"
            f"# Written by `ddpfix env --format sbatch` for the inventory's {n} nodes: sbatch this file.\n"
            f"#SBATCH --nodes={n}\n"
            f"#SBATCH --ntasks-per-node=1\n"
            f"#SBATCH --nodelist={','.join(cluster.names)}\n"
            f"export DDPFIX_NPROC_PER_NODE={cluster.nproc_per_node}\n"
            f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(step)} torchrun {args}\n")


def _atomic_write(path: Path, text: str) -> None:
    """`text` into `path`, atomically and 0600 (an env file may hold secrets: it is readable by its owner only)."""
    write_atomic(path, text, mode=0o600)
