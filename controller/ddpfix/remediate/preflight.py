"""Remediation's pre-flight: what is refused before any node is touched, and the write pre-flight read from the
audit's facts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.contract import ACK_BROAD, cidr_needs_ack
from ddpfix.remediate.plan import HostPlan
from ddpfix.remediate.writes import limits_files
from ddpfix.rules.context import Context
from ddpfix.rules.reachability import INVALID


def preflight(ctx: Context, plans: dict[str, HostPlan], *, apply: bool) -> None:
    """Refuse (exit 2, nothing touched) what must never reach a node: bad facts, an unknown, IPv6 or unacknowledged
    broad cluster CIDR, a limits drop-in's value or launcher unit the drop-ins cannot take. Runs after the read-only
    audit, before the remediation play."""
    c = ctx.cluster
    for host, problems in ctx.invalid.items():
        fact, value, why = problems[0]
        raise DdpfixError(
            f"{host} returned {fact} {value!r}: {why} ({INVALID.id}); nothing was changed on any node",
            ExitCode.INVALID_INPUT,
        )
    if not ctx.cidr:
        extra = f": the master {c.master} was not read" if c.master not in dict(ctx.audited()) else ""
        raise DdpfixError(
            f"cannot remediate: the cluster network is unknown{extra} (set ddp_cluster_cidr)", ExitCode.INVALID_INPUT
        )
    if ctx.net is not None and ctx.net.version == 6:
        raise DdpfixError(
            f"cannot remediate: the cluster network {ctx.cidr} is IPv6; ddpfix's firewall fixes are "
            "IPv4 only (set ddp_cluster_cidr to the cluster's IPv4 network)",
            ExitCode.INVALID_INPUT,
        )
    for host, hp in plans.items():  # the limits drop-ins' values and launcher units (writes.limits_files)
        try:
            limits_files(hp, c.node(host), c.memlock_kib)
        except ValueError as exc:
            raise DdpfixError(f"{host}: {exc}; nothing was changed on any node", ExitCode.INVALID_INPUT) from exc
    broad = cidr_needs_ack(ctx.cidr)
    if apply and broad and not c.cidr_ack_broad and any(p.firewall != "none" for p in plans.values()):
        raise DdpfixError(
            f"ddp_cluster_cidr {ctx.cidr!r} {broad}: "
            f"opening the firewall to it needs {ACK_BROAD}: true in the inventory",
            ExitCode.INVALID_INPUT,
        )


#: The step whose failure the dry run reports when the facts say a file cannot be written (the play's pre-flight).
PREFLIGHT_STEP = "Lock | Preflight | Files to be written are writable"


def facts_preflight(ctx: Context, plans: dict[str, HostPlan], *,
                    nofile: bool = False) -> tuple[set[str], dict[str, str]]:
    """The write pre-flight of the nodes whose only fix is their env file (and cluster.json), from the audit's facts
    (`env_file.unwritable`: what of the two cannot be written, and the node lock when the audit could not take it,
    read moments before): (the nodes it covers, the failures as failures_of words them). When it finds no failure,
    such nodes skip the per-node play's lock-and-pre-flight call (ddpfix_node_files checks their files again, under
    the lock, before it writes any); with a failure every node goes through the play's pre-flight, which stops the
    run everywhere before any change and names each node's reason. With `nofile` (the dry run's preview and
    `remediate_checked`) it also covers the nodes whose fixes include the open-file limit's drop-ins
    (`limits.nofile_dropins.unwritable`), which ddpfix_node_files writes in the same call as the env file."""
    checked: set[str] = set()
    failed: dict[str, str] = {}
    for host, hp in plans.items():
        facts: Mapping[str, Any] = ctx.facts.get(host) or {}
        parts = ([(facts.get("env_file") or {}).get("unwritable")] if hp.env else []) + (
            [((facts.get("limits") or {}).get("nofile_dropins") or {}).get("unwritable")] if hp.nofile else [])
        if not (hp.previewable if nofile else hp.env_only) or not all(isinstance(x, Mapping) for x in parts):
            continue  # another fix (the play's pre-flight covers every file), or facts from an older ddpfix
        checked.add(host)
        bad = {k: v for x in parts if isinstance(x, Mapping) for k, v in x.items()}
        if bad:
            failed[host] = (f"{PREFLIGHT_STEP}: cannot write: "
                            + "; ".join(f"{k} ({v})" for k, v in sorted(bad.items()))
                            + "; nothing was changed on any node")
    return checked, failed


def remediate_checked(ctx: Context, plans: dict[str, HostPlan]) -> list[str]:
    """The nodes that skip the per-node play: facts_preflight's (their fixes are the env file and the open-file
    limit's drop-ins, or one of them, all written in the cluster-wide play's one ddpfix_node_files call), when it found
    no failure anywhere."""
    checked, failed = facts_preflight(ctx, plans, nofile=True)
    return [] if failed else sorted(checked)
