"""The launch environment: the per-node env file against the plan, the Slurm allocation, launcher variables set
behind the env file's back, and the torch builds across nodes."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddpfix.envtemplate import judge as env_judge
from ddpfix.model import pyargv
from ddpfix.model.finding import Explains, Finding, Severity
from ddpfix.plan import CLUSTER_KEYS, LAUNCH_KEYS
from ddpfix.rules.context import SRC_ENV, Context
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import ENV

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


# ---------------------------------------------------------------- env files


@rules(
    MISSING := Rule(
        "env.missing",
        INFO,
        "no env file yet (or one that sets none of the keys ddpfix writes)",
        "Write it: ddpfix env -i INVENTORY --apply (or ddpfix remediate --apply).",
        remedies=(ENV,),
        reads=SRC_ENV,
    ),
    INCONSISTENT := Rule(
        "env.inconsistent",
        E,
        "env files disagree between nodes, ranks duplicated / not 0..N-1, or differ from the plan",
        "Rewrite them: ddpfix env -i INVENTORY --apply.",
        remedies=(ENV,),
        reads=SRC_ENV,
        explains=(Explains("env.inconsistent", "cluster"),),
    ),
)
def check_env(ctx: Context) -> Iterable[Finding]:
    existing: dict[str, dict[str, str]] = {}
    for name, f in ctx.audited():
        ef: Mapping[str, Any] = f.get("env_file") or {}
        keys_set: Mapping[str, str] = ef.get("values") or {}
        if not ef.get("exists"):
            yield finding(
                "env.missing", name, f"{ef.get('path')} does not exist", f"stat {ef.get('path')}: no such file"
            )
        elif ef.get("readable", True) and not set(keys_set) & set(ctx.plan[name].env):
            # a file of the user's own (or another tool's) at that path: ddpfix's keys are missing, not inconsistent
            yield finding(
                "env.missing",
                name,
                f"{ef.get('path')} sets none of the keys ddpfix writes",
                f"{ef.get('path')}: {len(keys_set)} other key(s) ({', '.join(sorted(keys_set)[:5]) or 'none'}), "
                "kept when ddpfix adds its block",
            )
        else:
            existing[name] = dict(keys_set)
    if not existing:
        return
    for key in CLUSTER_KEYS:
        values = {n: v.get(key) for n, v in existing.items()}
        if len(set(values.values())) > 1:
            yield finding(
                "env.inconsistent",
                None,
                f"{key} differs between nodes' env files",
                ", ".join(f"{n}: {key}={v}" for n, v in sorted(values.items())),
            )
    ranks: dict[str, list[str]] = {}
    for n, v in existing.items():
        ranks.setdefault(v.get("NODE_RANK", ""), []).append(n)
    for r, ns in ranks.items():
        if len(ns) > 1 and r:  # an unset NODE_RANK is reported per node below, not as a duplicate
            yield finding(
                "env.inconsistent",
                None,
                f"NODE_RANK={r} is set on {len(ns)} nodes",
                ", ".join(f"{n}: NODE_RANK={r}" for n in sorted(ns)),
            )
    if len(existing) == len(ctx.cluster.nodes) and ctx.cluster.env_scope == "cluster":
        got = sorted(v.get("NODE_RANK", "") for v in existing.values())
        if got != sorted(str(i) for i in range(len(ctx.cluster.nodes))) and all(len(v) == 1 for v in ranks.values()):
            yield finding(
                "env.inconsistent",
                None,
                f"NODE_RANKs are not 0..{len(ctx.cluster.nodes) - 1}",
                "NODE_RANK values: " + ", ".join(got),
            )
    for n in sorted(existing):
        ef_n: Mapping[str, Any] = (ctx.facts[n] or {}).get("env_file") or {}
        # secret-looking values are compared by digest and shown as *** (env_differs): never the wanted value
        judged = env_judge(ef_n, ctx.plan[n], ctx.cluster.env_template)  # the template's keys when it has one
        diff = [f"{k}={got} (want {shown})" for k, got, shown in judged.differs]
        if ctx.cluster.env_scope == "node":  # a node-global file must not pin a job's launch values
            diff += [f"{k}={v} (per job: not in the file with ddp_env_scope: node)"
                     for k, v in sorted((ef_n.get("managed") or {}).items()) if k in LAUNCH_KEYS]
        if diff:
            yield finding(
                "env.inconsistent",
                n,
                f"{(ctx.facts[n] or {}).get('env_file', {}).get('path')} differs from what ddpfix would write",
                "; ".join(diff),
            )


@rules(
    NODE_COUNT_MISMATCH := Rule(
        "slurm.node-count-mismatch",
        E,
        "the Slurm allocation's node count (SLURM_JOB_NUM_NODES, SLURM_NNODES, SLURM_STEP_NUM_NODES) is not the "
        "number of nodes its node list expands to (audit --slurm)",
        "Run ddpfix inside one job step of one job, where srun sets that step's own SLURM_* variables; in a "
        "heterogeneous job name the components that train with --het-group (DDPFIX_HET_GROUP). env --slurm, "
        "remediate --slurm and inventory slurm refuse these variables (exit 2): a launch from them gets a wrong world "
        "size.",
    ),
)
def check_slurm_allocation(ctx: Context) -> Iterable[Finding]:
    """The allocation the --slurm audit checks: its declared node count against its node list (slurm.py, which
    puts a disagreement into the inventory it writes instead of refusing, for the audit only)."""
    why = ctx.cluster.slurm_count_mismatch
    if why:
        yield finding("slurm.node-count-mismatch", None, f"the Slurm allocation's variables disagree: {why}", why)


def _build(t: Mapping[str, Any]) -> str:
    return f"CUDA {t['cuda']}" if t.get("cuda") else f"ROCm {t['hip']}" if t.get("hip") else "CPU"


def _triple(t: Mapping[str, Any]) -> tuple[str, str, str]:
    return str(t["version"]), _build(t), str(t.get("nccl") or "none")


def _describe(t: tuple[str, str, str]) -> str:
    return f"torch {t[0]} ({t[1]}, NCCL {t[2]})"


def _pip(python: str | list[str], version: str) -> str:
    base, _, local = version.partition("+")
    if not isinstance(python, str):  # a container's interpreter: the image is what changes
        return f"run an image with torch=={base} in ddp_python ({pyargv.shown(python)})"
    index = f" --index-url https://download.pytorch.org/whl/{local}" if re.fullmatch(r"cpu|cu\d+|rocm[\d.]+", local) \
        else ""
    return f"{python} -m pip install torch=={base}{index}"


@rules(
    TORCH_VERSION_MISMATCH := Rule("env.torch-version-mismatch", W,
         "torch's version, its CUDA/ROCm build or its NCCL version (from `ddp_python`) differ between nodes, on "
         "every cluster (pytorch/pytorch#122571: collectives hang or fail between builds)",
         "Install on {node} the build {ref} runs, {want}: {pip} (or point ddp_python of {node} at an "
         "interpreter that has it). Not changed automatically.",
         reads=frozenset({"torch"}), manual="one torch build everywhere"),
)
def check_torch_versions(ctx: Context) -> Iterable[Finding]:
    read: dict[str, tuple[str, str, str]] = {}
    pythons: dict[str, str | list[str]] = {}
    for name, f in ctx.audited():
        t = f.get("torch")
        if isinstance(t, Mapping) and t.get("version") and "torch" not in ctx.unread(name):
            read[name] = _triple(t)
            pythons[name] = t.get("python") or pyargv.DEFAULT
    if len(set(read.values())) < 2:
        return
    master = ctx.cluster.master
    if master in read:
        want, ref = read[master], f"{master} (master)"
    else:
        counts: Sequence[tuple[tuple[str, str, str], int]] = Counter(read.values()).most_common()
        want = sorted(t for t, c in counts if c == counts[0][1])[0]
        ref = ", ".join(n for n, t in read.items() if t == want)
    others = "; ".join(f"{n}: {_describe(t)}" for n, t in read.items())
    for name, got in read.items():
        if got == want:
            continue
        yield finding(
            "env.torch-version-mismatch", name,
            f"{name} runs {_describe(got)}, {ref} runs {_describe(want)}",
            f"{pyargv.shown(pythons[name])} on {name}: {_describe(got)}; {others}",
            node=name, ref=ref, want=_describe(want), pip=_pip(pythons[name], want[0]),
        )


_READ_BY = {
    "/etc/environment": "pam_env: every SSH, su and login session",
    "/etc/profile": "login shells",
    "/etc/bash.bashrc": "interactive bash",
}


def _read_by(path: str) -> str:
    if path in _READ_BY:
        return _READ_BY[path]
    if path.startswith("/etc/profile.d/"):
        return "login shells"
    if path.endswith("/.bashrc"):
        return "interactive bash and commands sshd runs (ssh node torchrun ...)"
    return "login shells"


def _same(key: str, got: str, want: str) -> bool:
    if key == "NCCL_SOCKET_IFNAME":  # NCCL's grammar: "=eth0" (exact) and "eth0" (prefix) pick the same NIC here
        return got.lstrip("=") == want.lstrip("=")
    return got == want


@rules(
    STRAY := Rule(
        "env.stray",
        Severity.WARNING,
        "/etc/environment, /etc/profile, /etc/profile.d/*.sh or the launch user's shell start files set a rendezvous, "
        "rank or socket-interface variable (MASTER_ADDR, MASTER_PORT, NODE_RANK, RANK, WORLD_SIZE, LOCAL_RANK, PET_*, "
        "*_SOCKET_IFNAME, NCCL_COMM_ID) that disagrees with the env file ddpfix plans (Lightning-AI/pytorch-lightning"
        "#5651); read as text, never evaluated",
        "Delete these lines or make them agree with {env_path}: {where}. A launch that does not source the env "
        "file last (a bare torchrun, an sbatch script, a scheduler's prolog) otherwise runs with them; a key the env "
        "file does not set (RANK, LOCAL_RANK, NCCL_COMM_ID, ...) reaches every launch from these shells. ddpfix does "
        "not edit shell start files.",
        reads=frozenset({"shell_env"}),
        manual="shell start files are the site's and its users'",
    ),
)
def check_stray_env(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        se: Mapping[str, Any] = f.get("shell_env") or {}
        plan = ctx.plan[name]
        want = {k: v for k, v in plan.env.items() if v}
        bad: list[str] = []
        where: list[str] = []
        for a in se.get("assignments") or []:
            key, value, at = a["key"], a["value"], f"{a['file']}:{a['line']}"
            shown = "*** (secret-looking, not shown)" if a.get("secret") else value
            if key.endswith("_SOCKET_IFNAME") and not plan.ifname:
                continue  # no cluster NIC to compare with (rules.netif says so)
            if a.get("dynamic"):
                why = "set from a shell expression ddpfix does not evaluate"
            elif a.get("secret"):
                why = "cannot be compared" if key in want else "not in the env file"
            elif key in want and _same(key, value, want[key]):
                continue
            elif key in want:
                why = f"the env file sets {key}={want[key]}"
            else:
                why = "not in the env file: every launch from these shells inherits it"
            notes = [why] + (["not exported: only command lines that expand it"] if not a.get("exported") else []) \
                + (["conditional"] if a.get("conditional") else [])
            bad.append(f"{at}: {key}={shown} ({'; '.join(notes)}; read by {_read_by(a['file'])})")
            where.append(at)
        if bad:
            users = ", ".join(se.get("users") or []) or "root"
            yield finding(
                "env.stray",
                name,
                f"{len(bad)} shell start file line(s) on {name} set launcher variables that disagree with the env "
                f"file ddpfix plans ({ctx.cluster.env_path})",
                "; ".join(bad) + f" (start files read for: {users})",
                env_path=ctx.cluster.env_path,
                where=", ".join(dict.fromkeys(where)),
            )
