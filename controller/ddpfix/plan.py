"""The plan: per-node values ddpfix writes (env file, hosts block), derived from inventory + facts.

Pure functions; the same plan drives `env`, `remediate`, the audit's env-file check (``rules.env``) and the tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ddpfix import fabric as fab
from ddpfix import ifreach
from ddpfix.ansible import collection
from ddpfix.factguard.grammar import is_hostname, is_reserved_name
from ddpfix.model import net
from ddpfix.model.cluster import Cluster, Node

#: The launch keys (node_env's, before the socket interfaces): per job. With ddp_env_scope: node the env file holds
#: none of them (a Slurm job step gets them from `ddpfix env --slurm --export`).
LAUNCH_KEYS = frozenset({"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "RANK", "WORLD_SIZE",
                         "LOCAL_RANK", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR",
                         "PET_MASTER_PORT"})

#: Keys that must be identical on every node.
CLUSTER_KEYS = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NPROC_PER_NODE", "WORLD_SIZE", "PET_MASTER_ADDR",
                "PET_MASTER_PORT", "PET_NNODES", "PET_NPROC_PER_NODE")


@dataclass(frozen=True)
class NodePlan:
    name: str
    rank: int
    #: the node's hostname as it reports it, when the inventory vouches for it (`vouched_names`), else None: only
    #: such a name is written (hosts block, cluster file) or looked up for the node
    hostname: str | None
    address: str | None  # cluster address
    ifname: str | None
    env: dict[str, str]
    #: where `address` comes from: "facts" (the node was read) or "inventory" (not read: its ansible_host, in the CIDR)
    source: str | None = None
    comments: dict[str, str] = field(default_factory=dict)  # env key -> why it is there (in the block's comment)


def effective_cidr(cluster: Cluster, facts: Mapping[str, Mapping[str, Any] | None]) -> str | None:
    """The inventory's ddp_cluster_cidr, else the network the controller derives (`derive_cidr`)."""
    if cluster.cluster_cidr:
        return cluster.cluster_cidr
    return derive_cidr(cluster, facts)[0]


def derive_cidr(cluster: Cluster, facts: Mapping[str, Mapping[str, Any] | None]
                ) -> tuple[str | None, dict[str, tuple[str, str, str]]]:
    """Without ddp_cluster_cidr: (the cluster network, {node: (fact, value, why)} for each node whose claim of it,
    `cluster.cidr`, is wider). The controller decides, from what it knows: the inventory's addresses (ansible_host;
    a node named by a DNS name: its cluster address, and the master's address as most read nodes resolve its name)
    and the prefixes of the interfaces that hold them, as the read nodes report them. A node votes with the network
    of its interface holding its address when that network holds the master's address (it is on the master's link);
    the network is the narrowest voted one that holds the addresses of more than half of the voters. One node cannot
    widen it (a master saying /16 on a /24 cluster is outvoted) nor narrow it below the others' addresses. None when
    the master was not read or no majority agrees: then ddp_cluster_cidr must say."""
    if not facts.get(cluster.master):
        return None, {}
    master = net.ip(cluster.master_node.address, scoped=False) or _most_said(
        [f.get("master_ip") for f in facts.values() if f])
    votes: list[tuple[net.Address, net.Network]] = []
    for node in cluster.nodes:
        f = facts.get(node.name)
        addr = net.ip(node.address, scoped=False) or net.ip(((f or {}).get("cluster") or {}).get("address"))
        if master is not None and f and addr is not None and (p := _onlink(f, addr)) is not None and master in p:
            votes.append((addr, p))
    chosen = next((p for p in sorted({p for _, p in votes}, key=lambda p: -p.prefixlen)
                   if 2 * sum(a in p for a, _ in votes) > len(votes)), None)
    if chosen is None:
        return None, {}
    wide: dict[str, tuple[str, str, str]] = {}
    for node in cluster.nodes:
        claim = net.network(((facts.get(node.name) or {}).get("cluster") or {}).get("cidr"))
        if claim is not None and claim.version == chosen.version and claim.prefixlen < chosen.prefixlen \
                and chosen.subnet_of(claim):  # type: ignore[arg-type]
            wide[node.name] = ("cluster.cidr", str(claim), (
                f"wider than {chosen}, the cluster network the controller derives from the inventory's addresses "
                "and the nodes' interface prefixes; a node does not choose what is opened on every node (set "
                "ddp_cluster_cidr, or correct the prefix of the node's cluster interface)"))
    return str(chosen), wide


def _most_said(values: list[Any]) -> net.Address | None:
    """The address more than half of `values` are (the master's address as the read nodes resolve its name)."""
    addrs = [a for v in values if (a := net.ip(v, scoped=False)) is not None]
    top = Counter(addrs).most_common(1)
    return top[0][0] if top and 2 * top[0][1] > len(values) else None


def _onlink(f: Mapping[str, Any], addr: net.Address) -> net.Network | None:
    """The network of the node's interface address `addr` (its prefix as the node reports it), None when it holds
    none."""
    for i in f.get("interfaces") or []:
        for a in i.get("addrs") or []:
            if net.ip(a.get("local"), scoped=False) == addr and isinstance(a.get("prefixlen"), int):
                return net.network(f"{addr}/{a['prefixlen']}")
    return None


def cluster_address(node_facts: Mapping[str, Any] | None, cidr: str | None) -> str | None:
    if not node_facts:
        return None
    c = node_facts.get("cluster") or {}
    return _in_cidr(c.get("address"), cidr)


def _in_cidr(addr: Any, cidr: str | None) -> str | None:
    """`addr` when it is an address inside `cidr` (a network without host bits), else None."""
    inside = net.is_ip(addr) and net.in_network(addr, net.network(cidr, strict=True), scoped=False)
    return str(addr) if inside else None


def inventory_address(cluster: Cluster, name: str, cidr: str | None) -> str | None:
    """A node's address from the inventory alone: its ansible_host, when that is an IP inside the cluster CIDR."""
    return _in_cidr(cluster.node(name).address, cidr)


def vouched_names(cluster: Cluster, name: str) -> frozenset[str]:
    """The names (lower case) the inventory vouches for as node `name`'s own: its inventory name and, for each domain
    of ddp_hosts_domains, the inventory name's short form under it (`gpu7` for `gpu7.dc1.example`) or, for a
    one-label inventory name, the name under it (`gpu7.dc1.example` for `gpu7`). Nothing a node reports adds one."""
    n = name.lower()
    out = {n}
    for d in cluster.hosts_domains:
        if n.endswith("." + d) and len(n) > len(d) + 1:
            out.add(n[: -len(d) - 1])
        elif "." not in n:
            out.add(f"{n}.{d}")
    return frozenset(out)


def vouched_hostname(cluster: Cluster, name: str, hostname: Any) -> str | None:
    """`hostname` (what node `name` reports) when the inventory vouches for it (`vouched_names`), else None: a node
    names only itself."""
    if isinstance(hostname, str) and hostname and hostname.lower() in vouched_names(cluster, name):
        return hostname
    return None


def cluster_nic(node_facts: Mapping[str, Any], *, address: str | None = None, cidr: str | None = None) -> str | None:
    """The one rule for a node's cluster NIC, from its facts: the interface that holds `address` (its cluster
    address), else, given `cidr`, the first interface (in the facts' order) with an IPv4 address inside it (the rule
    `ddpfix_node_facts` applies on the node, `cluster_interface`). None when there is no such interface."""
    within = net.network(cidr) if cidr else None
    for i in node_facts.get("interfaces") or []:
        for a in i.get("addrs") or []:
            if address is not None and a.get("local") == address:
                return str(i.get("name"))
            if (address is None and within is not None and a.get("family") == "inet"
                    and net.in_network(str(a.get("local")), within)):
                return str(i.get("name"))
    return None


def node_env(master_addr: str, master_port: int, nnodes: int, rank: int, nproc: int, ifname: str | None, *,
             process_vars: bool = False) -> dict[str, str]:
    """The launch keys of one node's env file (before the fabric keys and ddp_env_extra): rendezvous, ranks, torchrun's
    own names and, when the cluster NIC is known, the socket interface of Gloo, NCCL and TensorPipe."""
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "NNODES": str(nnodes),
        "NODE_RANK": str(rank),
        "NPROC_PER_NODE": str(nproc),
        **torchrun_env(master_addr, master_port, nnodes, rank, nproc),
    }
    if process_vars:  # one process per node, started without torchrun
        env.update(RANK=str(rank), WORLD_SIZE=str(nnodes), LOCAL_RANK="0")
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
        env["NCCL_SOCKET_IFNAME"] = f"={ifname}"
        env["TP_SOCKET_IFNAME"] = ifname
    return env


def torchrun_env(master_addr: str, port: int, nnodes: int, rank: int, nproc: int) -> dict[str, str]:
    """torchrun's own environment names (torch/distributed/argparse_util.py `env`: PET_<OPTION>), so that a bare
    `torchrun train.py` in a shell that sourced the file gets the same values as the flags would give."""
    return {"PET_NNODES": str(nnodes), "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": str(nproc),
            "PET_MASTER_ADDR": master_addr, "PET_MASTER_PORT": str(port)}


def socket_nic(node: Node, f: Mapping[str, Any] | None, addr: str | None, cidr: str | None,
               reach: Mapping[str, Mapping[str, Any]] | None,
               decided: str | None = None) -> tuple[str | None, str | None, str]:
    """(cluster address, socket interface, why) of a node that was read, with its cluster address `addr`: the
    interface holding `addr` (the current rule), unless the interface reach probe decided for another candidate that
    reached every probed peer (`ifreach.choose`) or, without reach evidence, `decided` names one (check --local: the
    interface the audit chose, from the cluster file); the address is then that interface's in the cluster network.
    An inventory ddp_socket_ifname is the operator's choice and stays (the audit's ``rules.netif`` says when it
    cannot reach the peers).
    `why` is the env file's comment on the choice ('' when the evidence decided nothing)."""
    ifname = cluster_nic(f, address=addr) if (f and addr) else None
    if not f or not addr or node.socket_ifname:
        return addr, ifname, ""
    pick, why = decided, ""
    if reach:
        order = [str(i.get("name")) for i in sorted(f.get("interfaces") or [], key=lambda i: i.get("index") or 0)]
        picked = ifreach.choose(reach, ifname, lambda a: _in_cidr(a, cidr) is not None, order)
        if picked is not None:
            pick, why = picked
    if not pick or pick == ifname:
        return addr, ifname, why
    new = _cidr_address(f, pick, cidr)
    return (new, pick, why) if new else (addr, ifname, "")


def _cidr_address(f: Mapping[str, Any], ifname: str, cidr: str | None) -> str | None:
    """The first address of interface `ifname` (in the node's facts) inside the cluster network."""
    for i in f.get("interfaces") or []:
        if i.get("name") == ifname:
            for a in i.get("addrs") or []:
                if a.get("family") == "inet" and (got := _in_cidr(a.get("local"), cidr)):
                    return got
    return None


def plan_cluster(cluster: Cluster, facts: Mapping[str, Mapping[str, Any] | None],
                 reach: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
                 decided: Mapping[str, str] | None = None) -> dict[str, NodePlan]:
    """Per-node plan for the WHOLE inventory, whatever subset was read (--limit, unreachable nodes).

    Ranks, NNODES and WORLD_SIZE come from the inventory alone (RANK/WORLD_SIZE/LOCAL_RANK are written only with
    ddp_env_process_vars). A node that was read gives its address
    (and interface) from its facts; a node that was not read falls back to its inventory ansible_host when that
    is an IP inside the cluster CIDR (`source="inventory"`), else its address is None (not writable, and the
    writes that need it are refused). `facts` must be sanitized (`sanitize_facts`); `reach` ({node: probe.reach},
    validated) lets a node's socket interface be the candidate that reached every peer, `decided` ({node: ifname})
    names the one chosen before, where no reach evidence is at hand (`socket_nic`)."""
    cidr = effective_cidr(cluster, facts)
    reach = reach or {}
    nics: dict[str, tuple[str | None, str | None, str]] = {}
    for node in cluster.nodes:
        f = facts.get(node.name)
        addr = cluster_address(f, cidr) if f else inventory_address(cluster, node.name, cidr)
        nics[node.name] = socket_nic(node, f, addr, cidr, reach.get(node.name), (decided or {}).get(node.name))
    master_addr = nics[cluster.master][0] if cluster.master in nics else None  # the master is one of the nodes
    nnodes = len(cluster.nodes)
    gid_index = common_gid_index(cluster, facts)
    plans: dict[str, NodePlan] = {}
    for node in cluster.nodes:
        f = facts.get(node.name)
        addr, ifname, why = nics[node.name]
        source = ("facts" if f else "inventory") if addr else None
        env = node_env(master_addr or "", cluster.master_port, nnodes, node.rank, cluster.nproc_per_node, ifname,
                       process_vars=cluster.env_process_vars)
        if cluster.env_scope == "node":
            env = {k: v for k, v in env.items() if k not in LAUNCH_KEYS}
        comments = fabric_env(node, f, gid_index, env)
        if why and "GLOO_SOCKET_IFNAME" in env:
            comments["GLOO_SOCKET_IFNAME"] = why
        for k, v in node.env_extra:
            env[k] = v
            comments[k] = "ddp_env_extra (inventory)"
        plans[node.name] = NodePlan(
            name=node.name,
            rank=node.rank,
            hostname=vouched_hostname(cluster, node.name, (f or {}).get("hostname")),
            address=addr,
            ifname=ifname,
            env=env,
            source=source,
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
    if len(values) != 1:
        return None
    (i,) = values
    if i is None:
        return None
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


def envfile_lib() -> ModuleType:
    """The env file's managed-block functions (plugins/module_utils/ddpfix_envfile.py), shared with the node
    modules that write and read the block."""
    return collection.module_utils("ddpfix_envfile")


def managed_block(text: str) -> str:
    """The lines of ddpfix's managed block in a file's `text` (the markers that the env file's and /etc/hosts'
    blocks share, defined once in the envfile module_utils), '' when the file has none."""
    lib = envfile_lib()
    return str(lib.managed_text(text)) if lib.ownership(text) == "block" else ""


def env_comment(plan: NodePlan) -> str:
    return f"node {plan.name} (rank {plan.rank})"


def render_env(plan: NodePlan) -> str:
    """The env file ddpfix writes where none exists: its managed block alone (an existing file keeps its other
    lines)."""
    return "\n".join(envfile_lib().render_block(plan.env, env_comment(plan), plan.comments)) + "\n"


@dataclass(frozen=True)
class EnvJudgement:
    """A node's env file against the block ddpfix would write (`judge_env`, the one judge of both questions)."""

    #: (key, the node's value as shown, the wanted value as shown) for each key the block sets to a non-empty value
    #: whose value, as the whole file leaves it, is another (the audit's env-file finding: what a process reading it
    #: gets)
    differs: tuple[tuple[str, str, str], ...]
    #: ddpfix's part must be (re)written: no file or no block of ours, the block's keys or values are not the plan's,
    #: or a managed key is also assigned outside the block (it would shadow or be shadowed by the block)
    write: bool


def judge_env(env_file: Mapping[str, Any], plan: NodePlan) -> EnvJudgement:
    """Whether the node's env file (its facts) differs from `plan` (whose `env` is the block's KEY=VALUE lines: the
    template's, `envtemplate.judge`, when ddp_env_template is set): the audit's env-file check (``rules.env``), the
    remediation's env write and verify's env file check all read this judgement."""
    differs = tuple(env_differs(env_file, {k: v for k, v in plan.env.items() if v}))
    if not env_file.get("exists") or env_file.get("owner") != "block":
        return EnvJudgement(differs, True)
    managed = dict(env_file.get("managed") or {})
    write = (set(managed) != set(plan.env) or bool(list(env_differs(env_file, plan.env, scope="managed")))
             or bool(set(env_file.get("outside_keys") or ()) & set(plan.env)))
    return EnvJudgement(differs, write)


def env_write_needed(env_file: Mapping[str, Any], plan: NodePlan) -> bool:
    """`judge_env(...).write`: ddpfix's part of the node's env file differs from the plan."""
    return judge_env(env_file, plan).write


def is_secret(key: str, value: str | None = None) -> bool:
    """Whether an env key (and its value) looks secret: the envfile module_utils' `is_secret`, the one definition."""
    return bool(envfile_lib().is_secret(key, value))


def redact_env(text: str) -> str:
    """An env file's (or a diff's) text with secret-looking values replaced by ***."""
    return str(envfile_lib().redact(text))


def env_differs(env_file: Mapping[str, Any], want: Mapping[str, str], *,
                scope: str = "values") -> Iterator[tuple[str, str, str]]:
    """(key, the node's value as shown, the wanted value as shown) for each key of `want` whose value in the node's
    env file (`scope`: "values", every key as the file leaves it, or "managed", the block's) is not the wanted one.

    A secret-looking wanted value is compared by digest (the node returns `***` and an HMAC of its value under a
    salt of its own), never as `***` against the real value, and is shown as `***` on both sides."""
    got: Mapping[str, str] = env_file.get(scope) or {}
    secrets = env_file.get("secrets")
    secrets = secrets if isinstance(secrets, Mapping) else {}
    digests = secrets.get(scope)
    digests = digests if isinstance(digests, Mapping) else {}
    lib = envfile_lib()
    for k, v in want.items():
        if k not in got:
            yield k, "<unset>", lib.REDACTED if is_secret(k, v) else v
        elif is_secret(k, v) or got[k] == lib.REDACTED:
            if not (is_secret(k, v) and lib.same_secret(secrets.get("salt"), digests.get(k), v)):
                yield k, lib.REDACTED if got[k] == lib.REDACTED else got[k], lib.REDACTED if is_secret(k, v) else v
        elif got[k] != v:
            yield k, got[k], v


def env_not_ours(env_file: Mapping[str, Any], adopt: bool) -> str | None:
    """Why ddpfix must not write this node's env file (an existing file it did not write, or one it cannot read)."""
    path = env_file.get("path")
    if env_file.get("exists") and not env_file.get("readable", True):
        return f"ddp_env_path {path} exists but cannot be read: {env_file.get('error') or 'not readable'}"
    lib = envfile_lib()
    if (
        env_file.get("exists")
        and env_file.get("owner") == "foreign"
        and not lib.may_adopt(path, env_file.get("target"), adopt)
    ):
        return (
            f"ddp_env_path {path} exists and was not written by ddpfix (no '{lib.BEGIN}'): "
            "set ddp_env_adopt: true to add ddpfix's block to it (its other lines are kept), "
            "or choose another ddp_env_path"
        )
    return None


def env_refusal(not_ours: Mapping[str, str]) -> str:
    """One line for the nodes whose env file ddpfix must not write ({node: reason}), nodes grouped by reason."""
    by_why: dict[str, list[str]] = {}
    for n, why in sorted(not_ours.items()):
        by_why.setdefault(why, []).append(n)
    return "; ".join(f"{', '.join(ns)}: {why}" for why, ns in by_why.items())


def hosts_entries(plans: Mapping[str, NodePlan]) -> list[dict[str, Any]]:
    """The managed /etc/hosts block: each node's names -> its cluster address, in rank order.

    A node's names are the ones the inventory vouches for and nothing else: its hostname when that is its inventory
    name or, under ddp_hosts_domains, the inventory name's short form (`NodePlan.hostname`), and its inventory name.
    A node that was not read has its inventory name only. A name two nodes would share (cloned VMs) is left out: it
    cannot map to both. So are IP-literal inventory names, invalid names and the reserved loopback names (localhost,
    ip6-*)."""
    def candidates(p: NodePlan) -> list[str]:  # the hostname first (the canonical name), then the inventory name
        return [p.hostname, p.name] if p.hostname and p.hostname.lower() != p.name.lower() else [p.hostname or p.name]

    counts: dict[str, int] = {}
    for p in plans.values():
        for n in candidates(p):
            counts[n.lower()] = counts.get(n.lower(), 0) + 1
    entries = []
    for p in sorted(plans.values(), key=lambda x: x.rank):
        if not p.address:
            continue
        names = [n for n in candidates(p) if counts[n.lower()] == 1 and not net.is_ip(n, scoped=False)
                 and is_hostname(n) and not is_reserved_name(n)]
        if names:
            entries.append({"address": p.address, "names": names})
    return entries


def hosts_block(plans: Mapping[str, NodePlan]) -> str:
    """The block's body as text (address, then names), one line per node."""
    return "\n".join(f"{e['address']} {' '.join(e['names'])}" for e in hosts_entries(plans))


