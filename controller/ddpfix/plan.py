"""The plan: per-node values ddpfix writes (env file, hosts block), derived from inventory + facts.

Pure functions; the same plan drives `env`, `remediate`, the audit's env.inconsistent check and the tests.
"""

from __future__ import annotations

import importlib.util
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any

from ddpfix import paths
from ddpfix.inventory import Cluster

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
        plans[node.name] = NodePlan(
            name=node.name,
            rank=node.rank,
            hostname=(f or {}).get("hostname"),
            address=addr,
            ifname=ifname,
            env=env,
        )
    return plans


@lru_cache(maxsize=1)
def envfile_lib() -> ModuleType:
    """The env file's managed-block functions (roles/ddpfix_env/module_utils/ddpfix_envfile.py), shared with the
    node modules that write and read the block."""
    path = paths.roles_dir() / "ddpfix_env" / "module_utils" / "ddpfix_envfile.py"
    spec = importlib.util.spec_from_file_location("ddpfix_envfile", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def env_comment(plan: NodePlan) -> str:
    return f"node {plan.name} (rank {plan.rank})"


def render_env(plan: NodePlan) -> str:
    """The env file ddpfix writes where none exists: its managed block alone (an existing file keeps its other lines)."""
    return "\n".join(envfile_lib().render_block(plan.env, env_comment(plan))) + "\n"


def env_write_needed(env_file: Mapping[str, Any], plan: NodePlan) -> bool:
    """Whether the node's env file (its facts) differs from the plan in ddpfix's part: the block's values, or a
    managed key also assigned outside the block (it would shadow or be shadowed by the block)."""
    if not env_file.get("exists") or env_file.get("owner") != "block":
        return True
    if dict(env_file.get("managed") or {}) != dict(plan.env):
        return True
    return bool(set(env_file.get("outside_keys") or ()) & set(plan.env))


def env_not_ours(env_file: Mapping[str, Any], adopt: bool) -> str | None:
    """Why ddpfix must not write this node's env file (an existing file it did not write, or one it cannot read)."""
    path = env_file.get("path")
    if env_file.get("exists") and not env_file.get("readable", True):
        return f"ddp_env_path {path} exists but cannot be read: {env_file.get('error') or 'not readable'}"
    lib = envfile_lib()
    if env_file.get("exists") and env_file.get("owner") == "foreign" and not lib.may_adopt(path, env_file.get("target"), adopt):
        return (f"ddp_env_path {path} exists and was not written by ddpfix (no '{lib.BEGIN}'): "
                "set ddp_env_adopt: true to add ddpfix's block to it (its other lines are kept), or choose another ddp_env_path")
    return None


def env_refusal(not_ours: Mapping[str, str]) -> str:
    """One line for the nodes whose env file ddpfix must not write ({node: reason}), nodes grouped by reason."""
    by_why: dict[str, list[str]] = {}
    for n, why in sorted(not_ours.items()):
        by_why.setdefault(why, []).append(n)
    return "; ".join(f"{', '.join(ns)}: {why}" for why, ns in by_why.items())


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
