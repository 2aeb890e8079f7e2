"""`ddpfix explain`: name the known failure in a pasted torchrun / torch.distributed / Gloo / NCCL error log.

The patterns are data (`PATTERNS`, one row per failure). Each row names the finding ids whose checks look at the
cause, so `ddpfix explain -i INV` can run the audit and say which of those causes is present on the cluster.
Every pattern is tested on a real log excerpt recorded with torch 2.13 (tests/unit/fixtures/logs/).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pattern:
    key: str
    title: str
    regexes: tuple[str, ...]
    meaning: str
    finding_ids: tuple[str, ...]
    advice: str
    #: Keys of patterns this one explains: when both match, only this one is reported.
    explains: tuple[str, ...] = ()

    def compiled(self) -> list[re.Pattern[str]]:
        return [re.compile(r) for r in self.regexes]


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "loopback-advertised",
        "a rank advertised a loopback address to its peers",
        (r"remote=\[(127\.\d+\.\d+\.\d+|::1)\]", r"connect\(\) to (127\.\d+\.\d+\.\d+)",
         r"\((127\.0\.1\.1), \d+\)"),
        "Gloo (with no GLOO_SOCKET_IFNAME) binds the address its hostname resolves to. On Debian/Ubuntu the hostname "
        "is mapped to 127.0.1.1 in /etc/hosts, so peers dial loopback and reach themselves.",
        ("hosts.hostname-loopback", "netif.autoselect-wrong"),
        "Map every hostname to its cluster address and set GLOO_SOCKET_IFNAME per node: ddpfix remediate --apply "
        "writes the /etc/hosts block and the env files.",
        explains=("gloo-peer-connect",),
    ),
    Pattern(
        "socket-ifname-missing",
        "the socket interface named in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME does not exist here",
        (r"Unable to find address for: ?(\S+)", r"Bootstrap : no socket interface found",
         r"no NCCL_SOCKET_IFNAME interface found", r"NET/Socket : No usable listening interface",
         r"neither AF_INET\(2\) nor AF_INET6\(10\)"),
        "The interface name in the environment matches no interface with an address on this node: names differ "
        "between nodes (eth0 here, ens5 there) or the interface is down or has no address.",
        ("netif.missing", "netif.name-mismatch", "netif.down"),
        "Write per-node interface names into the env files: ddpfix env --apply (NCCL: NCCL_SOCKET_IFNAME==<if>, "
        "Gloo: GLOO_SOCKET_IFNAME=<if>).",
    ),
    Pattern(
        "address-in-use",
        "MASTER_PORT is already in use on the master",
        (r"EADDRINUSE", r"[Aa]ddress already in use"),
        "Another process (an earlier job, a stuck rank, or an outgoing socket when the port lies inside "
        "net.ipv4.ip_local_port_range) holds MASTER_PORT on the master.",
        ("probe.port-in-use", "net.master-port-ephemeral"),
        "Stop the process holding the port, or choose a ddp_master_port outside the ephemeral range.",
    ),
    Pattern(
        "master-unreachable",
        "a rank could not connect to MASTER_ADDR:MASTER_PORT",
        (r"trying to connect to \(([^,]+), (\d+)\)", r"failed to connect/validate to host ([^:\s]+):(\d+)",
         r"[Cc]onnection refused.*(?:TCPStore|MASTER_ADDR)"),
        "The TCP store on the master did not answer: a firewall drops or rejects MASTER_PORT, MASTER_ADDR is a "
        "public/NAT or wrong address, the route leaves through a gateway, or rank 0 is not running. torch 2.13 "
        "retries a refused connect until the timeout, so a refusal also reads as 'timed out'.",
        ("probe.master-port-unreachable", "firewall.master-port-blocked", "addr.master-not-private",
         "route.via-gateway", "host.unreachable"),
        "Open MASTER_PORT to the cluster network and use the master's private address: ddpfix remediate --apply.",
    ),
    Pattern(
        "gloo-peer-connect",
        "Gloo could not connect to a peer's ephemeral port",
        (r"connectFullMesh failed.*(?:Connection refused|timed out connecting|Connect timeout)",
         r"failed to connect, willRetry=0"),
        "After the store rendezvous, every pair of ranks connects directly on random ephemeral ports. A firewall on "
        "the peer (REJECT: 'Connection refused'; DROP: 'Connect timeout'), a route through a gateway, or an "
        "interface picked on the wrong network blocks those connections.",
        ("firewall.peer-ports-blocked", "probe.peer-unreachable", "route.via-gateway", "netif.autoselect-wrong"),
        "Trust the cluster's private CIDR in every node's firewall (ddpfix remediate --apply) and pin the socket "
        "interface (env files).",
    ),
    Pattern(
        "connection-reset",
        "a connection between ranks was reset or timed out during the job",
        (r"[Cc]onnection reset by peer", r"[Cc]onnection closed by peer", r"Socket Timeout",
         r"ECONNRESET"),
        "A peer process died (look for the first rank that failed), a firewall or conntrack table dropped an "
        "established connection, or the master's listen backlog overflowed at scale (net.core.somaxconn).",
        ("probe.peer-unreachable", "firewall.peer-ports-blocked", "net.somaxconn-low", "host.unreachable"),
        "Find the first failing rank in the logs; then audit the network between the nodes.",
    ),
    Pattern(
        "rendezvous-timeout",
        "not every node joined the rendezvous in time",
        (r"RendezvousTimeoutError", r"[Rr]endezvous (?:timed out|timeout)"),
        "The c10d/etcd rendezvous waited for --nnodes nodes and fewer joined: a node could not reach the rendezvous "
        "endpoint, resolved its name differently, was started with other --nnodes/--rdzv-id values, or its clock "
        "is off (elastic heartbeats compare wall clocks).",
        ("host.unreachable", "probe.master-port-unreachable", "hosts.peer-unresolvable", "hosts.peer-mismatch",
         "env.inconsistent", "time.skew"),
        "Start every node with the same values from the ddpfix env files (ddpfix env --apply) and audit the nodes.",
    ),
    Pattern(
        "ranks-missing",
        "some ranks never joined the process group (WORLD_SIZE or ranks disagree between nodes)",
        (r"DistStoreError: wait timeout after \d+ms, keys: /default_pg", r"[Ww]orld size .* does not match",
         r"rank \d+ (?:is )?(?:out of range|>= world_size)"),
        "init_process_group waits until WORLD_SIZE ranks have registered in the store. A node started with another "
        "WORLD_SIZE/RANK (hand-edited env files, a node missing from the list) leaves the others waiting.",
        ("env.inconsistent", "env.missing", "host.unreachable"),
        "Write consistent env files on every node: ddpfix env --apply (ranks and world size from one inventory).",
    ),
    Pattern(
        "nccl-ib",
        "an InfiniBand/RoCE transport error in NCCL",
        (r"NET/IB ?: .*(?:completion|error)", r"NCCL WARN NET/IB", r"ibv_\w+ failed"),
        "NCCL's IB transport failed: on RoCE most often a GID index that differs between nodes (completion error "
        "12), a memlock limit of 64 KB (ibv_create_cq: Cannot allocate memory), or a port that is down.",
        ("fabric.gid-index-differs", "fabric.roce-no-v2-gid", "fabric.pkey-mismatch", "fabric.port-down",
         "fabric.memlock-low", "fabric.link-layer-mixed", "fabric.no-uverbs"),
        "Run ddpfix audit: it compares GID indexes, P_Keys, link layers and port states across nodes and checks the "
        "memlock limit; ddpfix env --apply writes NCCL_IB_GID_INDEX only when one RoCE v2 index is common to all "
        "nodes, and remediate --apply lifts the memlock limit.",
    ),
    Pattern(
        "unresolvable-name",
        "a node name did not resolve",
        (r"Name or service not known", r"[Tt]emporary failure in name resolution", r"host not found",
         r"getaddrinfo.*failed"),
        "A peer or MASTER_ADDR name resolves on some nodes but not on others.",
        ("hosts.peer-unresolvable", "hosts.peer-mismatch"),
        "Use the same managed /etc/hosts block on every node (ddpfix remediate --apply) or IP literals.",
    ),
)

FALLBACK_ADVICE = ("No known failure recognised. Run the job with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL "
                   "and TORCH_CPP_LOG_LEVEL=INFO, and audit the nodes: ddpfix audit -i INV.")


@dataclass
class Diagnosis:
    pattern: Pattern
    line_no: int  # 1-based, first matching line
    line: str
    detail: tuple[str, ...]  # the regex's groups on the first match (an address, a port, an interface)
    count: int = 1  # matching lines
    found: list[dict[str, Any]] = field(default_factory=list)  # audit findings (with -i)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.pattern.key, "title": self.pattern.title, "line": self.line_no, "excerpt": self.line,
                "detail": list(self.detail), "count": self.count, "meaning": self.pattern.meaning,
                "finding_ids": list(self.pattern.finding_ids), "advice": self.pattern.advice,
                "findings": self.found}


_COMPILED = [(p, p.compiled()) for p in PATTERNS]


def diagnose(lines: Iterable[str]) -> list[Diagnosis]:
    """Every known failure in the log, in pattern order, each with its first matching line."""
    found: dict[str, Diagnosis] = {}
    for no, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        for pat, regexes in _COMPILED:
            for rx in regexes:
                m = rx.search(line)
                if not m:
                    continue
                d = found.get(pat.key)
                if d is None:
                    found[pat.key] = Diagnosis(pat, no, line.strip()[:300], tuple(g for g in m.groups() if g))
                else:
                    d.count += 1
                break
    explained = {k for d in found.values() for k in d.pattern.explains}
    return [found[p.key] for p in PATTERNS if p.key in found and p.key not in explained]


def finding_ids(diagnoses: Sequence[Diagnosis]) -> list[str]:
    out: list[str] = []
    for d in diagnoses:
        out += [i for i in d.pattern.finding_ids if i not in out]
    return out
