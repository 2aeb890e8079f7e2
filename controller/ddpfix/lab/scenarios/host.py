"""The launch path's host environment: /dev/shm, stray profile variables, somaxconn, nofile, the torch version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpfix.lab.model import NODE_PATH, LabPlan, NodePlan
from ddpfix.lab.scenarios.fabric import FABRIC_RUN, stub_task
from ddpfix.lab.scenarios.netif import arp_node
from ddpfix.lab.scenarios.registry import Expect, last, scenario, second
from ddpfix.rules import env as env_rules
from ddpfix.rules import host as host_rules
from ddpfix.rules import net as net_rules

if TYPE_CHECKING:
    from ddpfix.lab.daemons import Runtime



SMALL_SHM = "64m"  # Docker's default --shm-size


@scenario(
    "shm-small",
    f"the highest-address node's /dev/shm is remounted with size={SMALL_SHM} (Docker's default)",
    expect=(
        Expect(host_rules.SHM_SMALL.id, "node3", lambda info: [
            "statvfs /dev/shm: 67108864 bytes (64 MiB)", "size=65536k", "GPUs per node: 1"]),
    ),
)
def _shm_small(plan: LabPlan) -> None:
    """Failure mode: shared memory. Every lab node has its own /dev/shm (a tmpfs in its mount namespace, sized
    half the machine's RAM by default); on nodeN it is remounted with size=64m once the node is up, what a
    container gets from Docker without --shm-size or --ipc=host. Finding: host_rules.SHM_SMALL on nodeN."""
    last(plan).tasks.append(_remount_shm)


def _remount_shm(rt: Runtime, node: NodePlan) -> None:
    rt.exec(node, ["mount", "-o", f"remount,size={SMALL_SHM}", "/dev/shm"])


STRAY_PROFILE = "profile.d/zz-site-ddp.sh"  # under the node's /etc


@scenario(
    "env-stray",
    "node2's /etc/environment says NODE_RANK=0 (a golden image from the master) and a profile.d script exports "
    "NCCL_SOCKET_IFNAME=eth1 and RANK=0",
    min_nodes=2,
    expect=(
        Expect(env_rules.STRAY.id, "node2", lambda info: [
            "/etc/environment:2: NODE_RANK=0 (the env file sets NODE_RANK=1; read by pam_env",
            f"/etc/{STRAY_PROFILE}:3: NCCL_SOCKET_IFNAME=eth1 (the env file sets "
            f"NCCL_SOCKET_IFNAME=={info.node('node2').ifname}",
            f"/etc/{STRAY_PROFILE}:4: RANK=0 (not in the env file"]),
    ),
)
def _env_stray(plan: LabPlan) -> None:
    """Failure mode: launcher variables set elsewhere (Lightning-AI/pytorch-lightning#5651). node2's
    /etc/environment (read by pam_env for every SSH session) carries NODE_RANK=0, as an image built on the master
    would, and /etc/profile.d/zz-site-ddp.sh (login shells) exports NCCL_SOCKET_IFNAME=eth1 and RANK=0. ddpfix
    reads them as text (never sourcing them) and compares them with the env file it plans for node2.
    Finding: env_rules.STRAY on node2, naming each file and line."""
    node = second(plan)
    node.files["environment"] = f"PATH=\"{NODE_PATH}\"\nNODE_RANK=0\n"
    node.files[STRAY_PROFILE] = (
        "# a site script left from an older cluster (ddpfix lab scenario env-stray)\n"
        "[ -n \"$PS1\" ] || true\n"
        "export NCCL_SOCKET_IFNAME=eth1\n"
        "export RANK=0\n"
    )


@scenario(
    "somaxconn-low",
    "net.core.somaxconn on node1 (per network namespace) is below the world size",
    (net_rules.SOMAXCONN_LOW.id,),
    min_nodes=2,
)
def _somaxconn_low(plan: LabPlan) -> None:
    """Failure mode: the master port at scale, in miniature. node1's network namespace has net.core.somaxconn
    = N-1 (N nodes, one process each, so the world size is N): the master's listen backlog is
    smaller than the number of ranks dialling it at once. sysctl of node1's namespace only.
    Finding: net_rules.SOMAXCONN_LOW on node1."""
    plan.master.sysctls["net.core.somaxconn"] = str(len(plan.nodes) - 1)


NOFILE_LAB_SOFT = 512  # below what lab B's 3 nodes need (ddpfix.rules.host.nofile_needed(3) = 896)


@scenario(
    "nofile-low",
    f"node2's SSH logins get a soft open-file limit of {NOFILE_LAB_SOFT} from a site limits.d file",
    min_nodes=2,
    expect=(
        Expect(host_rules.NOFILE_LOW.id, "node2",
               lambda info: [f"RLIMIT_NOFILE of the ssh session: soft {NOFILE_LAB_SOFT}", "needed at 3 nodes: 896"]),
    ),
)
def _nofile_low(plan: LabPlan) -> None:
    """node2's sshd uses PAM (UsePAM yes, as on a stock distribution) and /etc/security/limits.d/10-site-nofile.conf
    sets `soft nofile 512` for * and root, so every SSH session there (the launch path of a login shell) may open
    512 files, fewer than NCCL and Gloo need at 3 nodes. Finding: host_rules.NOFILE_LOW on node2; ddpfix remediate
    --apply writes 90-ddpfix-nofile.conf (a later file, so it wins) within the session's hard limit."""
    victim = second(plan)
    victim.files["ssh/sshd_config.d/00-ddpfix-lab-0pam.conf"] = (
        "# ddpfix lab (nofile-low): PAM on, so pam_limits applies limits.d to new logins\nUsePAM yes\n"
    )
    victim.files["security/limits.d/10-site-nofile.conf"] = (
        "# a site default left from an old image (ddpfix lab scenario nofile-low)\n"
        f"*     soft  nofile  {NOFILE_LAB_SOFT}\nroot  soft  nofile  {NOFILE_LAB_SOFT}\n"
    )


TORCH_LAB_FAKE = "2.4.1+cu121"


@scenario(
    "torch-version-mismatch",
    f"node3's ddp_python is a stand-in that reports torch {TORCH_LAB_FAKE} (CUDA 12.1, NCCL 2.20.5); the others run "
    "the lab's torch",
    min_nodes=2,
    expect=(
        Expect(env_rules.TORCH_VERSION_MISMATCH.id, "node3", lambda info: [
            f"on node3: torch {TORCH_LAB_FAKE} (CUDA 12.1, NCCL 2.20.5)", "node1: torch ",
        ]),
    ),
)
def _torch_version_mismatch(plan: LabPlan) -> None:
    """node3's ddp_python (host var) is a stand-in script in its /run that prints what ddpfix's torch reader prints
    for a CUDA 12.1 build of torch 2.4.1 with NCCL 2.20.5; the other nodes run the lab's interpreter (torch 2.13.0,
    CPU). Finding: env_rules.TORCH_VERSION_MISMATCH on node3 (detect only)."""
    node = arp_node(plan)
    node.hostvars["ddp_python"] = f"/run/{FABRIC_RUN}/bin/python-torch"
    text = (
        "#!/bin/sh\n# ddpfix lab stand-in: what ddpfix's torch reader prints for a CUDA 12.1 build of torch 2.4.1\n"
        f"echo '{{\"version\": \"{TORCH_LAB_FAKE}\", \"cuda\": \"12.1\", \"hip\": null, \"nccl\": \"2.20.5\", "
        "\"error\": null}'\n"
    )
    node.tasks.append(stub_task("python-torch", text))
