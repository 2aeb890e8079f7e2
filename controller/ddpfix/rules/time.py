"""Time: a synchronised time daemon on every node, each node's offset, and the skew between nodes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpfix.model.finding import Explains, Finding, Severity
from ddpfix.rules.context import Context
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import CHRONY, CHRONY_INSTALL

W = Severity.WARNING


# ---------------------------------------------------------------- time


def chrony_unsynchronised(tracking: Mapping[str, Any] | None, max_offset_s: float) -> tuple[str, str] | None:
    """The one judgement of a running chronyd from its `chronyc -c tracking` facts (parsed on the node: its
    `synchronised` is the leap status and reference): (summary, evidence) of why it is not synchronised, or None
    when it is, within `max_offset_s`."""
    if not tracking:
        return "chronyd runs but `chronyc tracking` gives no answer", "chronyc -c tracking failed"
    if not tracking.get("synchronised"):
        return (
            "chronyd is not synchronised",
            f"chronyc tracking: leap status {tracking.get('leap_status')!r}, reference {tracking.get('ref_name')!r}",
        )
    offset = float(tracking.get("system_offset") or 0.0)
    if abs(offset) > max_offset_s:
        return (
            f"clock offset {offset:+.3f}s exceeds {max_offset_s}s",
            f"chronyc tracking: system time offset {offset:+.6f}s",
        )
    return None


@rules(
    NO_DAEMON := Rule(
        "time.no-daemon",
        W,
        "no chronyd/ntpd/timesyncd/ptp4l running",
        "Install and run chrony with common servers (ddp_ntp_servers) or the master as local source "
        "(ddp_ntp_local_master).",
        remedies=(CHRONY_INSTALL,),
        reads=frozenset({"processes"}),
        still_open="chronyd was started but is not running: see its log on the node",
        explains=(Explains("time.skew", "any"),),
    ),
    UNSYNCHRONIZED := Rule(
        "time.unsynchronized",
        W,
        "chrony not synchronised, or its offset above 0.1 s",
        "Give chrony reachable sources (ddp_ntp_servers or ddp_ntp_local_master) with iburst and makestep; ddpfix "
        "remediate configures it.",
        remedies=(CHRONY,),
        reads=frozenset({"processes", "chronyc"}),
        still_open="chronyd runs with the ddpfix sources but has not synchronised to them: check that the sources "
        "answer NTP from this node and that chronyd reads the configuration ddpfix edited "
        "(ddpfix_chrony_conf_path)",
        explains=(Explains("time.skew", "any"),),
    ),
    SKEW := Rule(
        "time.skew",
        W,
        "clock readings differ between nodes by more than `--max-skew` (1 s)",
        "Synchronise every node to the same sources (chrony); elastic rendezvous heartbeats compare wall clocks.",
        scope="cluster",
    ),
)
def check_time(ctx: Context) -> Iterable[Finding]:
    offsets: dict[str, dict[str, float]] = {}  # per controller clock (saved facts of several controllers)
    for name, f in ctx.audited():
        t: Mapping[str, Any] = f.get("time") or {}
        daemons = t.get("daemons") or []
        tr = t.get("chrony_tracking")
        if not daemons:
            yield finding(
                "time.no-daemon",
                name,
                "no time-sync daemon is running",
                "no chronyd/ntpd/systemd-timesyncd/ptp4l process found",
            )
        elif "chronyd" in daemons:
            problem = chrony_unsynchronised(tr, ctx.thresholds.max_offset_s)
            if problem:
                yield finding("time.unsynchronized", name, *problem)
        h = ctx.hosts[name]
        if f.get("now") is not None:
            offset = clock_offset(float(f["now"]), h.window, h.collected_at)
            if offset is not None:
                offsets.setdefault(h.clock, {})[name] = offset
    for clock, group in sorted(offsets.items()):
        skew = clock_skew(group, ctx.thresholds.max_skew_s, clock)
        if skew is not None:
            yield finding("time.skew", None, *skew)


def clock_skew(offsets: Mapping[str, float], max_skew_s: float, clock: str = "") -> tuple[str, str] | None:
    """(summary, evidence) when the nodes' offsets from one controller's clock spread past `max_skew_s`. Offsets
    measured by different controllers are never compared: their own clocks may differ (`clock`: that controller,
    named in the evidence; "" this run's)."""
    if len(offsets) < 2:
        return None
    lo = min(offsets, key=lambda n: offsets[n])
    hi = max(offsets, key=lambda n: offsets[n])
    spread = offsets[hi] - offsets[lo]
    if spread <= max_skew_s:
        return None
    vs = f"controller {clock}" if clock else "controller"
    return (f"clocks differ by {spread:.2f}s between {hi} and {lo}",
            "; ".join(f"{n}: {o:+.2f}s vs {vs}" for n, o in sorted(offsets.items()))
            + " (beyond each task's start..result window)")


def clock_offset(node_now: float, window: tuple[float, float] | None, collected_at: float | None) -> float | None:
    """How far a node's clock reading lies outside the controller's window for that task.

    The node read its clock somewhere between the task's start and its result on the controller, so a synchronised
    node's reading falls inside the window: offset 0. Only the part outside the window counts, so a busy controller
    (a wide window) can hide small skews but never invents one."""
    if window is not None:
        lo, hi = window
        if node_now < lo:
            return node_now - lo
        if node_now > hi:
            return node_now - hi
        return 0.0
    if collected_at is not None:
        return node_now - collected_at
    return None
