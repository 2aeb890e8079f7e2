"""Run every registered check over one audit `Context`, and say per host which checks could not be evaluated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ddpfix import ifreach
from ddpfix.model.finding import Finding, sort_key
from ddpfix.rules import registry
from ddpfix.rules.context import Context
from ddpfix.rules.firewall import UNDECIDED_IDS
from ddpfix.rules.netif import REACH_RULE
from ddpfix.rules.probes import connect_rule, probe_not_evaluated


def run_checks(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for reg in registry.registered():
        own = {r.id for r in reg.rules}
        for f in reg.check(ctx):
            if f.id not in own:  # a programming error: every id is declared by the check that reports it
                raise AssertionError(f"{reg.check.__name__} reported {f.id}, which it does not declare")
            if not from_placeholder(ctx, f):
                out.append(f)
    return sorted(dict.fromkeys(out), key=sort_key)


def from_placeholder(ctx: Context, f: Finding) -> bool:
    """A per-host finding computed from a source that was not read on that host (and not sound on partial facts)."""
    rule = registry.RULES[f.id]
    if f.host is None or rule.sound_on_partial or not rule.reads:
        return False
    return bool(rule.reads & set(ctx.unread(f.host)))


def blind_ids(ctx: Context, name: str, unread: Mapping[str, str]) -> dict[str, str]:
    """finding id -> why it cannot be evaluated on `name` (the first unread source it reads)."""
    out: dict[str, str] = {}
    master_only = registry.master_only()
    for fid, sources in registry.depends_on().items():
        if fid in master_only and name != ctx.cluster.master:
            continue
        missing = sorted(sources & set(unread))
        if missing:
            out[fid] = f"{missing[0]} not read: {unread[missing[0]]}"
    return out


def not_evaluated(ctx: Context, findings: Iterable[Finding]) -> dict[str, list[dict[str, str]]]:
    """Per host, the checks that could not be evaluated there (an unread source), minus those that still reported.

    `[{"id", "reason"}]`, sorted by id; hosts with nothing missing are left out."""
    reported = {(f.id, f.host) for f in findings}
    out: dict[str, list[dict[str, str]]] = {}
    for name, _ in ctx.audited():
        unread = ctx.unread(name)
        items = (
            [
                {"id": fid, "reason": why}
                for fid, why in sorted(blind_ids(ctx, name, unread).items())
                if (fid, name) not in reported
            ]
            if unread
            else []
        )
        for f in findings:  # an undecided firewall verdict: the check it stands for was not evaluated
            check = f.var("check")
            if f.host == name and f.id in UNDECIDED_IDS and check and (check, name) not in reported:
                items.append({"id": check, "reason": f"undecided ({f.id}): {f.var('rule')}"})
        why_not = ifreach.undecided(ctx.reach.get(name))
        if why_not:
            items.append({"id": REACH_RULE, "reason": why_not})
        for c in (ctx.hosts[name].probe or {}).get("connects") or []:  # a peer that did not run: not a failure
            why = None if c.get("ok") else probe_not_evaluated(ctx, c)
            if why:
                fid = connect_rule(c)
                items.append(
                    {"id": fid, "reason": f"connect to {c.get('name')} {c.get('address')}:{c.get('port')}: {why}"}
                )
        if items:
            out[name] = items
    return out
