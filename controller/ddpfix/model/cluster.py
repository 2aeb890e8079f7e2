"""The cluster as the inventory declares it: its nodes, ranks and the `ddp_*` settings, validated
(`ddpfix.inventory` builds it); plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_ENV_PATH = "/etc/ddpfix/ddp.env"
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Node:
    name: str  # inventory name
    address: str  # ansible_host (or the name)
    rank: int
    socket_ifname: str | None = None
    nccl_ib_hca: str | None = None  # ddp_nccl_ib_hca: overrides the derived NCCL_IB_HCA
    nccl_ib_gid_index: int | None = None  # ddp_nccl_ib_gid_index: overrides the derived NCCL_IB_GID_INDEX
    env_extra: tuple[tuple[str, str], ...] = ()  # ddp_env_extra: the user's own env file keys
    #: where the fixes write on this node, as the inventory sets it (`inventory.contract.WRITE_VARS`; checked against
    #: the roles' argument specs): what the remediation's plan reads (`remediate.writes`)
    role_vars: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[Node, ...]
    master: str
    master_port: int = DEFAULT_PORT
    cluster_cidr: str | None = None  # None: the subnet of the master's address (known after facts)
    nproc_per_node: int = 1
    env_path: str = DEFAULT_ENV_PATH
    env_adopt: bool = False  # add ddpfix's block to an existing env file ddpfix did not write
    env_process_vars: bool = False  # ddp_env_process_vars: also RANK/WORLD_SIZE/LOCAL_RANK (one process per node)
    #: ddp_env_scope: "cluster" (the env file holds the launch keys) or "node" (per-node keys only: a Slurm site's
    #: node-global file; each job step takes its launch keys from `ddpfix env --slurm --export`)
    env_scope: str = "cluster"
    job_port_range: str | None = None  # ddp_job_port_range "LO-HI": where a Slurm job's MASTER_PORT is taken from
    #: ddp_slurm_count_mismatch: the --slurm audit's allocation declares another node count than its list
    slurm_count_mismatch: str | None = None
    env_template: str | None = None  # ddp_env_template: a jinja2 file on the controller replacing the role's
    firewall: str = "auto"
    ntp_servers: tuple[str, ...] = ()
    ntp_local_master: bool = False
    #: ddp_hosts_domains: a node's hostname may be its inventory name's short form under one of these (or the reverse)
    hosts_domains: tuple[str, ...] = ()
    cidr_ack_broad: bool = False  # ddp_cluster_cidr_ack_broad: a public or broader-than-/16 CIDR is intended
    inventories: tuple[str, ...] = field(default=())
    skip_findings: tuple[str, ...] = ()  # ddp_skip_findings: accepted findings, `ID` or `ID@HOST`
    memlock_kib: int | None = None  # ddp_memlock: the locked-memory limit RDMA nodes need (None: unlimited)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str) -> Node:
        return self._index[name]

    @property
    def _index(self) -> dict[str, Node]:
        idx = self.__dict__.get("_node_index")
        if idx is None:
            idx = {n.name: n for n in self.nodes}
            object.__setattr__(self, "_node_index", idx)
        return idx

    @property
    def master_node(self) -> Node:
        return self.node(self.master)

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.nproc_per_node

    def play_view(self) -> dict[str, Any]:
        """What the audit play needs of the cluster (the result of its first task, ddpfix_cluster, which the CLI
        passes as `ddpfix_audit_cluster` when it has read the inventory itself)."""
        return {
            "master": self.master,
            "master_port": self.master_port,
            "cluster_cidr": self.cluster_cidr or "",
            "env_path": self.env_path,
            "order": self.names,
            "addresses": {n.name: n.address for n in self.nodes},
        }
