"""The types of a diagnosis: a known failure (`Pattern`, one row of the table in `diagnose.patterns`), a failure
named in a log (`Diagnosis`), and what the whole log says besides (`LogFacts`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ddpfix.diagnose.events import Event
from ddpfix.diagnose.hosts import HostFacts


@dataclass(frozen=True)
class Pattern:
    key: str
    title: str
    regexes: tuple[str, ...]
    meaning: str
    finding_ids: tuple[str, ...]
    advice: str
    #: one line the pattern names (README list, unit-tested)
    example: str = ""
    #: Keys of patterns this one explains: when both match, only this one is reported.
    explains: tuple[str, ...] = ()
    #: named only with a distributed-communication line near the match (see `_in_context`)
    needs_context: bool = False
    #: a regex that must match some line of the same log as well (e.g. the fall-back after `No device found`)
    also: str | None = None
    #: "all": explain and verify; "verify": only verify's own launch output (torch missing, no env file)
    scope: str = "all"
    #: a symptom any failure can show (a reset, a refusal): dropped when a specific failure is named too
    generic: bool = False
    #: named unless a download / HTTP / package-manager / web-server line stands near the match (`_foreign_near`)
    unless_foreign: bool = False
    #: the match's named groups `joined` and `world` must compare so: "fewer" (joined < world) or "more"
    joined: str = ""

    def compiled(self) -> list[re.Pattern[str]]:
        return [re.compile(r) for r in self.regexes]


@dataclass
class Diagnosis:
    pattern: Pattern
    line_no: int  # 1-based, first matching line
    line: str
    detail: tuple[str, ...]  # the regex's groups on the first match (an address, a port, an interface)
    count: int = 1  # matching lines
    found: list[dict[str, Any]] = field(default_factory=list)  # audit findings (with -i)
    notes: list[str] = field(default_factory=list)  # what the log says against the inventory (with -i)
    checks: tuple[str, ...] = ()  # the one or two of finding_ids that look at this log's cause (diagnose.narrow)
    why: str = ""  # what in the log points at them

    def to_json(self) -> dict[str, Any]:
        return {"key": self.pattern.key, "title": self.pattern.title, "line": self.line_no, "excerpt": self.line,
                "detail": list(self.detail), "count": self.count, "meaning": self.pattern.meaning,
                "finding_ids": list(self.pattern.finding_ids), "advice": self.pattern.advice,
                "findings": self.found, "inventory": self.notes, "checks": list(self.checks), "why": self.why}


@dataclass(frozen=True)
class LogFacts:
    """What the whole log says besides its failures: the ranks that printed lines, the NCCL versions."""

    ranks: tuple[int, ...] = ()
    nccl_versions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "nccl_versions": list(self.nccl_versions)}


@dataclass
class Explanation:
    """A log read as events: the causes named (table rows, in table order), the earliest failure that is a cause
    (a row's line, or the job's own failure: memory, data, code, which names no row), and the failures after it
    that any failure brings (the first `MAX_CONSEQUENCES` of `n_consequences`)."""

    diagnoses: list[Diagnosis]
    first: Event | None
    consequences: list[Event]
    n_consequences: int
    hosts: HostFacts = field(default_factory=HostFacts)

    @property
    def job_first(self) -> bool:
        return self.first is not None and self.first.kind == "job"

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first.to_json() if self.first else None, "job_first": self.job_first,
                "consequences": [e.to_json() for e in self.consequences], "n_consequences": self.n_consequences,
                "hosts": self.hosts.to_json()}
