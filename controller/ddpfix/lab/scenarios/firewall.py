"""Firewall scenarios (row 1, row 12): firewalld, iptables and nftables blocking rules, Docker's tables next to
them, a port taken, a world-open rule.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from ddpfix.lab.model import LabPlan, NodePlan
from ddpfix.lab.scenarios.registry import last, scenario
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import probes as probes_rules

if TYPE_CHECKING:
    from ddpfix.lab.daemons import Runtime



FIREWALLD_PUBLIC_ZONE = """<?xml version="1.0" encoding="utf-8"?>
<zone>
  <short>Public</short>
  <description>ddpfix lab (firewalld-master): only SSH (and NTP, so the lab's clocks stay in sync) is allowed in.
  </description>
  <service name="ssh"/>
  <service name="ntp"/>
  <forward/>
</zone>
"""


@scenario(
    "firewalld-master",
    "firewalld on node1, default zone public allowing only ssh (+ntp): master port and ephemeral ports blocked",
    (firewall_rules.MASTER_PORT_BLOCKED.id, firewall_rules.PEER_PORTS_BLOCKED.id,
     probes_rules.MASTER_PORT_UNREACHABLE.id),
)
def _firewalld_master(plan: LabPlan) -> None:
    """Failure mode: the firewall on the master. node1 runs its own `dbus-daemon --system` and `firewalld`
    (nftables backend, inside node1's namespaces only) with default zone `public` holding only
    the `ssh` service (plus `ntp`, so that node1 still serves time and the scenario adds no time
    finding) and the zone's default reject target: TCP to the master port 29500 and to the
    ephemeral range is rejected, SSH still works, the other nodes have no rules.
    Findings: firewall_rules.MASTER_PORT_BLOCKED and firewall_rules.PEER_PORTS_BLOCKED on node1, and the
    probes_rules.MASTER_PORT_UNREACHABLE probes from the workers."""
    node = plan.master
    node.files["firewalld/zones/public.xml"] = FIREWALLD_PUBLIC_ZONE
    node.tasks.append(_start_firewalld)


def _start_firewalld(rt: Runtime, node: NodePlan) -> None:
    rt.exec(node, ["/etc/init.d/dbus", "start"])
    rt.record_pidfile(node, "dbus-daemon", "/run/dbus/pid")
    rt.exec(node, ["firewalld"])
    rt.wait_for(
        lambda: rt.exec(node, ["firewall-cmd", "--state"], check=False).stdout.strip() == "running",
        timeout=60,
        what=f"firewalld on {node.name}",
    )
    rt.record_pidfile(node, "firewalld", "/run/firewalld.pid")


def _filter_table(comment: str, port: int, *rules: str) -> str:
    """An iptables-restore filter table: established, loopback, SSH and the master `port` accepted, then `rules`."""
    return "\n".join(
        [
            f"# ddpfix lab ({comment}",
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            "-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
            f"-A INPUT -p tcp -m tcp --dport {port} -j ACCEPT",
            *rules,
            "COMMIT",
            "",
        ]
    )


def iptables_rules(port: int, lo: int, hi: int) -> str:
    return _filter_table("iptables-worker): a host firewall that lets SSH in but rejects the ephemeral range", port,
                         f"-A INPUT -p tcp -m tcp --dport {lo}:{hi} -j REJECT --reject-with tcp-reset")


def _iptables_on(node: NodePlan) -> None:
    node.tasks.append(_load_iptables)


def _load_iptables(rt: Runtime, node: NodePlan) -> None:
    lo, hi = rt.exec(node, ["cat", "/proc/sys/net/ipv4/ip_local_port_range"]).stdout.split()
    rules = iptables_rules(rt.plan.master_port, int(lo), int(hi))
    rt.write_etc(node, "iptables/rules.v4", rules)
    rt.exec(node, ["iptables-restore", "/etc/iptables/rules.v4"])


@scenario(
    "iptables-worker",
    "iptables on the highest-address node rejects TCP to its ephemeral range (persisted in rules.v4)",
    (firewall_rules.PEER_PORTS_BLOCKED.id,),
    min_nodes=2,
)
def _iptables_worker(plan: LabPlan) -> None:
    """Failure mode: the firewall on a worker. The highest-address node (nodeN) gets an iptables INPUT chain:
    accept established/related, lo, tcp/22 and the master port, then REJECT (tcp-reset) TCP to
    its `net.ipv4.ip_local_port_range` (32768:60999), also saved in its /etc/iptables/rules.v4.
    Finding: firewall_rules.PEER_PORTS_BLOCKED on nodeN (probes_rules.PEER_UNREACHABLE when a peer probes it).
    Gloo's higher address dials the lower one, so torch alone may not trip over this one."""
    _iptables_on(last(plan))


def nftables_conf(lo: int, hi: int) -> str:
    return "\n".join(
        [
            "#!/usr/sbin/nft -f",
            "# ddpfix lab (nftables-worker2): a native nftables host firewall, Debian's /etc/nftables.conf style",
            "flush ruleset",
            "table inet filter {",
            "\tchain input {",
            "\t\ttype filter hook input priority filter; policy drop;",
            "\t\tct state established,related accept",
            '\t\tiifname "lo" accept',
            "\t\ttcp dport 22 accept",
            "\t\tmeta l4proto icmp accept",
            "\t}",
            "}",
            "",
        ]
    )


def _load_nftables(rt: Runtime, node: NodePlan) -> None:
    lo, hi = rt.exec(node, ["cat", "/proc/sys/net/ipv4/ip_local_port_range"]).stdout.split()
    rt.write_etc(node, "nftables.conf", nftables_conf(int(lo), int(hi)))
    rt.exec(node, ["nft", "-f", "/etc/nftables.conf"])


@scenario(
    "nftables-worker2",
    "native nftables on node2 (inet filter input, policy drop, only ssh): drops the master port and ephemeral range",
    (firewall_rules.PEER_PORTS_BLOCKED.id, probes_rules.PEER_UNREACHABLE.id),
    min_nodes=3,
)
def _nftables_worker2(plan: LabPlan) -> None:
    """Failure mode: the firewall with a native nftables rule set (no iptables, no firewalld), persisted in node2's
    /etc/nftables.conf: TCP from peers is dropped silently (timeouts, not refusals).
    Findings: firewall_rules.PEER_PORTS_BLOCKED on node2; probes_rules.PEER_UNREACHABLE on the nodes that dial it."""
    plan.nodes[1].tasks.append(_load_nftables)


# What Docker (iptables-nft) and a native nftables tool leave in the running rule set, but never in the host's
# firewall config. `physdev` and `recent` have no native nft translation: `nft list ruleset` shows them as
# `xt match`, which `nft -f` cannot load (a whole-ruleset dump saved to /etc/nftables.conf breaks the next boot).
DOCKER_IPTABLES = [
    ["-N", "DOCKER"],
    ["-N", "DOCKER-USER"],
    ["-N", "DOCKER-ISOLATION-STAGE-1"],
    ["-P", "FORWARD", "DROP"],
    ["-A", "FORWARD", "-j", "DOCKER-USER"],
    ["-A", "FORWARD", "-j", "DOCKER-ISOLATION-STAGE-1"],
    ["-A", "FORWARD", "-o", "docker0", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
    ["-A", "FORWARD", "-o", "docker0", "-j", "DOCKER"],
    [
        "-A",
        "DOCKER",
        "-d",
        "172.17.0.2/32",
        "!",
        "-i",
        "docker0",
        "-o",
        "docker0",
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        "80",
        "-j",
        "ACCEPT",
    ],
    ["-A", "DOCKER-ISOLATION-STAGE-1", "-m", "physdev", "--physdev-is-bridged", "-j", "RETURN"],
    ["-A", "DOCKER-USER", "-m", "recent", "--name", "ddpfix-lab", "--rcheck", "-j", "RETURN"],
    ["-A", "DOCKER-USER", "-j", "RETURN"],
    ["-t", "nat", "-N", "DOCKER"],
    ["-t", "nat", "-A", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "DOCKER"],
    ["-t", "nat", "-A", "POSTROUTING", "-s", "172.17.0.0/16", "!", "-o", "docker0", "-j", "MASQUERADE"],
]
DOCKER_NATIVE_NFT = "\n".join(
    [
        "table inet ddpfix-lab-docker {",
        "\tchain input {",
        "\t\ttype filter hook input priority filter - 5; policy accept;",
        '\t\tiifname "docker0" counter',
        "\t}",
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter; policy accept;",
        "\t}",
        "}",
        "",
    ]
)


def _load_docker_tables(rt: Runtime, node: NodePlan) -> None:
    for args in DOCKER_IPTABLES:
        rt.exec(node, ["iptables-nft", *args])
    rt.exec(node, ["nft", "-f", "-"], input=DOCKER_NATIVE_NFT)


@scenario(
    "docker-tables",
    "Docker-like iptables-nft chains (DOCKER, DOCKER-USER, xt matches) and a native nft table on node2 and nodeN, "
    "runtime only",
    (),
    min_nodes=2,
)
def _docker_tables(plan: LabPlan) -> None:
    """Not a fault on its own: what Docker and a native nftables tool leave in the running rule set of node2 and
    the highest-address node, loaded after the rules of the scenarios listed before it (as a Docker daemon starts
    after the firewall; list it last): iptables-nft chains DOCKER, DOCKER-USER, DOCKER-ISOLATION-STAGE-1 and nat
    DOCKER, FORWARD policy drop, `physdev`/`recent` matches that `nft list ruleset` shows as `xt match` (not
    loadable by `nft -f`), and a native table `inet ddpfix-lab-docker` with accept-only input/forward chains. None
    of it is in a config file. Combine with `nftables-worker2` / `iptables-worker` to check that remediation persists
    only its own rule."""
    for node in {id(n): n for n in (plan.nodes[1], last(plan))}.values():
        node.tasks.append(_load_docker_tables)


@scenario(
    "iptables-worker2",
    "the iptables-worker rules on node2, which higher-address peers dial (breaks a Gloo all-reduce)",
    (firewall_rules.PEER_PORTS_BLOCKED.id,),
    min_nodes=3,
)
def _iptables_worker2(plan: LabPlan) -> None:
    """Same rules as `iptables-worker`, on node2: in a 3+ node lab node3 dials node2's Gloo
    listener on an ephemeral port, so `verify --torch` fails. Finding: firewall_rules.PEER_PORTS_BLOCKED
    on node2."""
    _iptables_on(plan.nodes[1])




@scenario(
    "port-in-use",
    "a process started by the lab already listens on the master port 29500 on node1",
    (probes_rules.PORT_IN_USE.id,),
)
def _port_in_use(plan: LabPlan) -> None:
    """Failure mode: the master port. node1 runs a small Python listener on 0.0.0.0:29500 (the master port),
    started by the lab and killed by its PID on `lab down`. Finding: probes_rules.PORT_IN_USE on node1."""
    plan.master.tasks.append(_listen_master_port)


LISTENER = (
    "import os,socket,sys,time\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(16)\n"
    "open('/run/ddpfix-port-in-use.pid','w').write(str(os.getpid()))\n"
    "while True: c,_=s.accept(); c.close()\n"
)


def _listen_master_port(rt: Runtime, node: NodePlan) -> None:
    port = str(rt.plan.master_port)
    rt.exec(
        node, ["sh", "-c", f"setsid -f /usr/bin/python3 -c {shlex.quote(LISTENER)} {port} </dev/null >/dev/null 2>&1"]
    )
    rt.wait_for(
        lambda: rt.read_run(node, "ddpfix-port-in-use.pid") is not None, timeout=10, what="port-in-use listener"
    )
    rt.record_pidfile(node, "port-in-use", "/run/ddpfix-port-in-use.pid")




def world_open_rules(port: int, cidr: str) -> str:
    return _filter_table("world-open): the master port is open to any source; the cluster CIDR is trusted", port,
                         f"-A INPUT -s {cidr} -j ACCEPT", "-A INPUT -j REJECT --reject-with icmp-port-unreachable")


@scenario(
    "world-open",
    "iptables on node1 accepts the master port from any source (no -s), trusts the subnet, rejects the rest",
    (firewall_rules.WORLD_OPEN.id,),
)
def _world_open(plan: LabPlan) -> None:
    """Failure mode: the firewall, the over-open variant. node1's iptables INPUT chain (also saved in its
    /etc/iptables/rules.v4): accept established/related, lo, tcp/22, then `-p tcp --dport 29500
    -j ACCEPT` with no source restriction (the master port is open to 0.0.0.0/0), then accept the
    lab subnet, then REJECT everything else. Peers and NTP work (they are in the subnet).
    Finding: firewall_rules.WORLD_OPEN on node1 (nothing else)."""
    plan.master.tasks.append(_load_world_open)


def _load_world_open(rt: Runtime, node: NodePlan) -> None:
    rt.write_etc(node, "iptables/rules.v4", world_open_rules(rt.plan.master_port, str(rt.plan.subnet)))
    rt.exec(node, ["iptables-restore", "/etc/iptables/rules.v4"])
