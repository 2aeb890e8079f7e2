"""The plan: per-node values ddpfix writes (env file, hosts block), derived from inventory + facts.

Pure functions; the same plan drives `env`, `remediate`, the audit's env.inconsistent check and the tests.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpfix import fabric as fab
from ddpfix.inventory import Cluster, Node

ENV_HEADER = "# Managed by ddpfix: rewritten by `ddpfix env --apply`; local edits are replaced.\n"
#: Keys that must be identical on every node.
CLUSTER_KEYS = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NPROC_PER_NODE", "WORLD_SIZE")


@dataclass(frozen=True)
class NodePlan:
    name: str
    rank: int
    hostname: str | None
    address: str | None  # cluster address
    ifname: str | None
    env: dict[str, str]
    comments: dict[str, str] = field(default_factory=dict)  # env key -> why it is there (written above it)


def effective_cidr(cluster: Cluster, facts: Mapping[str, Mapping[str, Any] | None]) -> str | None:
    """The inventory's ddp_cluster_cidr, else the on-link subnet of the master's address as the master sees it."""
    if cluster.cluster_cidr:
        return cluster.cluster_cidr
    mf = facts.get(cluster.master) or {}
    return ((mf.get("cluster") or {}).get("cidr")) or None


def cluster_address(node_facts: Mapping[str, Any] | None, cidr: str | None) -> str | None:
    if not node_facts:
        return None
    c = node_facts.get("cluster") or {}
    addr = c.get("address")
    if addr and cidr and ipaddress.ip_address(addr) in ipaddress.ip_network(cidr):
        return str(addr)
    return None


def interface_with_address(node_facts: Mapping[str, Any], address: str) -> str | None:
    for i in node_facts.get("interfaces") or []:
        for a in i.get("addrs") or []:
            if a.get("local") == address:
                return str(i.get("name"))
    return None


def plan_cluster(cluster: Cluster, facts: Mapping[str, Mapping[str, Any] | None]) -> dict[str, NodePlan]:
    """Per-node plan. Nodes without facts get a plan with address/ifname None (not writable)."""
    cidr = effective_cidr(cluster, facts)
    master_addr = cluster_address(facts.get(cluster.master), cidr)
    nnodes = len(cluster.nodes)
    gid_index = common_gid_index(cluster, facts)
    plans: dict[str, NodePlan] = {}
    for node in cluster.nodes:
        f = facts.get(node.name)
        addr = cluster_address(f, cidr)
        ifname = interface_with_address(f, addr) if (f and addr) else None
        env = {
            "MASTER_ADDR": master_addr or "",
            "MASTER_PORT": str(cluster.master_port),
            "NNODES": str(nnodes),
            "NODE_RANK": str(node.rank),
            "NPROC_PER_NODE": str(cluster.nproc_per_node),
            "WORLD_SIZE": str(nnodes * cluster.nproc_per_node),
        }
        if cluster.nproc_per_node == 1:
            env["RANK"] = str(node.rank)
        if ifname:
            env["GLOO_SOCKET_IFNAME"] = ifname
            env["NCCL_SOCKET_IFNAME"] = f"={ifname}"
            env["TP_SOCKET_IFNAME"] = ifname
        comments = fabric_env(node, f, gid_index, env)
        for k, v in node.env_extra:
            env[k] = v
            comments[k] = "ddp_env_extra (inventory)"
        plans[node.name] = NodePlan(
            name=node.name,
            rank=node.rank,
            hostname=(f or {}).get("hostname"),
            address=addr,
            ifname=ifname,
            env=env,
            comments=comments,
        )
    return plans


def common_gid_index(cluster: Cluster, facts: Mapping[str, Mapping[str, Any] | None]) -> tuple[int, str] | None:
    """(index, why) when NCCL_IB_GID_INDEX should be written cluster-wide: every RoCE node has its RoCE v2 IPv4 GID at
    the same index, that index is not NCCL's default, and some node's NCCL predates its automatic choice (2.21)."""
    idx: dict[str, int | None] = {}
    versions = []
    for n in cluster.nodes:
        f = facts.get(n.name)
        if not fab.has_rdma(f):
            continue
        i = fab.roce_v2_index(f, n.address)
        if i is not None or any(p.get("link_layer") == "Ethernet" for _, p in fab.data_rails(f, n.address)):
            idx[n.name] = i
            versions.append(fab.version_tuple(fab.fabric(f).get("nccl_version")))
    values = set(idx.values())
    if len(values) != 1 or None in values:
        return None
    (i,) = values
    if versions and all(v is not None and v[:2] >= fab.NCCL_AUTO_GID for v in versions):
        return None  # NCCL >= 2.21 finds the RoCE v2 GID itself
    if i == fab.NCCL_OLD_DEFAULT_GID:
        return None
    return i, (f"RoCE v2 IPv4 GID is index {i} on every node; NCCL before 2.21 uses index "
               f"{fab.NCCL_OLD_DEFAULT_GID} unless told")


def fabric_env(node: Node, f: Mapping[str, Any] | None, gid_index: tuple[int, str] | None,
               env: dict[str, str]) -> dict[str, str]:
    """Add the NCCL/libfabric keys the node's fabric needs to `env`; return key -> why for the env file's comments."""
    why: dict[str, str] = {}
    if node.nccl_ib_hca:
        env["NCCL_IB_HCA"] = node.nccl_ib_hca
        why["NCCL_IB_HCA"] = "ddp_nccl_ib_hca (inventory)"
    elif fab.has_rdma(f):
        rails = fab.data_rails(f, node.address)
        all_ports = [(d, p) for d, p in fab.ports(f) if not fab.is_efa(d)]
        if rails:
            env["NCCL_IB_HCA"] = "=" + ",".join(f"{d['name']}:{p['port']}" for d, p in rails)
            left = len(all_ports) - len(rails)
            why["NCCL_IB_HCA"] = ("the ACTIVE data-rail RDMA ports" +
                                  (f"; {left} port(s) left out (down, management NIC or far slower)" if left else ""))
    if node.nccl_ib_gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(node.nccl_ib_gid_index)
        why["NCCL_IB_GID_INDEX"] = "ddp_nccl_ib_gid_index (inventory)"
    elif gid_index is not None and fab.has_rdma(f):
        env["NCCL_IB_GID_INDEX"] = str(gid_index[0])
        why["NCCL_IB_GID_INDEX"] = gid_index[1]
    if f and (fab.fabric(f).get("efa") or {}).get("devices"):
        env["FI_PROVIDER"] = "efa"
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        why["FI_PROVIDER"] = "EFA devices: aws-ofi-nccl must use libfabric's efa provider, not fall back to sockets"
        why["FI_EFA_USE_DEVICE_RDMA"] = "EFA devices: GPUDirect RDMA over EFA"
    return why


def render_env(plan: NodePlan) -> str:
    lines = [ENV_HEADER.rstrip("\n"), f"# node {plan.name} (rank {plan.rank})"]
    for k, v in plan.env.items():
        if plan.comments.get(k):
            lines.append(f"# {k}: {plan.comments[k]}")
        lines.append(f"{k}={v}")
    return "\n".join(lines) + "\n"


def hosts_entries(plans: Mapping[str, NodePlan]) -> list[dict[str, Any]]:
    """The managed /etc/hosts block: every node's hostname (and inventory name) -> its cluster address, in rank order.

    A hostname two nodes share (cloned VMs) is left out: it cannot map to both. IP-literal inventory names too."""
    counts: dict[str, int] = {}
    for p in plans.values():
        if p.hostname:
            counts[p.hostname] = counts.get(p.hostname, 0) + 1
    entries = []
    for p in sorted(plans.values(), key=lambda x: x.rank):
        if not p.address:
            continue
        names: list[str] = []
        for n in (p.hostname, p.name):
            if not n or n in names or counts.get(n, 0) > 1 or _is_ip(n):
                continue
            names.append(n)
        if names:
            entries.append({"address": p.address, "names": names})
    return entries


def hosts_block(plans: Mapping[str, NodePlan]) -> str:
    """The block's body as text (address, then names), one line per node."""
    return "\n".join(f"{e['address']} {' '.join(e['names'])}" for e in hosts_entries(plans))


def _is_ip(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
        return True
    except ValueError:
        return False


def probe_ring(cluster: Cluster) -> list[str]:
    return [n.name for n in cluster.nodes]
