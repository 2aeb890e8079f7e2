"""Findings: what a check reports. Ids, severities, fixability and fix texts are declared in the rule registry
(``ddpfix.rules``), next to each check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddpfix.rules import RULES, Rule, Severity

__all__ = ["RULES", "Finding", "Rule", "Severity", "finding", "sort_key"]


@dataclass(frozen=True)
class Finding:
    id: str
    host: str | None  # None: the whole cluster
    message: str
    evidence: str
    fix_vars: tuple[tuple[str, str], ...] = ()
    caused_by: str | None = None  # key of the finding that explains this one (see ddpfix.causes)

    @property
    def key(self) -> str:
        """`id@host` (`id@cluster` for cluster-wide findings): how causes refer to each other."""
        return f"{self.id}@{self.host or 'cluster'}"

    def var(self, name: str) -> str | None:
        return dict(self.fix_vars).get(name)

    @property
    def rule(self) -> Rule:
        return RULES[self.id]

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


def finding(id: str, host: str | None, message: str, evidence: str, **fix_vars: object) -> Finding:
    if id not in RULES:
        raise KeyError(f"unknown finding id {id}")
    return Finding(id, host, message, evidence, tuple(sorted((k, str(v)) for k, v in fix_vars.items())))


def sort_key(f: Finding) -> tuple[int, str, str, str]:
    return (-int(f.severity), f.host or "", f.id, f.message)


