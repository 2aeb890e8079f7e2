"""`ddpfix check --local`: the audit's checks on this node alone, with no SSH and no Ansible round trip.

The node's facts come from the ``ddpfix_node_facts`` module's own collector (loaded by path, run in-process); the
cluster view (nodes, ranks, addresses, hostnames, master, port, CIDR) from the cluster file that ``ddpfix env
--apply`` writes next to the env file. Peers appear in the `Context` with only what the file says about them
(hostname, cluster address), and this node's getaddrinfo answers for their hostnames stand in for the probe's, so
the audit's check functions run unchanged. Only findings about this node are kept.
"""

from __future__ import annotations

import socket
import time
import types
from collections.abc import Mapping
from typing import Any, cast

from ddpfix import collection
from ddpfix.checks import (
    Context,
    HostFacts,
    _from_placeholder,
    check_env,
    check_facts,
    check_firewall,
    check_hostnames,
    check_interfaces,
    check_master_addr,
    check_resolution,
    check_sysctls,
    check_time,
)
from ddpfix.findings import Finding, Severity, sort_key
from ddpfix.inventory import Cluster
from ddpfix.nodefacts import NodeFacts

#: The audit's checks that need only this node's facts and the cluster file (no probe connects, no peer's facts).
LOCAL_CHECKS = (check_facts, check_hostnames, check_resolution, check_firewall, check_time, check_interfaces,
                check_master_addr, check_sysctls, check_env)
#: Findings that say nothing about this node's health in a prolog or health check: the master port is in use
#: while the job runs; the others compare nodes, which one node cannot see.
NOT_LOCAL = frozenset({"probe.port-in-use", "time.skew", "netif.mtu-mismatch", "netif.name-mismatch",
                       "hosts.duplicate-hostname", "hosts.duplicate-machine-id", "addr.family-mismatch"})
#: A finding of at least this severity fails the check (NHC: the node is drained).
FAIL_AT = Severity.WARNING


def node_facts_module() -> types.ModuleType:
    """plugins/modules/ddpfix_node_facts.py, run in-process (its `main()` is not called)."""
    return collection.module("ddpfix_node_facts")


def collect_local(cluster: Cluster, doc: Mapping[str, Any], node: str | None) -> tuple[str, dict[str, Any]]:
    """(this node's name in the cluster file, its facts), read exactly as the audit's module reads them."""
    mod = node_facts_module()
    master = next((n for n in doc["nodes"] if n["name"] == cluster.master), None) or {}
    me = _which(doc, node)
    params: dict[str, Any] = {"cluster_cidr": cluster.cluster_cidr or "", "master_address": master.get("address") or cluster.master,
              "master_port": cluster.master_port, "is_master": me == cluster.master if me else False,
              "socket_ifname": (cluster.node(me).socket_ifname if me else None) or "", "env_path": cluster.env_path,
              "probe_listen": False, "listen_seconds": 0, "lock_path": "/run/ddpfix.lock", "run_id": "",
              # fabric facts as the facts role reads them by default (no torch NCCL query, no launcher units)
              "sysfs_root": "/sys", "dev_root": "/dev", "python": "", "launcher_units": [], "fi_info": ""}
    facts = mod.collect(params)  # is_master only matters for the probe listeners, which are not started here
    if me is None:
        me = _match(doc, facts)
    return me or "", facts


def _which(doc: Mapping[str, Any], node: str | None) -> str | None:
    if node is not None:
        return node
    host = socket.gethostname()
    for n in doc["nodes"]:
        if host in (n.get("hostname"), n["name"]):
            return str(n["name"])
    return None


def _match(doc: Mapping[str, Any], facts: Mapping[str, Any]) -> str | None:
    """This node in the file: the node whose cluster address is on one of this node's interfaces."""
    mine = {a.get("local") for i in facts.get("interfaces") or [] for a in i.get("addrs") or []}
    return next((str(n["name"]) for n in doc["nodes"] if n.get("address") in mine), None)


def local_context(cluster: Cluster, doc: Mapping[str, Any], me: str, facts: dict[str, Any]) -> Context:
    """A Context holding this node's facts and, for each peer, what the cluster file says (hostname, address)."""
    resolve = node_facts_module().resolve  # ddpfix_nodeinfo.resolve: getaddrinfo as Gloo and c10d call it
    hosts: dict[str, HostFacts] = {}
    peer_names: dict[str, list[str]] = {}
    for n in doc["nodes"]:
        name = str(n["name"])
        if name == me:
            continue
        hn = n.get("hostname")
        # a peer as the cluster file describes it (the facts that the checks read of a peer), not a full read
        peer = cast(NodeFacts, {"hostname": hn, "cluster": {"address": n.get("address")}, "interfaces": [],
                                "unread": []})
        hosts[name] = HostFacts(name, node=peer)
        if hn:
            peer_names[hn] = resolve(hn) or []
    hosts[me] = HostFacts(me, node=cast(NodeFacts, facts), probe={"resolve": peer_names}, collected_at=time.time())
    return Context(cluster=cluster, hosts=hosts)


def run_local(ctx: Context, me: str) -> list[Finding]:
    out: list[Finding] = []
    for check in LOCAL_CHECKS:
        out.extend(f for f in check(ctx) if f.host == me and f.id not in NOT_LOCAL and not _from_placeholder(ctx, f))
    skip = set(ctx.cluster.skip_findings)
    out = [f for f in out if f.id not in skip and f"{f.id}@{me}" not in skip]
    return sorted(dict.fromkeys(out), key=sort_key)


#: Failures here whatever their audit severity: with a cluster file on the node, a missing env file means the job's
#: launcher finds no values (the audit reports it as info: nothing has been written yet).
ALWAYS_FAIL = frozenset({"env.missing"})


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity >= FAIL_AT or f.id in ALWAYS_FAIL]
