"""GPU fabric scenarios (synthetic RDMA sysfs), generated from one table: `FABRIC` rows, `_build` makes each row's
scenario.

A lab node cannot get a /sys/class/infiniband of its own: sysfs has no such directory here to mount over, and
creating one is not possible. So each fabric scenario writes a synthetic tree in the kernel's layout
(ddpfix.lab.fabrictree) into the node's private /run (/run/ddpfix-lab-fabric/{sys,dev}) and points the facts
role at it with the host vars ddpfix_facts_sysfs_root / ddpfix_facts_dev_root. The memlock limit is real: it is
the SSH session's RLIMIT_MEMLOCK. The lab cannot grant unlimited (no CAP_SYS_RESOURCE here; sessions inherit the
host's 8 MiB hard limit), so fabric scenarios set ddp_memlock: 8192 (KiB), the lab's "enough".

Every fabric scenario is the same shape: every node gets two rails of one kind (`ib` or `roce`); `every` may edit
each node's devices and write_tree options, `victim` (node2 or the highest-address node) may edit its own, and
`after` may add what is not in the tree (stand-in executables, env files, /etc files) once the trees are planned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpfix.lab.fabrictree import Device, Gid, Port, ib_port, ipv4_gid, roce_port, write_tree
from ddpfix.lab.model import LabPlan, NodePlan
from ddpfix.lab.scenarios.registry import last, scenario, second
from ddpfix.rules import fabric as fabric_rules

if TYPE_CHECKING:
    from ddpfix.lab.daemons import Runtime

LAB_MEMLOCK_KIB = 8192

FABRIC_RUN = "ddpfix-lab-fabric"

#: edit(node, devices, write_tree options) before the node's tree is written
Edit = Callable[[NodePlan, list[Device], dict[str, Any]], None]


def _fabric_devices(node: NodePlan, kind: str) -> list[Device]:
    if kind == "roce":
        return [
            Device(
                f"mlx5_{r}",
                [roce_port(f"10.{10 + r}.0.{10 + node.index}", f"rdma{r}")],
                netdevs=[f"rdma{r}"],
                numa_node=r,
            )
            for r in (0, 1)
        ]
    return [
        Device(f"mlx5_{r}", [ib_port(f"b83f:d203:00{node.index:02x}:0a1{r}")], netdevs=[f"ib{r}"], numa_node=r)
        for r in (0, 1)
    ]


def fabric_everywhere(plan: LabPlan, kind: str = "ib", edit: Edit | None = None) -> None:
    """Give every node a synthetic RDMA tree (`kind` ib or roce); `edit(node, devices, opts)` may change a node's
    devices, and `opts` (write_tree's `uverbs`, `modules`), before they are written."""
    plan.groupvars["ddp_memlock"] = LAB_MEMLOCK_KIB
    for n in plan.nodes:
        n.hostvars["ddpfix_facts_sysfs_root"] = f"/run/{FABRIC_RUN}/sys"
        n.hostvars["ddpfix_facts_dev_root"] = f"/run/{FABRIC_RUN}/dev"
        devices = _fabric_devices(n, kind)
        opts: dict[str, Any] = {"uverbs": True, "modules": ()}
        if edit:
            edit(n, devices, opts)
        n.tasks.append(_fabric_task(devices, opts))


def _fabric_task(devices: list[Device], opts: dict[str, Any]) -> Callable[[Runtime, NodePlan], None]:
    def task(rt: Runtime, node: NodePlan) -> None:
        root = rt.node_dir(node) / "run" / FABRIC_RUN
        write_tree(root / "sys", devices, dev_root=root / "dev", **opts)

    return task


def stub_task(name: str, text: str) -> Callable[[Runtime, NodePlan], None]:
    """A node task writing the stand-in executable `name` under the node's /run/ddpfix-lab-fabric/bin."""

    def task(rt: Runtime, node: NodePlan) -> None:
        rt.write_run(node, f"{FABRIC_RUN}/bin/{name}", text, 0o755)

    return task


# --------------------------------------------------------------------------- the rows' edits


def _port_down(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    devs[1].ports[0].state = "DOWN"


def _gid_at_5(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    for r, d in enumerate(devs):
        p = roce_port(f"10.{10 + r}.0.{10 + n.index}", f"rdma{r}", v2_index=5)
        p.gids += [
            Gid(2, ipv4_gid(f"10.{20 + r}.0.{10 + n.index}"), "IB/RoCE v1", f"rdma{r}"),
            Gid(3, ipv4_gid(f"10.{20 + r}.0.{10 + n.index}"), "RoCE v1", f"rdma{r}"),
        ]
        d.ports[0] = p


def _pkey_8001(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    for d in devs:
        d.ports[0].pkey0 = "0x8001"


def _roce_instead(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    devs[:] = _fabric_devices(n, "roce")


def _edr_rate(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    devs[0].ports[0].rate = "100 Gb/sec (4X EDR)"


def _v1_only(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    devs[0].ports[0] = roce_port(f"10.10.0.{10 + n.index}", "rdma0", with_v2=False)
    devs[0].ports[0].gids = [g for g in devs[0].ports[0].gids if g.type != "RoCE v2"]


def _mgmt_rdma(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    port = roce_port(str(n.address), n.ifname, rate="25 Gb/sec (1X EDR)")
    devs.append(Device("mlx5_2", [port], netdevs=[n.ifname], numa_node=0))


def _hca_prefix(plan: LabPlan, victim: NodePlan) -> None:
    victim.env = plan.env_for(victim, NCCL_IB_HCA="mlx5")


def _no_uverbs(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    opts["uverbs"] = False


def _peermem(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    opts["modules"] = ("nvidia", "nvidia_peermem")


def _nvidia_only(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    opts["modules"] = ("nvidia",)


def _efa(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
    devs[:] = [Device("rdmap16s27", [Port(rate="100 Gb/sec (4X EDR)", link_layer="Unspecified")], driver="efa")]
    opts["modules"] = ("nvidia",)


def _stand_in(hostvar: str, name: str, text: Callable[[bool], str]) -> Callable[[LabPlan, NodePlan], None]:
    """Every node's host var `hostvar` names the stand-in executable `name`, `text(is_victim)` its script."""

    def after(plan: LabPlan, victim: NodePlan) -> None:
        for n in plan.nodes:
            n.hostvars[hostvar] = f"/run/{FABRIC_RUN}/bin/{name}"
            n.tasks.append(stub_task(name, text(n.name == victim.name)))

    return after


def _fi_info(victim: bool) -> str:
    return "#!/bin/sh\n# ddpfix lab stand-in for libfabric's fi_info (no EFA here)\n" + (
        "echo 'fi_getinfo: -61 (No data available)' >&2\nexit 1\n"
        if victim
        else "printf 'provider: efa\\n    fabric: efa\\n    domain: rdmap16s27-rdm\\n'\n"
    )


def _nccl_version(victim: bool) -> str:
    version = "2.18.1" if victim else "2.21.5"
    return f"#!/bin/sh\n# ddpfix lab stand-in: what torch.cuda.nccl.version() prints on a GPU build\necho {version}\n"


def _memlock_64k(plan: LabPlan, victim: NodePlan) -> None:
    victim.files["ssh/sshd_config.d/00-ddpfix-lab-0pam.conf"] = (
        "# ddpfix lab (fabric-memlock-low): PAM on, so pam_limits applies limits.d to new logins\nUsePAM yes\n"
    )
    victim.files["security/limits.d/10-site-memlock.conf"] = (
        "# a site default left from an old image (ddpfix lab scenario fabric-memlock-low)\n"
        "*     soft  memlock  64\nroot  soft  memlock  64\n"
    )


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Fabric:
    """One fabric scenario: `name`, its `summary` (lab up --help), its `finding`, its docstring `doc`."""

    name: str
    summary: str
    finding: str
    doc: str
    kind: str = "ib"  # every node's two rails: ib (HDR InfiniBand) or roce (100G RoCE)
    victim: Callable[[LabPlan], NodePlan] = second
    on_victim: Edit | None = None  # the victim's devices and options
    every: Edit | None = None  # every node's (before on_victim)
    after: Callable[[LabPlan, NodePlan], None] | None = None  # (plan, victim) once every tree is planned
    min_nodes: int = 2


FABRIC = (
    Fabric("fabric-port-down", "synthetic InfiniBand on every node; node2's mlx5_1 port 1 is DOWN (Disabled)",
           fabric_rules.PORT_DOWN.id,
           f"""Every node has two HDR InfiniBand rails (mlx5_0, mlx5_1; synthetic sysfs, see fabric_everywhere); on
    node2 mlx5_1/1 is `1: DOWN` with phys_state `3: Disabled`. Finding: {fabric_rules.PORT_DOWN.id} on node2.""",
           on_victim=_port_down),
    Fabric("fabric-gid-differs",
           "synthetic RoCE on every node; the highest-address node's RoCE v2 IPv4 GID is at index 5, not 3",
           fabric_rules.GID_INDEX_DIFFERS.id,
           f"""Every node has two 100G RoCE rails (netdevs rdma0/rdma1, RoCE v2 IPv4 GID at index 3 as mlx5 fills it);
    on nodeN the table holds one more address first, so its RoCE v2 IPv4 GID is index 5. Finding:
    {fabric_rules.GID_INDEX_DIFFERS.id} (cluster); the env plan writes no NCCL_IB_GID_INDEX.""",
           kind="roce", victim=last, on_victim=_gid_at_5),
    Fabric("fabric-pkey-mismatch",
           "synthetic InfiniBand on every node; node2's ports sit in partition 0x8001, the others in 0xffff",
           fabric_rules.PKEY_MISMATCH.id,
           f"""Every node has two HDR InfiniBand rails; node2's pkeys/0 is 0x8001 (partition 1), the others' 0xffff (the
    default partition). Finding: {fabric_rules.PKEY_MISMATCH.id} (cluster).""",
           on_victim=_pkey_8001),
    Fabric("fabric-link-layer-mixed",
           "synthetic InfiniBand on every node but the highest-address one, which has RoCE (Ethernet)",
           fabric_rules.LINK_LAYER_MIXED.id,
           f"""node1..node(N-1) have two HDR InfiniBand rails, nodeN two RoCE rails (link_layer Ethernet) with the same
    device names, as when a ConnectX port type was left at ETH. Finding: {fabric_rules.LINK_LAYER_MIXED.id}
    (cluster).""",
           victim=last, on_victim=_roce_instead),
    Fabric("fabric-rate-mismatch",
           "synthetic InfiniBand on every node; node2's mlx5_0 runs at 100 Gb/s (4X EDR), the others at 200",
           fabric_rules.RATE_MISMATCH.id,
           f"""Every node has two HDR InfiniBand rails; node2's mlx5_0/1 negotiated 100 Gb/sec (4X EDR), as with a bad
    cable or an EDR switch port. Finding: {fabric_rules.RATE_MISMATCH.id} on node2.""",
           on_victim=_edr_rate),
    Fabric("fabric-roce-no-v2-gid",
           "synthetic RoCE on every node; node2's mlx5_0 GID table has no RoCE v2 entry (v1 only)",
           fabric_rules.ROCE_NO_V2_GID.id,
           f"""Every node has two 100G RoCE rails; on node2 mlx5_0/1 has only RoCE v1 GIDs (RoCE v2 disabled). Finding:
    {fabric_rules.ROCE_NO_V2_GID.id} on node2.""",
           kind="roce", on_victim=_v1_only),
    Fabric("fabric-hca-includes-mgmt",
           "synthetic InfiniBand plus a 25G RoCE NIC on the SSH interface; node2's env file says NCCL_IB_HCA=mlx5",
           fabric_rules.HCA_INCLUDES_MGMT.id,
           f"""Every node has two HDR InfiniBand rails and a third RDMA device mlx5_2 (25 Gb/s RoCE) whose netdev is the
    node's cluster/SSH interface; node2's env file sets NCCL_IB_HCA=mlx5, which selects it too. Finding:
    {fabric_rules.HCA_INCLUDES_MGMT.id} on node2 (the env plan writes NCCL_IB_HCA==mlx5_0:1,mlx5_1:1).""",
           every=_mgmt_rdma, after=_hca_prefix, min_nodes=1),
    Fabric("fabric-no-uverbs",
           "synthetic InfiniBand on every node; node2 has no /dev/infiniband/uverbs* (ib_uverbs not loaded)",
           fabric_rules.NO_UVERBS.id,
           f"""Every node has two HDR InfiniBand rails; node2's /dev/infiniband holds only rdma_cm (no uverbs*, no
    umad*), as when ib_uverbs is not loaded. Finding: {fabric_rules.NO_UVERBS.id} on node2.""",
           on_victim=_no_uverbs, min_nodes=1),
    Fabric("fabric-peermem-missing",
           "synthetic InfiniBand and GPU driver on every node; nvidia_peermem loaded everywhere but node2",
           fabric_rules.PEERMEM_MISSING.id,
           f"""Every node has two HDR InfiniBand rails and /sys/module/nvidia (synthetic); /sys/module/nvidia_peermem
    exists on every node but node2. Finding: {fabric_rules.PEERMEM_MISSING.id} on node2.""",
           every=_peermem, on_victim=_nvidia_only, min_nodes=1),
    Fabric("fabric-efa-provider-missing",
           "synthetic EFA device on every node; node2's fi_info -p efa finds no efa provider",
           fabric_rules.EFA_PROVIDER_MISSING.id,
           f"""Every node has one EFA device (driver efa, link layer Unspecified; synthetic sysfs). The lab has no
    libfabric, so each node gets a stand-in fi_info (host var ddpfix_facts_fi_info) answering as libfabric does:
    `provider: efa` on the others, `fi_getinfo: -61 (No data available)` and exit 1 on node2 (aws/aws-ofi-nccl#67).
    Finding: {fabric_rules.EFA_PROVIDER_MISSING.id} on node2. The env plan writes FI_PROVIDER=efa everywhere.""",
           every=_efa, after=_stand_in("ddpfix_facts_fi_info", "fi_info", _fi_info), min_nodes=1),
    Fabric("fabric-nccl-version-mismatch",
           "synthetic InfiniBand on every node; node2's torch reports NCCL 2.18.1, the others 2.21.5",
           fabric_rules.NCCL_VERSION_MISMATCH.id,
           f"""Every node has two HDR InfiniBand rails. The lab's torch is a CPU build without NCCL, so the facts role
    asks a stand-in interpreter (host var ddpfix_facts_python) that prints the version torch.cuda.nccl.version() would:
    2.18.1 on node2, 2.21.5 elsewhere. Finding: {fabric_rules.NCCL_VERSION_MISMATCH.id} (cluster).""",
           after=_stand_in("ddpfix_facts_python", "python-nccl", _nccl_version)),
    Fabric("fabric-memlock-low",
           "synthetic InfiniBand on every node; on node2 a site limits.d file sets memlock 64 KiB for SSH logins",
           fabric_rules.MEMLOCK_LOW.id,
           f"""Every node has two HDR InfiniBand rails; node2's sshd uses PAM (UsePAM yes, as on a stock distribution)
    and /etc/security/limits.d/10-site-memlock.conf sets `soft memlock 64` (KiB) for * and root, so every SSH session
    there gets 64 KiB. Finding: {fabric_rules.MEMLOCK_LOW.id} on node2; ddpfix remediate --apply writes
    90-ddpfix-memlock.conf (a later file, so it wins) and new logins get the lab's ddp_memlock.""",
           after=_memlock_64k, min_nodes=1),
)


def _build(row: Fabric) -> Callable[[LabPlan], None]:
    """The scenario of one row: every node's trees (with the row's edits), then the row's `after`."""

    def apply(plan: LabPlan) -> None:
        victim = row.victim(plan)

        def edit(n: NodePlan, devs: list[Device], opts: dict[str, Any]) -> None:
            if row.every:
                row.every(n, devs, opts)
            if row.on_victim and n.name == victim.name:
                row.on_victim(n, devs, opts)

        fabric_everywhere(plan, row.kind, edit)
        if row.after:
            row.after(plan, victim)

    apply.__doc__ = row.doc
    apply.__name__ = apply.__qualname__ = "_" + row.name.replace("-", "_")
    return apply


for _row in FABRIC:
    scenario(_row.name, _row.summary, (_row.finding,), min_nodes=_row.min_nodes)(_build(_row))
