"""Findings and the rules that declare them, as plain data (Finding, Rule, Remedy, Severity).

The registry of every rule is ``ddpfix.rules.registry``; a finding is made with its ``finding()``, which attaches the
rule. Imports nothing of ddpfix.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    INFO = 1
    WARNING = 2
    ERROR = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


@dataclass(frozen=True)
class Remedy:
    """How `ddpfix remediate` fixes a finding: the role whose fix tasks carry the rule id as a tag, and the field
    of the per-host remediate plan (``ddpfix.remediate.HostPlan``) that turns the role on."""

    role: str  # roles/<role>
    plan: str  # HostPlan field: firewall | hosts | time | env | limits | pin_ifname
    how: str = ""  # README "auto-fixed" column, e.g. "env file"; empty: "yes"
    #: True: the fix is made on the node the finding's probe could not reach (probe.*), not on the finding's host
    on_target: bool = False
    #: The task groups that fix it, by the non-id tag they carry ("": the role's tasks that carry ids only): every
    #: task of the role, and every task of playbooks/remediate.yml, of one of these groups carries the rule id as a
    #: tag, generated (tools/tags.py, run by ``python -m tools.generate``).
    tags: tuple[str, ...] = ()


#: Where a rule's finding explains another finding (``Explains.where``):
#: "master": it is on the cluster's master (the consequence's `target` when there is no master);
#: "target": it is on the node the consequence's probe dialled (the consequence's `target` fix value);
#: "dialler": it is on the node whose probe dialled (the consequence's own node, when it names a `target`);
#: "host": it is on the consequence's own node (a rule explaining its own id: an earlier finding on that node);
#: "cluster": it is cluster-wide and the consequence is on a node;
#: "any": anywhere (the first such finding in report order).
WHERE = ("master", "target", "dialler", "host", "cluster", "any")
#: A rule's scope (``Rule.scope``): "node": this node's own state (``check --local`` reports it); "cluster": a
#: comparison between nodes, which one node cannot see; "idle": holds only while no job runs (the master port in use
#: while the job runs): neither says anything about a node's health in a prolog or health check.
SCOPES = ("node", "cluster", "idle")


@dataclass(frozen=True)
class Explains:
    """A rule's finding is the cause of the findings of rule `id` found `where` (see WHERE) relative to it."""

    id: str
    where: str


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    title: str  # what the check detects (one line: the README table's "detects" column)
    #: The fix, shown per finding. Every ``{name}`` is filled from the finding's fix values (``finding(..., name=...)``)
    #: with the real host, interface, port or CIDR; a test fails on an unfilled field.
    fix: str
    remedies: tuple[Remedy, ...] = ()  # empty: detect-only
    reads: frozenset[str] = frozenset()  # node fact sources (`unread[].source`) the check reads
    master_only: bool = False  # the check only looks at the master's facts
    #: still reported when a source it reads was not read (true on partial facts; otherwise withdrawn)
    sound_on_partial: bool = False
    manual: str = ""  # README "auto-fixed" column of a detect-only rule, e.g. "ddpfix only adds CIDR rules"
    still_open: str = ""  # remediate --apply: what to look at when the finding is still open after its fix ran
    scope: str = "node"  # see SCOPES
    #: the findings this rule's finding explains (the report shows it as their cause; ``ddpfix.causes``), in
    #: precedence order after the registry's: a consequence takes the first rule that explains it
    explains: tuple[Explains, ...] = ()
    #: a finding of this rule that no other finding explains means something the audit cannot see blocks the path
    #: (a cloud security group, a switch ACL, a host-external firewall)
    unseen_if_unexplained: bool = False

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"rule {self.id}: scope {self.scope!r} is not one of {', '.join(SCOPES)}")
        for e in self.explains:
            if e.where not in WHERE:
                raise ValueError(f"rule {self.id}: explains {e.id} where {e.where!r} is not one of {', '.join(WHERE)}")

    @property
    def fixable(self) -> bool:
        return bool(self.remedies)

    @property
    def auto_fixed(self) -> str:
        """The README table's "auto-fixed" cell."""
        if not self.remedies:
            return f"no ({self.manual})" if self.manual else "no"
        how = self.remedies[0].how
        if self.remedies[0].on_target:
            return f"via {how}" if how else "yes"
        return f"yes ({how})" if how else "yes"


@dataclass(frozen=True)
class Finding:
    id: str
    host: str | None  # None: the whole cluster
    message: str
    evidence: str
    fix_vars: tuple[tuple[str, str], ...] = ()
    caused_by: str | None = None  # key of the finding that explains this one (see ddpfix.causes)
    #: the registry's rule of `id` (set by ``ddpfix.rules.registry.finding``; not part of a finding's identity)
    rule: Rule = field(kw_only=True, compare=False, repr=False)

    @property
    def key(self) -> str:
        """`id@host` (`id@cluster` for cluster-wide findings): how causes refer to each other."""
        return f"{self.id}@{self.host or 'cluster'}"

    def var(self, name: str) -> str | None:
        return dict(self.fix_vars).get(name)

    @property
    def severity(self) -> Severity:
        return self.rule.severity

    @property
    def fix(self) -> str:
        values = dict(self.fix_vars)
        try:
            return self.rule.fix.format(**values)
        except KeyError:
            return self.rule.fix

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.label,
            "host": self.host,
            "message": self.message,
            "evidence": self.evidence,
            "fixable": self.rule.fixable,
            "fix": self.fix,
            "caused_by": self.caused_by,
        }


def sort_key(f: Finding) -> tuple[int, str, str, str]:
    return (-int(f.severity), f.host or "", f.id, f.message)


