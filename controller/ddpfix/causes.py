"""Root causes: which findings follow from another finding, so reports can show the cause first.

Pure function over the findings of one audit. Every finding is kept; a consequence only gains `caused_by` (the key
`id@host` of its cause). The rules are the network's own logic:

- a failed probe to the master follows from the master's firewall blocking the master port;
- a failed probe to a peer follows from that peer's firewall blocking its ephemeral range, else from a route
  through a gateway on the dialling node;
- on one node, every peer that does not resolve (or resolves wrongly) follows from the first such row (one hosts
  block missing or stale there);
- a node's env file differing from the plan follows from a cluster-wide env difference; an interface name missing
  on a node follows from the cluster-wide name mismatch;
- clock skew between nodes follows from a node without a synchronised time daemon.

A probe failure that nothing explains stays a cause of its own, and `unexplained()` says so: something the audit
cannot see (a cloud security group, a switch ACL, a host-external firewall) blocks the path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ddpfix.model.finding import Finding

PROBE_IDS = ("probe.master-port-unreachable", "probe.peer-unreachable")


def attribute_causes(findings: Iterable[Finding], master: str | None) -> list[Finding]:
    """The same findings, in the same order, each consequence with `caused_by` set."""
    fl = list(findings)
    index: dict[tuple[str, str | None], Finding] = {}
    for f in fl:
        index.setdefault((f.id, f.host), f)

    def first(id_: str, host: str | None) -> str | None:
        f = index.get((id_, host))
        return f.key if f else None

    first_of_kind_on_host: dict[tuple[str, str | None], str] = {}
    env_cluster = next((f.key for f in fl if f.id == "env.inconsistent" and f.host is None), None)
    name_mismatch = next((f.key for f in fl if f.id == "netif.name-mismatch"), None)
    time_cause = next((f.key for f in fl if f.id in ("time.no-daemon", "time.unsynchronized")), None)

    out: list[Finding] = []
    for f in fl:
        cause: str | None = None
        if f.id == "probe.master-port-unreachable":
            cause = (first("firewall.master-port-blocked", master or f.var("target"))
                     or first("route.via-gateway", f.host))
        elif f.id == "probe.peer-unreachable" and f.var("target"):
            cause = first("firewall.peer-ports-blocked", f.var("target")) or first("route.via-gateway", f.host)
        elif f.id in ("hosts.peer-unresolvable", "hosts.peer-mismatch"):
            k = (f.id, f.host)
            if k in first_of_kind_on_host:
                cause = first_of_kind_on_host[k]
            else:
                first_of_kind_on_host[k] = f.key
        elif f.id == "env.inconsistent" and f.host is not None:
            cause = env_cluster
        elif f.id == "netif.missing":
            cause = name_mismatch
        elif f.id == "time.skew":
            cause = time_cause
        out.append(replace(f, caused_by=cause) if cause else f)
    return out


def causes(findings: Iterable[Finding]) -> list[Finding]:
    """Findings that no other finding explains, in order."""
    return [f for f in findings if not f.caused_by]


def explained_by(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """cause key -> the findings it explains (the first peer row on a node shares its key with the rows it
    explains: they are the same kind on the same node)."""
    out: dict[str, list[Finding]] = {}
    for f in findings:
        if f.caused_by:
            out.setdefault(f.caused_by, []).append(f)
    return out


def unexplained(f: Finding) -> bool:
    """A probe failure with no finding on the hosts that explains it."""
    return f.id in PROBE_IDS and not f.caused_by
