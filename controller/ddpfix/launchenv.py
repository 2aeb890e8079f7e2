"""The launch path's host environment: /dev/shm against the GPUs per node, and launcher variables that shell start
files set behind the env file's back.

Pure functions over the `shm` and `shell_env` facts (read on the node by the ``ddpfix_hostenv`` module_utils: one
statvfs and plain file reads, nothing evaluated). Both findings are detect-only: /dev/shm is sized by the container
runtime or the mount, and shell start files belong to the site and its users.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ddpfix.model.finding import Finding
from ddpfix.rules.registry import Rule, Severity, finding, rules

if TYPE_CHECKING:
    from ddpfix.checks import Context

GiB = 2**30
MiB = 2**20
#: One NCCL SHM-transport connection's segment, NCCL's defaults: the receive buffers of the Simple protocol
#: (NCCL_BUFFSIZE 4 MiB), LL128 (120 x 640 x 8 steps x 8 B = 4,915,200) and LL (8 x 512 x 8 steps x 16 B = 524,288)
#: plus the 4,100-byte header: 9,637,892 bytes, exactly the size in NCCL's "failed to extend /dev/shm/nccl-* to
#: 9637892 bytes" of NVIDIA/nccl#342 (Docker's default 64 MiB /dev/shm).
NCCL_SHM_SEGMENT = 9_637_892
#: Segments per local rank: one per channel for each of the two neighbours a ring and a tree connect through SHM,
#: at NCCL's usual 16 channels on a PCIe node (NCCL uses SHM where P2P is not possible: across CPU sockets, between
#: containers without a shared IPC namespace, or with NCCL_P2P_DISABLE).
NCCL_SHM_SEGMENTS_PER_RANK = 2 * 16
#: The floor: DataLoader workers hand every batch to the training process through /dev/shm (torch.multiprocessing's
#: file_descriptor strategy); a worker that cannot extend its segment dies with "Bus error" (pytorch/torchtitan#853).
SHM_FLOOR = 1 * GiB


def shm_needed(gpus: int) -> int:
    """The /dev/shm size a node with `gpus` local ranks needs: max(1 GiB, gpus x 32 x 9,637,892 B) (about 294 MiB per
    GPU: 2.3 GiB for 8 GPUs). Below it NCCL's SHM transport and DataLoader workers fail at their first large step."""
    return max(SHM_FLOOR, max(gpus, 1) * NCCL_SHM_SEGMENTS_PER_RANK * NCCL_SHM_SEGMENT)


def _size(n: int) -> str:
    if n >= GiB and n % GiB == 0:
        return f"{n // GiB} GiB"
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


@rules(
    Rule(
        "host.shm-small",
        Severity.WARNING,
        "/dev/shm smaller than the node's GPUs need: max(1 GiB, GPUs x 32 x 9,637,892 B), NCCL's SHM segments "
        "(NVIDIA/nccl#342) and DataLoader workers (pytorch/torchtitan#853); Docker's default is 64 MiB",
        "Give {node} a /dev/shm of at least {need}: in a container run it with --ipc=host (NVIDIA's advice for NGC "
        "images) or --shm-size={need_arg} (docker/podman run; shm_size: in Compose); in Kubernetes mount an emptyDir "
        "with medium: Memory (sizeLimit: {need_arg}) at /dev/shm; on a host, mount -o remount,size={need_arg} "
        "/dev/shm and set size={need_arg} on its /etc/fstab line. Not changed automatically.",
        reads=frozenset({"shm"}),
        manual="sized by the container runtime or the mount",
    ),
)
def check_shm(ctx: Context) -> Iterable[Finding]:
    nproc = ctx.cluster.nproc_per_node
    for name, f in ctx.audited():
        shm: Mapping[str, Any] = f.get("shm") or {}
        size = shm.get("size_bytes")
        if not isinstance(size, int):  # not read (the `shm` source is unread) or facts of an older ddpfix
            continue
        seen = shm.get("gpus")
        gpus = max(nproc, seen if isinstance(seen, int) else 0, 1)
        need = shm_needed(gpus)
        if size >= need:
            continue
        mount = f"{shm.get('fstype') or 'unknown type'} {shm.get('options') or ''}".strip()
        avail = shm.get("avail_bytes")
        why = f"ddp_nproc_per_node {nproc}" + (f", {seen} GPUs in {shm.get('gpus_source')}" if seen else "")
        yield finding(
            "host.shm-small",
            name,
            f"/dev/shm on {name} is {_size(size)}, below the {_size(need)} its {gpus} GPU(s) per node need: NCCL's SHM "
            "transport fails with 'failed to extend /dev/shm/nccl-*' and DataLoader workers die with a bus error",
            f"statvfs {shm.get('path') or '/dev/shm'}: {size} bytes ({_size(size)})"
            + (f", {avail} available" if isinstance(avail, int) else "")
            + f"; mount: {mount}; GPUs per node: {gpus} ({why}); need >= {need} bytes ({_size(need)}: "
            f"max(1 GiB, {gpus} x 32 x {NCCL_SHM_SEGMENT}))",
            node=name,
            need=_size(need),
            need_arg=f"{-(-need // GiB)}g",
        )


#: Who reads which start file (what the finding says about each file)
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
    Rule(
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
                continue  # no cluster NIC to compare with (netif.missing says so)
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
