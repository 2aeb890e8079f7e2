"""`ddpfix lab up|down|status`: real SSH hosts in Linux namespaces on this machine (needs root)."""

from __future__ import annotations

import json

import click

from ddpfix import lab
from ddpfix.app import Application
from ddpfix.errors import ExitCode
from ddpfix.lab import scenarios as _scn
from ddpfix.lab.model import DEFAULT_NAME, DEFAULT_NODES, DEFAULT_SUBNET, MAX_NODES

_NAME_HELP = "Lab name; labs with different names (and subnets) coexist."


@click.group("lab")
def command() -> None:
    """A lab of real SSH hosts (Linux namespaces) on this machine, clean or with a failure mode.

    \b
    Each node has its own network, hostname, /etc, sshd (key-only root login), chrony
    (which never touches the real clock) and an interface on a private bridge.
    Typical flow (as root):
      ddpfix lab up --nodes 3 --scenario firewalld-master,hostname-loopback
      ddpfix audit -i inventories/lab/hosts.yml
      ddpfix lab down
    """


def _scenario_rows() -> list[tuple[str, str]]:
    return [(s.name, s.summary) for s in _scn.SCENARIOS.values()]


def scenarios_text(width: int = 80) -> str:
    """The scenario list as `lab up --help` prints it (docs/lab.md carries the same: tools/docs.py)."""
    formatter = click.HelpFormatter(width=width)
    formatter.write_dl(_scenario_rows())
    return formatter.getvalue()


class _ScenarioHelp(click.Command):
    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Scenarios (comma-combinable)"):
            formatter.write_dl(_scenario_rows())


@command.command("up", cls=_ScenarioHelp)
@click.option("--nodes", "-n", type=click.IntRange(1, MAX_NODES), default=DEFAULT_NODES, show_default=True,
              help="Number of nodes (node1 is the master).")
@click.option("--scenario", "-s", default="clean", show_default=True, metavar="NAME[,NAME...]",
              help="Fault(s) to build in; see the list below.")
@click.option("--subnet", default=DEFAULT_SUBNET, show_default=True, metavar="CIDR",
              help="Private IPv4 lab network; node1 gets .11, node2 .12, ...")
@click.option("--ifnames", default="eth0", show_default=True, metavar="IF[,IF...]",
              help="Cluster interface names, cycled over the nodes (e.g. eth0,ens5).")
@click.option("--python", "pythons", default="", metavar="NODE=3.X[,...]",
              help="Nodes that run a pyenv build (/root/.pyenv/versions, made visible read-only in the node) as "
                   "ansible_python_interpreter, e.g. node2=3.8,node3=3.13; the others run /usr/bin/python3.")
@click.option("--name", default=DEFAULT_NAME, show_default=True, help=_NAME_HELP)
@click.option("--inventory-dir", default="inventories/lab", show_default=True, type=click.Path(file_okay=False),
              help="Where to write hosts.yml (relative to the current directory).")
@click.option("--wait-sync/--no-wait-sync", default=True, show_default=True,
              help="Wait until chrony reports every clock synchronised.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def up_cmd(app: Application, nodes: int, scenario: str, subnet: str, ifnames: str, pythons: str, name: str,
           inventory_dir: str, wait_sync: bool, fmt: str) -> None:
    """Create a lab and write its Ansible inventory (group ddp_nodes)."""

    try:
        info = lab.up(name, nodes, scenario, subnet, ifnames, inventory_dir, wait_sync=wait_sync, pythons=pythons)
    except lab.LabError as exc:
        app.abort(str(exc), exc.code)
    if fmt == "json":
        click.echo(json.dumps({
            "name": info.name, "subnet": info.subnet, "scenarios": info.scenarios, "inventory": str(info.inventory),
            "ssh_config": str(info.ssh_config), "state_dir": str(info.state_dir),
            "nodes": [{"name": n.name, "hostname": n.hostname, "address": n.address, "ifname": n.ifname,
                       "netns": n.netns, "pid": n.pid} for n in info.nodes],
        }, indent=2))
        return
    click.echo(f"lab {info.name}: {len(info.nodes)} nodes on {info.subnet}, scenario {', '.join(info.scenarios)}")
    for n in info.nodes:
        click.echo(f"  {n.name:<8} {n.hostname:<8} {n.address:<15} {n.ifname}")
    click.echo(f"inventory:  {info.inventory}")
    click.echo(f"ssh:        ssh -F {info.ssh_config} {info.master}")
    click.echo(f"tear down:  ddpfix lab down --name {info.name}")


@command.command("down")
@click.option("--name", default=DEFAULT_NAME, show_default=True, help=_NAME_HELP)
@click.pass_obj
def down_cmd(app: Application, name: str) -> None:
    """Remove a lab: its processes (by recorded PID), namespaces, links, mounts, state and inventory."""

    try:
        existed = lab.down(name)
    except lab.LabError as exc:
        app.abort(str(exc), exc.code)
    click.echo(f"lab {name}: removed" if existed else f"lab {name}: nothing to remove", err=True)


@command.command("status")
@click.option("--name", default=DEFAULT_NAME, show_default=True, help=_NAME_HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def status_cmd(app: Application, name: str, fmt: str) -> None:
    """Show a lab's nodes, addresses, interfaces, processes and SSH reachability (exit 1 if degraded)."""

    try:
        st = lab.status(name)
    except lab.LabError as exc:
        app.abort(str(exc), exc.code)
    healthy = st.exists and all(n.alive and n.sshd for n in st.nodes)
    if fmt == "json":
        doc = lab.status_dict(st)
        doc["healthy"] = healthy
        click.echo(json.dumps(doc, indent=2))
    elif not st.nodes:
        state = "partly present (no state file): run 'ddpfix lab down'" if st.exists else "not running"
        click.echo(f"lab {name}: {state}")
    else:
        rows = [("node", "hostname", "address", "ifname", "pid", "alive", "sshd", "processes")]
        for n in st.nodes:
            procs = ",".join(f"{k}{'' if v else '(dead)'}" for k, v in n.processes.items())
            rows.append((n.name, n.hostname, n.address, n.ifname, str(n.pid), "yes" if n.alive else "NO",
                         "yes" if n.sshd else "NO", procs))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        click.echo(f"lab {name}: {st.subnet}, scenario {', '.join(st.scenarios)}")
        for r in rows:
            click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        click.echo(f"inventory: {st.inventory}")
    if st.exists and not healthy:
        raise SystemExit(int(ExitCode.FINDINGS))
