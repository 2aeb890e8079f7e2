"""The live probes: connects from each node to the master port and to its peers, and the master port in use."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpfix.model.finding import Finding, Severity
from ddpfix.rules.context import SRC_PROBE, Context
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import VIA_FIREWALL

E = Severity.ERROR


# ---------------------------------------------------------------- probes


@rules(
    MASTER_PORT_UNREACHABLE := Rule(
        "probe.master-port-unreachable",
        E,
        "TCP connect from this node to MASTER_ADDR:MASTER_PORT fails (refused / timed out / no route)",
        "Fix the firewall/route on the path to the master {target}; re-run audit to confirm the connect succeeds.",
        remedies=(VIA_FIREWALL,),
        reads=SRC_PROBE,
        unseen_if_unexplained=True,
    ),
    PEER_UNREACHABLE := Rule(
        "probe.peer-unreachable",
        E,
        "TCP from this node to a peer's probe port (in its ephemeral range) fails",
        "Open the peer's ephemeral range to {cidr} and check the route between the two nodes.",
        remedies=(VIA_FIREWALL,),
        reads=SRC_PROBE,
        unseen_if_unexplained=True,
    ),
    PORT_IN_USE := Rule(
        "probe.port-in-use",
        E,
        "something already listens on the master port on the master",
        "Stop the process holding port {port} on the master, or choose another ddp_master_port outside the ephemeral "
        "range.",
        reads=frozenset({"listening"}),
        master_only=True,
        scope="idle",
    ),
)
def check_probes(ctx: Context) -> Iterable[Finding]:
    master = ctx.cluster.master
    mf = ctx.facts.get(master)
    if mf and ctx.cluster.master_port in (mf.get("listening") or []):
        yield finding(
            "probe.port-in-use",
            master,
            f"port {ctx.cluster.master_port} is already in use on the master",
            f"a socket on {master} is in LISTEN state on TCP port {ctx.cluster.master_port} before the job starts",
            port=ctx.cluster.master_port,
        )
    for name, f in ctx.audited():
        pr = ctx.hosts[name].probe or {}
        for c in pr.get("connects") or []:
            if c.get("ok") or probe_not_evaluated(ctx, c):
                continue
            target = f"{c.get('name')} {c.get('address')}:{c.get('port')}"
            src = pr_src(f)
            to_master = c.get("kind") == "master"
            yield finding(
                connect_rule(c),
                name,
                f"TCP connect to the master {target} failed" if to_master
                else f"TCP connect to peer {target} (probe port) failed",
                f"connect from {src} to {target}: {c.get('error')}",
                cidr=ctx.cidr,
                target=c.get("name"),
            )
        listener: Mapping[str, Any] = f.get("probe") or {}
        if listener.get("error"):
            yield finding(
                "probe.peer-unreachable",
                name,
                "probe listener could not start on this node",
                str(f["probe"]["error"]),
                cidr=ctx.cidr,
            )


def connect_rule(c: Mapping[str, Any]) -> str:
    """The rule a failed connect of the prober reports: to the master port or to a peer."""
    return "probe.master-port-unreachable" if c.get("kind") == "master" else "probe.peer-unreachable"


def probe_not_evaluated(ctx: Context, c: Mapping[str, Any]) -> str | None:
    """Why a failed connect says nothing about the network (None: it does): the target did not run or was not
    read, its listener could not start, or it was refused while the target's listener was not up (the last attempt
    fell outside the listener's life: it started or ended outside the dialer's retries). A connect that succeeded
    is always evaluated."""
    target = c.get("name")
    tf = ctx.facts.get(str(target)) if target is not None else None
    if not tf:
        return f"{target} was not audited"
    tp = tf.get("probe") or {}
    if tp.get("error"):
        return f"{target}'s probe listener did not start"
    kind = c.get("kind")
    if kind == "peer" and not tp.get("port"):
        return f"{target} has no probe listener"
    if (
        kind == "master"
        and not tp.get("master_port_listening")
        and ctx.cluster.master_port not in (tf.get("listening") or [])
    ):
        return f"nothing listened on {target}'s master port"
    if "ECONNREFUSED" not in str(c.get("error") or ""):
        return None  # an ICMP reject or a timeout comes from the path, whether or not the listener was up yet
    if kind == "master" and not tp.get("master_port_listening"):
        return None  # the master port's listener is a job's, up all along
    last, up, down = c.get("last_try"), tp.get("up_at"), tp.get("down_at")
    if (
        isinstance(last, (int, float))
        and isinstance(up, (int, float))
        and isinstance(down, (int, float))
        and not up <= last <= down
    ):
        return f"{target}'s listener was not up during the last attempt"
    return None


def pr_src(f: Mapping[str, Any]) -> str:
    c = f.get("cluster") or {}
    return f"{c.get('address')} ({c.get('ifname')})"
