"""Root causes: which findings follow from another finding, so reports can show the cause first.

Pure function over the findings of one audit. Every finding is kept; a consequence only gains `caused_by` (the key
`id@host` of its cause). The graph is the rules' own (``Rule.explains`` in ``ddpfix.rules``): a blocked master port
explains a failed probe to the master, a peer's firewall a failed probe to that peer, a route through a gateway on
the dialling node either; one node's first unresolvable peer the others there; a cluster-wide env difference each
node's; the cluster-wide interface-name mismatch a missing name; a node without synchronised time the skew.

A finding of a rule marked `unseen_if_unexplained` (the probes) that nothing explains stays a cause of its own, and
`unexplained()` says so: something the audit cannot see (a cloud security group, a switch ACL, a host-external
firewall) blocks the path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ddpfix.model.finding import Finding
from ddpfix.rules import registry


def _at(where: str, cause: Finding, f: Finding, master: str | None) -> bool:
    """Whether `cause` lies where its rule says it explains `f` (``ddpfix.model.finding.WHERE``)."""
    if where == "master":
        return cause.host == (master or f.var("target"))
    if where == "target":
        return f.var("target") is not None and cause.host == f.var("target")
    if where == "dialler":
        return cause.host == f.host and bool(f.var("target"))
    if where == "host":
        return cause.host == f.host
    if where == "cluster":
        return cause.host is None and f.host is not None
    return True  # any


def attribute_causes(findings: Iterable[Finding], master: str | None) -> list[Finding]:
    """The same findings, in the same order, each consequence with `caused_by` set: the first rule (in registry
    order) with a finding where it explains it; among rules that explain it from anywhere, the first such finding."""
    fl = list(findings)
    graph = registry.explained_by()
    by_id: dict[str, list[tuple[int, Finding]]] = {}
    for i, f in enumerate(fl):
        by_id.setdefault(f.id, []).append((i, f))
    out: list[Finding] = []
    for i, f in enumerate(fl):
        best: tuple[tuple[int, int], Finding] | None = None
        for rank, (cause_id, where) in enumerate(graph.get(f.id, ())):
            for j, c in by_id.get(cause_id, ()):
                if j == i or (cause_id == f.id and where == "host" and j > i):
                    continue  # a rule explaining its own id: only an earlier finding on that node
                if _at(where, c, f, master):
                    key = (0 if where == "any" else rank, j)
                    if best is None or key < best[0]:
                        best = (key, c)
                    break  # the first of this rule where it explains f
        out.append(replace(f, caused_by=best[1].key) if best else f)
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
    """A probe failure (a rule marked `unseen_if_unexplained`) with no finding on the hosts that explains it."""
    return f.rule.unseen_if_unexplained and not f.caused_by
