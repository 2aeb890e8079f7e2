"""Options and helpers shared by subcommands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from ddpfix.app import Application, DdpfixError, ExitCode
from ddpfix.checks import HostFacts, active_firewalls
from ddpfix.inventory import Cluster, load_cluster
from ddpfix.plan import NodePlan
from ddpfix.report import render_table, to_json

F = TypeVar("F", bound=Callable[..., Any])


def output_options(f: F) -> F:
    f = click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
                     help="Also write the JSON report to this file.")(f)
    f = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                     help="Report format on stdout.")(f)
    return f


def probe_options(f: F) -> F:
    f = click.option("--probe-timeout", type=click.FloatRange(0.1, 30), default=2.0, show_default=True,
                     help="TCP connect timeout of each probe, seconds.")(f)
    f = click.option("--probe-peers", type=click.IntRange(0, 64), default=2, show_default=True,
                     help="Peers each node dials besides the master (ring successors): (1+K)*N connections.")(f)
    f = click.option("--probe/--no-probe", default=True, show_default=True, help="Run the active network probes.")(f)
    return f


def cluster_of(app: Application) -> Cluster:
    """The inventory's cluster, under the per-inventory controller lock (held until the command ends)."""
    from ddpfix.lock import controller_lock

    cluster = load_cluster(app.require_inventory())
    lock = controller_lock(cluster.inventories)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(lock.release)
    return cluster


def emit(doc: dict[str, Any], fmt: str, output: str | None) -> None:
    if output:
        try:
            Path(output).write_text(to_json(doc))
        except OSError as exc:
            raise DdpfixError(f"cannot write {output}: {exc.strerror}", ExitCode.INVALID_INPUT) from exc
    if fmt == "json":
        sys.stdout.write(to_json(doc))
    else:
        render_table(doc, Console(soft_wrap=False))


def host_summaries(hosts: dict[str, HostFacts], plans: dict[str, NodePlan], cluster: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in cluster.nodes:
        h = hosts.get(node.name)
        if h is None:
            continue
        f = h.node or {}
        plan = plans.get(node.name)
        t = (f.get("time") or {})
        fw = f.get("firewall") or {}
        out[node.name] = {
            "reachable": bool(h.reachable),
            "address": node.address,
            "rank": node.rank,
            "facts": {} if not h.reachable else {
                "hostname": f.get("hostname"),
                "cluster_address": plan.address if plan else None,
                "cluster_ifname": plan.ifname if plan else None,
                "time_daemons": t.get("daemons"),
                "chrony_synchronised": (t.get("chrony_tracking") or {}).get("synchronised"),
                "firewall": active_firewalls(fw),
                "env_file": (f.get("env_file") or {}).get("exists"),
                "ephemeral_range": (f.get("sysctl") or {}).get("ip_local_port_range"),
            },
        }
        if not h.reachable:
            out[node.name]["error"] = h.error
    return out
