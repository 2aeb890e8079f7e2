"""`ddpfix check --local`: the audit's checks on this node alone, with no SSH and no Ansible round trip.

The node's facts come from the ``ddpfix_node_facts`` module's own collector (loaded by path, run in-process); the
cluster view (nodes, ranks, addresses, hostnames, master, port, CIDR) from the cluster file that ``ddpfix env
--apply`` writes next to the env file. Peers appear in the `Context` with only what the file says about them
(hostname, cluster address), and this node's getaddrinfo answers for their hostnames stand in for the probe's, so
the audit's check functions run unchanged. Only findings about this node are kept.
"""

from __future__ import annotations

import socket
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from ddpfix.ansible import collection
from ddpfix.model.cluster import Cluster
from ddpfix.model.facts import NodeFacts
from ddpfix.model.finding import Finding, Severity, sort_key
from ddpfix.rules import env as env_rules
from ddpfix.rules import registry
from ddpfix.rules.context import Context, HostFacts
from ddpfix.rules.engine import from_placeholder as _from_placeholder
from ddpfix.rules.env import check_env
from ddpfix.rules.firewall import check_firewall
from ddpfix.rules.hosts import check_claims, check_hostnames, check_resolution
from ddpfix.rules.net import check_master_addr, check_sysctls
from ddpfix.rules.netif import check_interfaces
from ddpfix.rules.reachability import check_facts
from ddpfix.rules.time import check_time

#: The audit's checks that need only this node's facts and the cluster file (no probe connects, no peer's facts).
LOCAL_CHECKS = (check_facts, check_hostnames, check_claims, check_resolution, check_firewall, check_time,
                check_interfaces, check_master_addr, check_sysctls, check_env)
#: Findings that say nothing about this node's health in a prolog or health check: the master port is in use
#: while the job runs; the others compare nodes, which one node cannot see.
NOT_LOCAL = registry.scoped("cluster", "idle")  # the rules' scope (ddpfix.model.finding.SCOPES)
#: A finding of at least this severity fails the check (NHC: the node is drained).
FAIL_AT = Severity.WARNING
#: The whole check's deadline by default (`--timeout`), seconds: reading this node, resolving every peer, the checks.
DEFAULT_TIMEOUT = 10.0
#: The longest one peer lookup may take (getaddrinfo has no timeout of its own): a slower answer is undecided.
LOOKUP_TIMEOUT = 3.0
#: Peer lookups running at once (daemon threads; one stuck past LOOKUP_TIMEOUT is replaced, up to 4x this many).
LOOKUP_WORKERS = 32

T = TypeVar("T")


class Deadline:
    """A total time budget, on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


def within(fn: Callable[[], T], deadline: Deadline) -> tuple[bool, T | None]:
    """(True, fn()) when `fn` returns before the deadline; (False, None) when it does not. It runs in a daemon
    thread that is left behind (a blocked getaddrinfo cannot be cancelled; it never holds the process's exit).
    An exception of `fn` is raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=run, name="ddpfix-check-local", daemon=True)
    t.start()
    t.join(deadline.left())
    if t.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("value")


def resolve_all(names: Sequence[str], resolve: Callable[[str], list[str]], deadline: Deadline, *,
                per_lookup: float = LOOKUP_TIMEOUT, workers: int = LOOKUP_WORKERS,
                ) -> tuple[dict[str, list[str]], list[str]]:
    """(answers, undecided): each name's addresses, looked up in parallel in daemon threads. A lookup that took longer
    than `per_lookup`, or had not answered by the deadline, is undecided: never 'does not resolve', never a pass."""
    names = list(dict.fromkeys(names))
    lock = threading.Lock()
    todo = list(reversed(names))
    running: dict[str, float] = {}  # name -> when its lookup started
    done: dict[str, list[str]] = {}
    late: set[str] = set()
    replaced: set[str] = set()
    threads = 0

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop()
                running[name] = t0 = time.monotonic()
            try:
                addrs = list(resolve(name) or [])
            except Exception:  # noqa: BLE001 - resolve() answers [] for an unresolvable name; anything else: undecided
                addrs = None
            with lock:
                running.pop(name, None)
                if addrs is not None and time.monotonic() - t0 <= per_lookup:
                    done[name] = addrs
                else:
                    late.add(name)

    def spawn() -> None:
        nonlocal threads
        threads += 1
        threading.Thread(target=work, name="ddpfix-resolve", daemon=True).start()

    with lock:
        for _ in range(min(workers, len(names))):
            spawn()
    while deadline.left() > 0:
        now = time.monotonic()
        with lock:
            if len(done) + len(late) >= len(names):
                break
            for name, t0 in list(running.items()):
                if now - t0 > per_lookup and name not in replaced:
                    replaced.add(name)  # this lookup is undecided already: its thread is stuck, start another
                    late.add(name)
                    if todo and threads < 4 * workers:
                        spawn()
        time.sleep(min(0.02, deadline.left()))
    with lock:
        answers = {n: list(done[n]) for n in names if n in done}
    return answers, [n for n in names if n not in answers]


def node_facts_module() -> types.ModuleType:
    """plugins/modules/ddpfix_node_facts.py, run in-process (its `main()` is not called)."""
    return collection.module("ddpfix_node_facts")


def collect_local(cluster: Cluster, doc: Mapping[str, Any], node: str | None) -> tuple[str, dict[str, Any]]:
    """(this node's name in the cluster file, its facts), read exactly as the audit's module reads them."""
    mod = node_facts_module()
    master = next((n for n in doc["nodes"] if n["name"] == cluster.master), None) or {}
    me = _which(doc, node)
    params: dict[str, Any] = {
        "cluster_cidr": cluster.cluster_cidr or "",
        "master_address": master.get("address") or cluster.master,
        "master_port": cluster.master_port,
        "is_master": me == cluster.master if me else False,
        "socket_ifname": (cluster.node(me).socket_ifname if me else None) or "",
        "env_path": cluster.env_path,
        "probe": None,
        "lock_path": "/run/ddpfix.lock",
        "run_id": "",
        # fabric facts as the facts role reads them by default (no torch NCCL query, no launcher units)
        "sysfs_root": "/sys",
        "dev_root": "/dev",
        "python": "",
        "launcher_units": [],
        "fi_info": "",
    }
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


def peer_hostnames(doc: Mapping[str, Any], me: str) -> list[str]:
    """The hostnames of this node's peers, as the cluster file lists them (the names the checks resolve)."""
    return [str(n["hostname"]) for n in doc["nodes"] if str(n["name"]) != me and n.get("hostname")]


def resolve_peers(doc: Mapping[str, Any], me: str, deadline: Deadline) -> tuple[dict[str, list[str]], list[str]]:
    """(answers, undecided) for the peers' hostnames, resolved as the facts module resolves (getaddrinfo as Gloo and
    c10d call it: ddpfix_nodeinfo.resolve), in parallel, under the deadline."""
    return resolve_all(peer_hostnames(doc, me), node_facts_module().resolve, deadline)


def local_context(cluster: Cluster, doc: Mapping[str, Any], me: str, facts: dict[str, Any],
                  answers: Mapping[str, list[str]] | None = None) -> Context:
    """A Context holding this node's facts and, for each peer, what the cluster file says (hostname, address).
    `answers`: the peers' hostnames resolved on this node (None: resolved here, under the default deadline); a name
    missing from it was not decided and is left out (no finding about it, never a pass)."""
    if answers is None:
        answers = resolve_peers(doc, me, Deadline(DEFAULT_TIMEOUT))[0]
    hosts: dict[str, HostFacts] = {}
    peer_names: dict[str, list[str]] = {}
    for n in doc["nodes"]:
        name = str(n["name"])
        if name == me:
            continue
        hn = n.get("hostname")
        # a peer as the cluster file describes it (the facts that the checks read of a peer), not a full read
        peer = cast(
            NodeFacts, {"hostname": hn, "cluster": {"address": n.get("address")}, "interfaces": [], "unread": []}
        )
        hosts[name] = HostFacts(name, node=peer)
        if hn and hn in answers:
            peer_names[hn] = list(answers[hn])
    hosts[me] = HostFacts(me, node=cast(NodeFacts, facts), probe={"resolve": peer_names}, collected_at=time.time())
    # the socket interface the audit chose (the interface reach probe, which check --local does not run)
    chosen = {str(n["name"]): str(n["ifname"]) for n in doc["nodes"] if n["name"] == me and n.get("ifname")}
    return Context(cluster=cluster, hosts=hosts, ifnames=chosen)


def run_local(ctx: Context, me: str) -> list[Finding]:
    out: list[Finding] = []
    for check in LOCAL_CHECKS:
        out.extend(f for f in check(ctx) if f.host == me and f.id not in NOT_LOCAL and not _from_placeholder(ctx, f))
    skip = set(ctx.cluster.skip_findings)
    out = [f for f in out if f.id not in skip and f"{f.id}@{me}" not in skip]
    return sorted(dict.fromkeys(out), key=sort_key)


#: Failures here whatever their audit severity: with a cluster file on the node, a missing env file means the job's
#: launcher finds no values (the audit reports it as info: nothing has been written yet).
ALWAYS_FAIL = frozenset({env_rules.MISSING.id})


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity >= FAIL_AT or f.id in ALWAYS_FAIL]
