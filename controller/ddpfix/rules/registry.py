"""The rule registry: every finding id, declared once, next to the check that reports it.

A check is a pure function over the audit `Context` that yields findings. It declares the rules it reports with
`@rules(Rule(...), ...)` right above it, in its area's module (``ddpfix.rules.firewall``, ``ddpfix.rules.hosts``, ...:
CHECK_MODULES); a finding is made with ``finding()``, which attaches its rule. Everything else reads this registry:
the report (severity, fixable, fix text), ``remediate --only`` (its allowed values), the remediate plan (which
findings turn on which role), the role tags (tested: every fix task carries its rule id as a tag), the "not
evaluated" bookkeeping (which fact sources a rule reads) and the docs' findings pages (tools/docs.py, ``python -m
tools.generate``; a unit test fails when stale). The plain types are ``ddpfix.model.finding``.

Adding a finding: see CONTRIBUTING.md.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpfix.model.finding import Explains, Finding, Remedy, Rule, Severity

if TYPE_CHECKING:
    from ddpfix.rules.context import Context

__all__ = ["RULES", "Explains", "Finding", "Remedy", "Rule", "Severity", "finding", "rules"]

#: The modules whose checks register rules, in report/README order.
CHECK_MODULES = tuple(f"ddpfix.rules.{area}" for area in (
    "reachability", "firewall", "probes", "hosts", "time", "netif", "net", "env", "fabric", "host"))


Check = Callable[["Context"], Iterable["Finding"]]


@dataclass(frozen=True)
class Registered:
    check: Check
    rules: tuple[Rule, ...]


_CHECKS: list[Registered] = []
_RULES: dict[str, Rule] = {}
_loaded = False


def rules(*declared: Rule) -> Callable[[Check], Check]:
    """Register a check with the rules (finding ids) it reports. A check may only report its own rules."""

    def deco(fn: Check) -> Check:
        for r in declared:
            if r.id in _RULES:
                raise ValueError(f"rule {r.id} declared twice")
            _RULES[r.id] = r
        _CHECKS.append(Registered(fn, declared))
        return fn

    return deco


def load() -> None:
    """Import every module that registers checks (once)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for m in CHECK_MODULES:
            importlib.import_module(m)


def _ordered() -> list[Registered]:
    """Registered checks in CHECK_MODULES order, then declaration order (whatever order the modules were imported)."""
    load()
    rank = {m: i for i, m in enumerate(CHECK_MODULES)}
    return sorted(_CHECKS, key=lambda r: rank.get(r.check.__module__, len(rank)))


class _Registry(Mapping[str, Rule]):
    """id -> Rule, in CHECK_MODULES then declaration order; loads the check modules on first use."""

    def __getitem__(self, key: str) -> Rule:
        load()
        return _RULES[key]

    def __iter__(self) -> Iterator[str]:
        return iter([r.id for reg in _ordered() for r in reg.rules])

    def __len__(self) -> int:
        load()
        return len(_RULES)


RULES: Mapping[str, Rule] = _Registry()


def registered() -> list[Registered]:
    """Every registered check with the rules it declares, in CHECK_MODULES then registration order."""
    return _ordered()


def checks() -> list[Check]:
    """Every registered check, in registration order."""
    return [r.check for r in _ordered()]


def fixable_ids() -> list[str]:
    """The finding ids `ddpfix remediate` can fix: the allowed values of ``--only``."""
    return [r.id for r in RULES.values() if r.fixable]


def fixed_by(plan: str, *, on_target: bool | None = None) -> frozenset[str]:
    """The ids whose remedy is the remediate plan field `plan` (optionally only those fixed on the probe's target)."""
    return frozenset(r.id for r in RULES.values() for m in r.remedies
                     if m.plan == plan and (on_target is None or m.on_target == on_target))


def area_ids(module: str) -> frozenset[str]:
    """The ids the checks of the rule module `module` (``ddpfix.rules.firewall``, ...) report."""
    return frozenset(r.id for reg in _ordered() if reg.check.__module__ == module for r in reg.rules)


def role_ids(role: str) -> frozenset[str]:
    """The ids a role fixes (the tags its fix tasks carry)."""
    return frozenset(r.id for r in RULES.values() for m in r.remedies if m.role == role)


def depends_on() -> dict[str, frozenset[str]]:
    return {r.id: r.reads for r in RULES.values() if r.reads}


def master_only() -> frozenset[str]:
    return frozenset(r.id for r in RULES.values() if r.master_only)


def sound_on_partial() -> frozenset[str]:
    return frozenset(r.id for r in RULES.values() if r.sound_on_partial)


def scoped(*scopes: str) -> frozenset[str]:
    """The ids of the rules of these scopes (see ``ddpfix.model.finding.SCOPES``)."""
    return frozenset(r.id for r in RULES.values() if r.scope in scopes)


def unseen_if_unexplained() -> frozenset[str]:
    """The ids whose unexplained finding means something the audit cannot see blocks the path (the probes)."""
    return frozenset(r.id for r in RULES.values() if r.unseen_if_unexplained)


def explained_by() -> dict[str, list[tuple[str, str]]]:
    """consequence id -> [(cause id, where)]: the causes graph the rules declare (``Rule.explains``), each
    consequence's causes in registry order (the first that matches is the cause)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for r in RULES.values():
        for e in r.explains:
            if e.id not in RULES:
                raise KeyError(f"rule {r.id} explains unknown finding id {e.id}")
            out.setdefault(e.id, []).append((r.id, e.where))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The findings table, as plain Markdown (docs/findings/index.md carries it with a link per id: tools/docs.py)."""
    lines = ["| id | severity | detects | auto-fixed |", "|---|---|---|---|"]
    lines += [f"| `{r.id}` | {r.severity.label} | {_cell(r.title)} | {_cell(r.auto_fixed)} |" for r in RULES.values()]
    return "\n".join(lines) + "\n"


def to_json() -> list[dict[str, Any]]:
    return [{"id": r.id, "severity": r.severity.label, "title": r.title, "fixable": r.fixable,
             "remedies": [{"role": m.role, "plan": m.plan} for m in r.remedies]} for r in RULES.values()]


def finding(id: str, host: str | None, message: str, evidence: str, **fix_vars: object) -> Finding:
    if id not in RULES:
        raise KeyError(f"unknown finding id {id}")
    return Finding(id, host, message, evidence, tuple(sorted((k, str(v)) for k, v in fix_vars.items())),
                   rule=RULES[id])


def main(argv: list[str] | None = None) -> int:
    # CLI start: argparse only for python -m ddpfix.rules
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ddpfix.rules", description="Print the rule registry.")
    ap.add_argument("--markdown", action="store_true", help="the findings table (Markdown)")
    args = ap.parse_args(argv)
    sys.stdout.write(markdown() if args.markdown else json.dumps(to_json(), indent=2) + "\n")
    return 0
