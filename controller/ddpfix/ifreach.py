"""The interface that reaches every peer (issue 25.8): what the interface reach probe found, in one place.

On a node with more than one candidate interface the prober dials each of its k planned peers once more from each
other candidate, bound to that device (plugins/module_utils/ddpfix_probe.py `reach_candidates`); `probe.reach` is,
per interface, the peers it reached and those it failed (validated by `factguard.guard_reach`). Here: whether that
evidence decides anything, which candidate the plan writes as the socket interface, and how an interface's result
reads in a finding. Pure functions; the plan (`plan.plan_cluster`) and the check (`rules.netif`'s reachability of
peers) both read them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Reach = Mapping[str, Mapping[str, Any]]


def decisive(reach: Reach | None) -> bool:
    """The evidence compares interfaces: two or more were dialled from, every one bound to its device (without
    SO_BINDTODEVICE routing may have sent a connect out of another NIC, so a success proves nothing about the
    interface), and some peer was dialled."""
    if not reach or len(reach) < 2:
        return False
    if not all(e.get("device") for e in reach.values()):
        return False
    return bool(peers(reach))


def undecided(reach: Reach | None) -> str | None:
    """Why evidence that compares interfaces decides nothing (the check is then not evaluated), or None."""
    if not reach or len(reach) < 2:
        return None
    unbound = [n for n, e in reach.items() if not e.get("device")]
    if unbound:
        return (f"the reach probe's connects from {', '.join(unbound)} could not be bound to the device "
                "(SO_BINDTODEVICE needs CAP_NET_RAW): they may have left by another interface")
    return None


def peers(reach: Reach) -> list[str]:
    """Every peer some interface dialled, sorted."""
    return sorted({p for e in reach.values() for p in [*(e.get("reached") or []), *(e.get("failed") or {})]})


def failed(reach: Reach, ifname: str) -> dict[str, str]:
    """{peer: why} the interface did not reach."""
    return dict((reach.get(ifname) or {}).get("failed") or {})


def reached_all(reach: Reach) -> list[str]:
    """The interfaces (in the evidence's order) that reached every peer any interface dialled."""
    want = set(peers(reach))
    return [n for n, e in reach.items() if not e.get("failed") and want <= set(e.get("reached") or [])]


def choose(reach: Reach | None, current: str | None, in_cidr: Callable[[str], bool],
           order: Sequence[str] = ()) -> tuple[str, str] | None:
    """The socket interface the plan writes, by what reached every peer: (ifname, why), why '' when every candidate
    reached every peer and the current rule's interface stays. None: the evidence decides nothing (not `decisive`,
    or no candidate with an address in the cluster network reached every peer: the plan keeps its rule, the finding
    says so).

    Among the candidates that reached every peer: the ones whose probed address is in the cluster network (only
    those: an interface outside it would be reported missing once written), then the fastest link (sysfs speed; unknown
    counts as slowest), then the current rule (`current`: the interface that holds the cluster address), then
    interface order (`order`)."""
    if not decisive(reach):
        return None
    assert reach is not None
    good = [n for n in reached_all(reach) if in_cidr(str(reach[n].get("address") or ""))]
    if not good:
        return None
    rank = {n: i for i, n in enumerate(order)}
    good.sort(key=lambda n: (-(reach[n].get("speed") or 0), n != current, rank.get(n, len(rank))))
    pick = good[0]
    bad = [n for n in reach if reach[n].get("failed")]
    if not bad and pick == current:
        return pick, ""
    why = f"{pick} reached every probed peer ({', '.join(peers(reach))})"
    if bad:
        why += "; " + "; ".join(f"{n} did not reach {', '.join(sorted(failed(reach, n)))}" for n in bad)
    if pick != current and current in good:
        why += f"; {pick} has the faster link ({reach[pick].get('speed')} Mb/s)"
    return pick, why


def describe(reach: Reach) -> str:
    """Per interface: address, whom it reached and whom it failed (with why), one line."""
    parts = []
    for n, e in reach.items():
        fails = e.get("failed") or {}
        text = f"{n} {e.get('address')}: reached {', '.join(sorted(e.get('reached') or [])) or 'none'}"
        if fails:
            text += "; failed " + ", ".join(f"{p} ({why})" for p, why in sorted(fails.items()))
        parts.append(text)
    return " | ".join(parts)
