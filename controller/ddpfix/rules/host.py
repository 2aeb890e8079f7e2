"""Host limits on the launch path: the open-file limit against the cluster size and /dev/shm against the GPUs per
node. Facts: ``limits`` and ``shm`` of ``ddpfix_node_facts``, validated by ``ddpfix.factguard``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpfix.model.finding import Finding, Remedy, Severity
from ddpfix.rules.context import Context
from ddpfix.rules.registry import Rule, finding, rules

W = Severity.WARNING


# ------------------------------------------------------------------ limits.nofile-low
#
# The rule (what one training process holds open, by cluster size N nodes):
#   NOFILE_BASE                 files a rank holds with no peer at all: CUDA driver and libraries, DataLoader worker
#                               pipes, dataset and checkpoint files, the TCPStore client;
#   + NOFILE_PER_PEER x (N - 1) per remote node: 8 local ranks (a GPU node) x 24 sockets per remote rank: NCCL's
#                               bootstrap ring and proxy connections, the socket transport's data sockets of its
#                               channels (NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS each, up to 64), Gloo's full
#                               mesh pair per rank and its TCPStore connections.
# So a soft limit of 1024 (a systemd service's default soft LimitNOFILE, many images' ulimit -n) holds up to 3 nodes
# and breaks NCCL's bootstrap from 4 nodes on ("socket: Too many open files", goodfire-ai/spd#957, NVIDIA/nccl#550).
NOFILE_BASE = 512
NOFILE_PER_PEER = 192
#: what the fix writes (`nofile_fix`): the need, but at least this (every distribution's "generous" value) and no more
#: than the session's hard limit, so the hard limit is only raised where it is below the need ...
NOFILE_FIX_MIN = 65536
#: ... and never above the kernel's default fs.nr_open (a larger value fails setrlimit: pam_limits refuses the login)
NOFILE_FIX_MAX = 1048576
NOFILE_PATH = "/etc/security/limits.d/90-ddpfix-nofile.conf"


def nofile_needed(nodes: int) -> int:
    """The soft RLIMIT_NOFILE a training process needs in a cluster of `nodes` nodes (see the rule above)."""
    return NOFILE_BASE + NOFILE_PER_PEER * max(0, nodes - 1)


def nofile_fix(need: int, hard: int) -> tuple[int, int]:
    """(soft value, hard value to write, 0: none) for a node whose SSH session's hard limit is `hard` (-1 unlimited).
    Within the hard limit the soft limit alone is raised (an unprivileged process may do that); a hard limit below
    the need is raised to the value as well (root's sshd may; pam_limits fails the login where it cannot)."""
    if hard == -1 or hard >= need:
        return min(max(need, min(NOFILE_FIX_MIN, NOFILE_FIX_MAX if hard == -1 else hard)), NOFILE_FIX_MAX), 0
    value = min(max(need, NOFILE_FIX_MIN), NOFILE_FIX_MAX)
    return value, value


def _limit(v: int) -> str:
    return "unlimited" if v == -1 else str(v)


@rules(
    NOFILE_LOW := Rule("limits.nofile-low", W,
         "the soft open-file limit (RLIMIT_NOFILE) of the SSH session or a launcher unit (`ddp_launcher_units`) is "
         f"below what NCCL/Gloo need at this cluster's size ({NOFILE_BASE} + {NOFILE_PER_PEER} per peer node: a "
         "soft limit of 1024 breaks NCCL's bootstrap from 4 nodes on)",
         "Raise the soft nofile limit of the launch path to {value}: ddpfix remediate --apply writes " + NOFILE_PATH +
         " (nofile {value} for * and root) for new PAM logins and, for each unit of ddp_launcher_units, "
         "/etc/systemd/system/UNIT.d/90-ddpfix-nofile.conf (LimitNOFILE={value}:{unit_hard}; it applies at the "
         "unit's next start); by hand: ulimit -n {value} in the launch script, or docker run --ulimit "
         "nofile={value}:{unit_hard}.",
         remedies=(Remedy("ddpfix_limits", "nofile", how="limits.d", tags=("nofile",)),),
         reads=frozenset({"nofile_units"}),
         # a low limit read is low whatever an unreadable unit has
         sound_on_partial=True,
         still_open="pam_limits applies limits.d only where sshd runs with UsePAM yes (and session pam_limits.so in "
                    "/etc/pam.d/sshd); without PAM raise the limit where sshd starts (LimitNOFILE in a drop-in for "
                    "ssh.service) or in the launch script (ulimit -n)"),
)
def check_nofile(ctx: Context) -> Iterable[Finding]:
    nodes = len(ctx.cluster.nodes)
    need = nofile_needed(nodes)
    for name, f in ctx.audited():
        lim = f.get("limits")
        if not isinstance(lim, Mapping):
            continue  # not collected (an older facts module)
        limits = [x for x in [lim.get("nofile"), *(lim.get("nofile_units") or {}).values()] if isinstance(x, Mapping)]
        low = [x for x in limits if x.get("soft") not in (None, -1) and int(x["soft"]) < need]
        if not low:
            continue
        sess: Any = lim.get("nofile")
        session: Mapping[str, Any] = sess if isinstance(sess, Mapping) else {}
        hard = int(session["hard"]) if session.get("hard") is not None else -1
        value, hard_line = nofile_fix(need, hard)
        units = [x for x in (lim.get("nofile_units") or {}).values() if isinstance(x, Mapping)]
        unit_hards = [int(x["hard"]) for x in units if x.get("hard") is not None] + [hard]
        unit_hard = -1 if -1 in unit_hards else max([value, *unit_hards])
        first = low[0]
        yield finding(
            "limits.nofile-low", name,
            f"the soft open-file limit on {name} is {first['soft']} ({first.get('source') or 'ssh session'}), "
            f"a {nodes}-node cluster needs {need}",
            "; ".join(f"RLIMIT_NOFILE of the {x.get('source') or 'ssh session'}: soft {_limit(int(x['soft']))}, "
                      f"hard {_limit(int(x['hard'] if x.get('hard') is not None else -1))}" for x in low)
            + f"; needed at {nodes} nodes: {need} ({NOFILE_BASE} + {NOFILE_PER_PEER} x {max(0, nodes - 1)} peers)",
            value=value,
            hard=hard_line,  # the limits.d hard line only where the session's hard limit is below the need
            unit_hard="infinity" if unit_hard == -1 else unit_hard,
        )


# ------------------------------------------------------------------ shared memory (/dev/shm)


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
    SHM_SMALL := Rule(
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
