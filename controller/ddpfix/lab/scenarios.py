"""Lab scenarios: a clean cluster, or one with a real fault that ddpfix detects (README, "Findings").

Each scenario edits the `LabPlan` before anything is created (interfaces, /etc files, env files,
inventory variables, which daemons run) and may add runtime tasks that run once every node's
sshd is up (start firewalld, load iptables rules, start a listener, ...). Scenarios combine
(`--scenario a,b`); each one picks its victim nodes deterministically, as its docstring says.
When two combined scenarios edit the same thing on the same node (e.g. both write env files),
the later one in the list wins.

Nodes are `node1..nodeN` with addresses `.11 .. .(10+N)`: node1 is the master (rank 0) and the
lowest address, `nodeN` the highest address. In torch's Gloo transport, of each pair of nodes the
one with the higher address dials the lower one, so a fault on `nodeN` that only affects incoming
connections is not hit by an all-reduce although it is a real fault; `iptables-worker2` puts the
same firewall on node2 for that reason.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpfix.errors import ExitCode
from ddpfix.lab.model import ENV_PATH, NODE_PATH, ExtraNic, LabError, LabPlan, NodePlan

if TYPE_CHECKING:
    from ddpfix.lab.daemons import Runtime
    from ddpfix.lab.model import LabInfo

PUBLIC_MASTER_ADDR = "203.0.113.10"  # TEST-NET-3: configuration text only, never contacted
WRONG_PEER_ADDR = "198.51.100.7"  # TEST-NET-2: configuration text only, never contacted


@dataclass(frozen=True)
class Expect:
    """What `ddpfix audit` must report on a 3-node lab built with this scenario (asserted by
    tests/lab/test_audit_lab.py, which audits every scenario that declares its expectations in one shared lab)."""

    id: str  # finding id
    host: str | None  # inventory name (node1..node3); None: cluster-wide
    evidence: Callable[[LabInfo], list[str]]  # substrings the finding's evidence must contain, from the lab's facts


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str  # one line, for `lab up --help`
    findings: tuple[str, ...]  # audit finding ids the scenario must produce
    min_nodes: int
    apply: Callable[[LabPlan], None]
    expect: tuple[Expect, ...] = ()

    @property
    def doc(self) -> str:
        return (self.apply.__doc__ or "").strip()


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str, summary: str, findings: tuple[str, ...] = (), min_nodes: int = 1, expect: tuple[Expect, ...] = ()
) -> Callable[[Callable[[LabPlan], None]], Callable[[LabPlan], None]]:
    def deco(fn: Callable[[LabPlan], None]) -> Callable[[LabPlan], None]:
        ids = findings or tuple(dict.fromkeys(e.id for e in expect))
        SCENARIOS[name] = Scenario(name, summary, ids, min_nodes, fn, expect)
        return fn

    return deco


def parse_scenarios(text: str | None, nodes: int) -> list[str]:
    names = [s.strip() for s in (text or "clean").split(",") if s.strip()] or ["clean"]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        raise LabError(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", ExitCode.INVALID_INPUT)
    for s in names:
        if nodes < SCENARIOS[s].min_nodes:
            raise LabError(f"scenario {s} needs at least {SCENARIOS[s].min_nodes} nodes", ExitCode.INVALID_INPUT)
    seen: list[str] = []
    for s in names:
        if s not in seen:
            seen.append(s)
    return seen


def last(plan: LabPlan) -> NodePlan:
    """The highest-address node."""
    return plan.nodes[-1]


def second(plan: LabPlan) -> NodePlan:
    """node2, or node1 in a one-node lab."""
    return plan.nodes[1] if len(plan.nodes) > 1 else plan.nodes[0]


def unused_ifname(node: NodePlan, *candidates: str) -> str:
    taken = {node.ifname, *(x.ifname for x in node.extra_nics)}
    for c in candidates:
        if c not in taken:
            return c
    raise LabError(f"no free interface name on {node.name}", ExitCode.INVALID_INPUT)


def set_env_everywhere(plan: LabPlan, **override: str) -> None:
    for n in plan.nodes:
        n.env = plan.env_for(n, **override)


# --------------------------------------------------------------------------- clean


@scenario("clean", "no fault: every node resolves every peer, chrony syncs to node1, no firewall, no env file")
def _clean(plan: LabPlan) -> None:
    """No fault. Every node's /etc/hosts maps every node's hostname to its lab address (the own
    name is not on 127.0.1.1), chronyd runs everywhere (node1 serves `local stratum 8` to the
    subnet, the others sync to it with `iburst`), no firewall rules, no env file. An audit must
    report nothing at warning or above (only `env.missing`, info)."""


# --------------------------------------------------------------------------- firewall (row 1)

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
    ("firewall.master-port-blocked", "firewall.peer-ports-blocked", "probe.master-port-unreachable"),
)
def _firewalld_master(plan: LabPlan) -> None:
    """Failure mode: the firewall on the master. node1 runs its own `dbus-daemon --system` and `firewalld`
    (nftables backend, inside node1's namespaces only) with default zone `public` holding only
    the `ssh` service (plus `ntp`, so that node1 still serves time and the scenario adds no time
    finding) and the zone's default reject target: TCP to the master port 29500 and to the
    ephemeral range is rejected, SSH still works, the other nodes have no rules.
    Findings: firewall.master-port-blocked and firewall.peer-ports-blocked on node1, and the
    probe.master-port-unreachable probes from the workers."""
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


def iptables_rules(port: int, lo: int, hi: int) -> str:
    return "\n".join(
        [
            "# ddpfix lab (iptables-worker): a host firewall that lets SSH in but rejects the ephemeral range",
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            "-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
            f"-A INPUT -p tcp -m tcp --dport {port} -j ACCEPT",
            f"-A INPUT -p tcp -m tcp --dport {lo}:{hi} -j REJECT --reject-with tcp-reset",
            "COMMIT",
            "",
        ]
    )


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
    ("firewall.peer-ports-blocked",),
    min_nodes=2,
)
def _iptables_worker(plan: LabPlan) -> None:
    """Failure mode: the firewall on a worker. The highest-address node (nodeN) gets an iptables INPUT chain:
    accept established/related, lo, tcp/22 and the master port, then REJECT (tcp-reset) TCP to
    its `net.ipv4.ip_local_port_range` (32768:60999), also saved in its /etc/iptables/rules.v4.
    Finding: firewall.peer-ports-blocked on nodeN (probe.peer-unreachable when a peer probes it).
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
    ("firewall.peer-ports-blocked", "probe.peer-unreachable"),
    min_nodes=3,
)
def _nftables_worker2(plan: LabPlan) -> None:
    """Failure mode: the firewall with a native nftables rule set (no iptables, no firewalld), persisted in node2's
    /etc/nftables.conf: TCP from peers is dropped silently (timeouts, not refusals).
    Findings: firewall.peer-ports-blocked on node2; probe.peer-unreachable on the nodes that dial it."""
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


FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SKEWED_PYTHON = "/etc/ddpfix-lab/python3-skewed"


def _install_skewed_python(rt: Runtime, node: NodePlan) -> None:
    rt.write_etc(
        node,
        "ddpfix-lab/python3-skewed",
        "#!/bin/sh\n# ddpfix lab (clock-skew): this node's userland clock reads 5 s ahead (libfaketime);\n"
        "# the kernel clock is untouched.\n"
        f'LD_PRELOAD={FAKETIME_LIB} FAKETIME=+5s exec /usr/bin/python3 "$@"\n',
        mode=0o755,
    )


@scenario(
    "clock-skew",
    "the highest-address node's clock, as its Python (Ansible's interpreter) reads it, is 5 s ahead (libfaketime)",
    ("time.skew",),
    min_nodes=2,
)
def _clock_skew(plan: LabPlan) -> None:
    """Failure mode: time without touching the one kernel clock all lab nodes share: on nodeN the interpreter
    Ansible runs (ansible_python_interpreter) is /usr/bin/python3 under libfaketime with FAKETIME=+5s, so every
    fact that node reports carries a wall clock 5 s ahead of the others. Finding: time.skew (cluster-wide)."""
    node = last(plan)
    node.tasks.append(_install_skewed_python)
    node.hostvars["ansible_python_interpreter"] = SKEWED_PYTHON


@scenario(
    "iptables-worker2",
    "the iptables-worker rules on node2, which higher-address peers dial (breaks a Gloo all-reduce)",
    ("firewall.peer-ports-blocked",),
    min_nodes=3,
)
def _iptables_worker2(plan: LabPlan) -> None:
    """Same rules as `iptables-worker`, on node2: in a 3+ node lab node3 dials node2's Gloo
    listener on an ephemeral port, so `verify --torch` fails. Finding: firewall.peer-ports-blocked
    on node2."""
    _iptables_on(plan.nodes[1])


# --------------------------------------------------------------------------- /etc/hosts (rows 2, 3, 10)


@scenario(
    "hostname-loopback",
    "two nodes (incl. the highest-address one) map their own hostname to 127.0.1.1, Debian-style",
    ("hosts.hostname-loopback",),
    min_nodes=2,
)
def _hostname_loopback(plan: LabPlan) -> None:
    """Failure mode: hostname on loopback. On nodeN and node(N-1) /etc/hosts has the Debian installer's
    `127.0.1.1 <own hostname>` line and no other line for the own name, so `getent ahosts
    $(hostname)` gives 127.0.1.1 and Gloo would advertise loopback. Finding:
    hosts.hostname-loopback on those two nodes."""
    for node in plan.nodes[-2:]:
        hosts = [(a, [x for x in names if x != node.hostname]) for a, names in node.hosts]
        hosts = [(a, names) for a, names in hosts if names]
        at = next((i + 1 for i, (a, _) in enumerate(hosts) if a == "127.0.0.1"), 0)
        hosts.insert(at, ("127.0.1.1", [node.hostname]))
        node.hosts = hosts


@scenario(
    "peer-unresolvable",
    "node2's /etc/hosts lacks the other nodes (and the resolver answers nothing)",
    ("hosts.peer-unresolvable",),
    min_nodes=2,
)
def _peer_unresolvable(plan: LabPlan) -> None:
    """Failure mode: peer name resolution. node2's /etc/hosts only knows localhost and itself; with the resolver at
    127.0.0.1 (nothing listens) no peer name resolves there. Finding: hosts.peer-unresolvable on
    node2 for every other node."""
    node = plan.nodes[1]
    peers = {n.hostname for n in plan.nodes if n is not node} | {n.name for n in plan.nodes if n is not node}
    node.hosts = [(a, names) for a, names in node.hosts if not set(names) & peers]


@scenario(
    "peer-mismatch",
    f"node1 maps node2's name to {WRONG_PEER_ADDR}, outside the subnet (never contacted)",
    ("hosts.peer-mismatch",),
    min_nodes=2,
)
def _peer_mismatch(plan: LabPlan) -> None:
    """Failure mode: peer name resolution. node1's /etc/hosts maps node2's hostname to 198.51.100.7 (TEST-NET-2,
    outside the cluster CIDR; the lab has no route out, and nothing is ever sent there), while
    every other node maps it to node2's lab address. Finding: hosts.peer-mismatch on node1
    (node2 resolves outside the CIDR / differently on different nodes)."""
    node, peer = plan.nodes[0], plan.nodes[1]
    node.hosts = [(WRONG_PEER_ADDR if peer.hostname in names else a, names) for a, names in node.hosts]


@scenario(
    "duplicate-hostname",
    "the highest-address node has the same hostname as node(N-1), like a cloned VM",
    ("hosts.duplicate-hostname", "hosts.name-form-differs"),
    min_nodes=2,
)
def _duplicate_hostname(plan: LabPlan) -> None:
    """Failure mode: duplicate hosts. nodeN's hostname (UTS and /etc/hostname) is node(N-1)'s; inventory names
    stay unique and every /etc/hosts still maps the inventory names to the lab addresses (so the
    clone's own name resolves to its twin's address). Findings: hosts.duplicate-hostname (cluster), and
    hosts.name-form-differs on nodeN (its hostname resolves to an address it does not hold)."""
    plan.nodes[-1].hostname = plan.nodes[-2].hostname


@scenario(
    "hosts-bindmount",
    "node2's /etc/hosts is a single-file bind mount over its /etc (like Docker); content is correct",
    (),
)
def _hosts_bindmount(plan: LabPlan) -> None:
    """Container-style /etc/hosts: on node2 (node1 in a one-node lab) /etc/hosts is a bind mount
    of /run/ddpfix-lab-hosts, so an atomic rename onto it fails with EBUSY (remediation must
    write it in place). The content is the clean one: no finding by itself; combine with
    another hosts scenario to see remediation cope with it."""
    second(plan).tasks.append(_bind_hosts)


def _bind_hosts(rt: Runtime, node: NodePlan) -> None:
    rt.write_run(node, "ddpfix-lab-hosts", rt.hosts_text(node))
    rt.exec(node, ["mount", "--bind", "/run/ddpfix-lab-hosts", "/etc/hosts"])


# --------------------------------------------------------------------------- interfaces (rows 4, 5, 11)


@scenario(
    "ifname-mismatch",
    "eth0 on odd nodes, ens5 on even nodes, and env files everywhere saying GLOO/NCCL_SOCKET_IFNAME=eth0",
    ("netif.missing", "netif.name-mismatch"),
    min_nodes=2,
)
def _ifname_mismatch(plan: LabPlan) -> None:
    """Failure mode: interface names. The cluster NIC is `eth0` on node1, node3, ... and `ens5` on node2,
    node4, ... (overrides --ifnames); every node has an existing /etc/ddpfix/ddp.env with
    GLOO/NCCL/TP_SOCKET_IFNAME=eth0 and otherwise right values (MASTER_ADDR,
    MASTER_PORT, NNODES, NODE_RANK, WORLD_SIZE). Findings: netif.missing on the ens5 nodes,
    netif.name-mismatch (cluster)."""
    for n in plan.nodes:
        n.ifname = "eth0" if n.index % 2 else "ens5"
    set_env_everywhere(plan, GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0")


@scenario(
    "autoselect-wrong",
    "node2 also has docker0 (172.17.0.1/16) and br-<id> (172.18.0.1/16) + veth, indexed before the cluster NIC",
    ("netif.autoselect-wrong",),
)
def _autoselect_wrong(plan: LabPlan) -> None:
    """Failure mode: NIC auto-selection. node2 (node1 in a one-node lab) has Docker-like interfaces created before
    its cluster NIC, so they come first in interface-index (getifaddrs) order: `docker0`
    172.17.0.1/16 (excluded by NCCL's default `^docker,lo,virbr`) and a user-network bridge
    `br-3f9a1c2b7d10` 172.18.0.1/16 with a veth `veth6c2e1f4` attached (up), which NCCL's default
    selection does not exclude and therefore picks instead of the cluster NIC. No env file and no
    IFNAME anywhere. Finding: netif.autoselect-wrong on that node."""
    node = second(plan)
    node.pre_links += [
        "link add docker0 type bridge",
        "addr add 172.17.0.1/16 dev docker0",
        "link set docker0 up",
        "link add br-3f9a1c2b7d10 type bridge",
        "addr add 172.18.0.1/16 dev br-3f9a1c2b7d10",
        "link add veth6c2e1f4 type veth peer name veth6c2e1f4p",
        "link set veth6c2e1f4 master br-3f9a1c2b7d10",
        "link set veth6c2e1f4p up",
        "link set veth6c2e1f4 up",
        "link set br-3f9a1c2b7d10 up",
    ]


#: the keys an earlier scenario's env file may set that would hide NCCL's and Gloo's automatic choice
_IFNAME_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def _unset_ifnames(node: NodePlan) -> None:
    """Leave the automatic choice to NCCL and Gloo on `node`: drop the IFNAME keys from an env file an earlier
    scenario of the same lab wrote (lab B's env-wrong writes one everywhere)."""
    if node.env is not None:
        node.env = {k: v for k, v in node.env.items() if k not in _IFNAME_KEYS}


@scenario(
    "autoselect-overlay",
    "node1 has flannel's flannel.1 and a CNI bridge cni0 (+ veth) indexed before its cluster NIC; no IFNAME",
    expect=(
        Expect("netif.autoselect-wrong", "node1", lambda info: [
            "flannel.1=10.244.1.0", f"{info.node('node1').ifname}={info.node('node1').address}",
            "flannel overlay"]),
    ),
)
def _autoselect_overlay(plan: LabPlan) -> None:
    """Failure mode: NIC auto-selection on a Kubernetes node. node1 gets what flannel leaves on a node before its
    cluster NIC (lower interface indexes, so first in getifaddrs order): `flannel.1` 10.244.1.0/32 (a veth named like
    flannel's VXLAN device: NCCL goes by name and address, and the lab needs no vxlan module) and the CNI bridge `cni0`
    10.244.1.1/24 with a pod veth attached (up and running). NCCL excludes neither (only docker*, lo*, virbr*), so
    with NCCL_SOCKET_IFNAME unset its bootstrap would listen on flannel.1. The IFNAME keys stay unset on node1 (removed
    from an env file an earlier scenario wrote). Finding: netif.autoselect-wrong on node1."""
    node = plan.master
    node.pre_links += [
        "link add flannel.1 type veth peer name flannel.1p",
        "addr add 10.244.1.0/32 dev flannel.1",
        "link set flannel.1p up",
        "link set flannel.1 up",
        "link add cni0 type bridge",
        "addr add 10.244.1.1/24 dev cni0",
        "link add veth9f3e2a1b type veth peer name veth9f3e2a1bp",
        "link set veth9f3e2a1b master cni0",
        "link set veth9f3e2a1bp up",
        "link set veth9f3e2a1b up",
        "link set cni0 up",
    ]
    _unset_ifnames(node)


LINK_LOCAL_NET = ipaddress.ip_network("169.254.0.0/16")  # RFC 3927: never routed, so never a path between nodes


@scenario(
    "autoselect-linklocal",
    "node2 has a BMC-style USB NIC usb0 with a link-local 169.254.3.x/16 address indexed before its cluster NIC",
    min_nodes=2,
    expect=(
        Expect("netif.autoselect-wrong", "node2", lambda info: [
            f"usb0=169.254.3.{10 + 2}", f"{info.node('node2').ifname}={info.node('node2').address}",
            "link-local, 169.254.0.0/16"]),
    ),
)
def _autoselect_linklocal(plan: LabPlan) -> None:
    """Failure mode: NIC auto-selection on a server whose BMC exposes a USB network interface (Redfish host
    interface, iDRAC/XClarity/iLO `usb0` with a 169.254.x.x address): node2 gets `usb0` (a veth, up) with
    169.254.3.<10+i>/16 before its cluster NIC. NCCL picks it first; a link-local address is never routed, so no
    peer reaches the bootstrap listener there (uccl-project/uccl#1034). The IFNAME keys stay unset on node2 (removed
    from an env file an earlier scenario wrote). Finding: netif.autoselect-wrong on node2."""
    node = second(plan)
    node.pre_links += [
        "link add usb0 type veth peer name usb0p",
        f"addr add {LINK_LOCAL_NET.network_address + 3 * 256 + 10 + node.index}/16 dev usb0",
        "link set usb0p up",
        "link set usb0 up",
    ]
    _unset_ifnames(node)


@scenario(
    "mtu-mismatch",
    "the highest-address node's cluster NIC has MTU 1400, the others 1500",
    ("netif.mtu-mismatch",),
    min_nodes=2,
)
def _mtu_mismatch(plan: LabPlan) -> None:
    """Failure mode: MTU. nodeN's cluster NIC has MTU 1400 (its switch port stays at 1500).
    Finding: netif.mtu-mismatch (cluster, naming nodeN)."""
    last(plan).mtu = 1400


@scenario(
    "netif-down",
    "the highest-address node's configured socket interface (ddp_socket_ifname=ens6, in the CIDR) is down",
    ("netif.down",),
)
def _netif_down(plan: LabPlan) -> None:
    """A cluster interface that is down while SSH still works. Design: nodeN gets a second veth
    onto the lab switch, `ens6` (or `ens7` if ens6 is taken), with an address in the cluster CIDR
    (the first address after the node addresses), and the link is down; the inventory sets
    `ddp_socket_ifname: ens6` for nodeN, so ens6 is its configured cluster interface, while
    Ansible keeps reaching nodeN on its management address on the primary NIC.
    Finding: netif.down on nodeN. Bringing ens6 up would give the node two interfaces in one
    subnet; remediation reports this finding rather than fixing it."""
    node = last(plan)
    name = unused_ifname(node, "ens6", "ens7", "eth9")
    addr = ipaddress.IPv4Interface(f"{plan.spare_address(1)}/{plan.subnet.prefixlen}")
    node.extra_nics.append(ExtraNic(name, addr, up=False))
    node.hostvars["ddp_socket_ifname"] = name


# --------------------------------------------------------------------------- addresses and routes (rows 7, 8)


@scenario(
    "master-addr-public",
    f"env files everywhere with MASTER_ADDR={PUBLIC_MASTER_ADDR} (a public/NAT address), the rest right",
    ("addr.master-not-private",),
)
def _master_addr_public(plan: LabPlan) -> None:
    """Failure mode: env files. Every node has an existing /etc/ddpfix/ddp.env whose MASTER_ADDR is
    203.0.113.10 (TEST-NET-3, configuration text only: the lab has no route out and nothing
    connects to it), everything else right (port, ranks, sizes, own interface).
    Finding: addr.master-not-private."""
    set_env_everywhere(plan, MASTER_ADDR=PUBLIC_MASTER_ADDR)


@scenario(
    "env-wrong",
    "env files everywhere; on the highest-address node MASTER_ADDR is not the master and the IFNAME does not exist",
    ("env.inconsistent", "addr.master-not-private", "netif.missing"),
    min_nodes=2,
)
def _env_wrong(plan: LabPlan) -> None:
    """Every node has an existing /etc/ddpfix/ddp.env; the one on nodeN has MASTER_ADDR = node2's
    lab address (a lab address that is not the master's) and GLOO/NCCL_SOCKET_IFNAME naming an
    interface that does not exist there (`eth1`, or `ens4` if eth1 is taken). The files disagree
    between nodes. Findings: env.inconsistent (cluster), addr.master-not-private and netif.missing
    on nodeN."""
    set_env_everywhere(plan)
    node = last(plan)
    bad_if = unused_ifname(node, "eth1", "ens4")
    node.env = plan.env_for(
        node, MASTER_ADDR=str(plan.nodes[1].address), GLOO_SOCKET_IFNAME=bad_if, NCCL_SOCKET_IFNAME=f"={bad_if}"
    )


@scenario(
    "route-via-gateway",
    "the highest-address node routes to the master through a gateway (`ip route get` shows `via`)",
    ("route.via-gateway",),
    min_nodes=2,
)
def _route_via_gateway(plan: LabPlan) -> None:
    """Failure mode: routes. nodeN has `ip route add <master>/32 via <gw> dev <nic>`. With 3+ nodes
    the gateway is node2, which forwards (ip_forward=1, no ICMP redirects, in node2's namespace
    only), so traffic still arrives but goes around; with 2 nodes it is the lab's non-existent
    gateway address (traffic to the master is then lost inside the lab). nodeN ignores ICMP
    redirects. Finding: route.via-gateway on nodeN."""
    node = last(plan)
    if len(plan.nodes) >= 3:
        router = plan.nodes[1]
        gw = router.address
        router.sysctls.update(
            {
                "net.ipv4.ip_forward": "1",
                "net.ipv4.conf.all.send_redirects": "0",
                f"net.ipv4.conf.{router.ifname}.send_redirects": "0",
            }
        )
    else:
        gw = plan.gateway
    node.sysctls.update(
        {"net.ipv4.conf.all.accept_redirects": "0", f"net.ipv4.conf.{node.ifname}.accept_redirects": "0"}
    )
    node.post_ip.append(f"route add {plan.master.address}/32 via {gw} dev {node.ifname}")


# --------------------------------------------------------------------------- time (row 9)


@scenario(
    "chrony-absent",
    "no chronyd running on any node (the chrony package and its config stay in place)",
    ("time.no-daemon",),
)
def _chrony_absent(plan: LabPlan) -> None:
    """Failure mode: time. No node runs chronyd (nor any other NTP client). The chrony package is
    installed (/usr is the host's) and each node's /etc/chrony keeps the lab configuration and
    `DAEMON_OPTS="-F 1 -x"` (so that starting it never touches the real clock).
    Finding: time.no-daemon on every node."""
    for n in plan.nodes:
        n.chrony = None


# --------------------------------------------------------------------------- the launch path's host environment

SMALL_SHM = "64m"  # Docker's default --shm-size


@scenario(
    "shm-small",
    f"the highest-address node's /dev/shm is remounted with size={SMALL_SHM} (Docker's default)",
    expect=(
        Expect("host.shm-small", "node3", lambda info: [
            "statvfs /dev/shm: 67108864 bytes (64 MiB)", "size=65536k", "GPUs per node: 1"]),
    ),
)
def _shm_small(plan: LabPlan) -> None:
    """Failure mode: shared memory. Every lab node has its own /dev/shm (a tmpfs in its mount namespace, sized
    half the machine's RAM by default); on nodeN it is remounted with size=64m once the node is up, what a
    container gets from Docker without --shm-size or --ipc=host. Finding: host.shm-small on nodeN."""
    last(plan).tasks.append(_remount_shm)


def _remount_shm(rt: Runtime, node: NodePlan) -> None:
    rt.exec(node, ["mount", "-o", f"remount,size={SMALL_SHM}", "/dev/shm"])


STRAY_PROFILE = "profile.d/zz-site-ddp.sh"  # under the node's /etc


@scenario(
    "env-stray",
    "node2's /etc/environment says NODE_RANK=0 (a golden image from the master) and a profile.d script exports "
    "NCCL_SOCKET_IFNAME=eth1 and RANK=0",
    min_nodes=2,
    expect=(
        Expect("env.stray", "node2", lambda info: [
            "/etc/environment:2: NODE_RANK=0 (the env file sets NODE_RANK=1; read by pam_env",
            f"/etc/{STRAY_PROFILE}:3: NCCL_SOCKET_IFNAME=eth1 (the env file sets "
            f"NCCL_SOCKET_IFNAME=={info.node('node2').ifname}",
            f"/etc/{STRAY_PROFILE}:4: RANK=0 (not in the env file"]),
    ),
)
def _env_stray(plan: LabPlan) -> None:
    """Failure mode: launcher variables set elsewhere (Lightning-AI/pytorch-lightning#5651). node2's
    /etc/environment (read by pam_env for every SSH session) carries NODE_RANK=0, as an image built on the master
    would, and /etc/profile.d/zz-site-ddp.sh (login shells) exports NCCL_SOCKET_IFNAME=eth1 and RANK=0. ddpfix
    reads them as text (never sourcing them) and compares them with the env file it plans for node2.
    Finding: env.stray on node2, naming each file and line."""
    node = second(plan)
    node.files["environment"] = f"PATH=\"{NODE_PATH}\"\nNODE_RANK=0\n"
    node.files[STRAY_PROFILE] = (
        "# a site script left from an older cluster (ddpfix lab scenario env-stray)\n"
        "[ -n \"$PS1\" ] || true\n"
        "export NCCL_SOCKET_IFNAME=eth1\n"
        "export RANK=0\n"
    )


# --------------------------------------------------------------------------- ports (row 12)


@scenario(
    "port-in-use",
    "a process started by the lab already listens on the master port 29500 on node1",
    ("probe.port-in-use",),
)
def _port_in_use(plan: LabPlan) -> None:
    """Failure mode: the master port. node1 runs a small Python listener on 0.0.0.0:29500 (the master port),
    started by the lab and killed by its PID on `lab down`. Finding: probe.port-in-use on node1."""
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


# --------------------------------------------------------------------------- audit-only scenarios (no remediation)


def world_open_rules(port: int, cidr: str) -> str:
    return "\n".join(
        [
            "# ddpfix lab (world-open): the master port is open to any source; the cluster CIDR is trusted",
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            "-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
            f"-A INPUT -p tcp -m tcp --dport {port} -j ACCEPT",
            f"-A INPUT -s {cidr} -j ACCEPT",
            "-A INPUT -j REJECT --reject-with icmp-port-unreachable",
            "COMMIT",
            "",
        ]
    )


@scenario(
    "world-open",
    "iptables on node1 accepts the master port from any source (no -s), trusts the subnet, rejects the rest",
    ("firewall.world-open",),
)
def _world_open(plan: LabPlan) -> None:
    """Failure mode: the firewall, the over-open variant. node1's iptables INPUT chain (also saved in its
    /etc/iptables/rules.v4): accept established/related, lo, tcp/22, then `-p tcp --dport 29500
    -j ACCEPT` with no source restriction (the master port is open to 0.0.0.0/0), then accept the
    lab subnet, then REJECT everything else. Peers and NTP work (they are in the subnet).
    Finding: firewall.world-open on node1 (nothing else)."""
    plan.master.tasks.append(_load_world_open)


def _load_world_open(rt: Runtime, node: NodePlan) -> None:
    rt.write_etc(node, "iptables/rules.v4", world_open_rules(rt.plan.master_port, str(rt.plan.subnet)))
    rt.exec(node, ["iptables-restore", "/etc/iptables/rules.v4"])


@scenario(
    "chrony-unsynced",
    "chronyd -x runs on the highest-address node, its only source an unused lab address: never synchronised",
    ("time.unsynchronized",),
)
def _chrony_unsynced(plan: LabPlan) -> None:
    """Failure mode: time, the daemon-but-no-sync variant. On nodeN chronyd runs (with the lab's
    `-F 1 -x`, so it never touches the clock) but its only source is `server <unused lab address>
    iburst`: the third address after the node addresses, which no node holds (NTP requests stay
    on the lab switch and are never answered). `chronyc tracking` shows leap status
    "Not synchronised". The lab starts this chronyd itself and records it as `chronyd-unsynced`,
    so `lab up` does not wait for it to synchronise. Finding: time.unsynchronized on nodeN."""
    node = last(plan)
    node.chrony = None  # not the lab's own chronyd (which `up` waits to synchronise)
    node.files["chrony/conf.d/lab.conf"] = (
        f"# ddpfix lab (chrony-unsynced): an address nobody holds\nserver {plan.spare_address(3)} iburst\n"
    )
    node.tasks.append(_start_unsynced_chrony)


def _start_unsynced_chrony(rt: Runtime, node: NodePlan) -> None:
    rt.exec(node, ["/etc/init.d/chrony", "start"])
    rt.wait_for(lambda: rt.read_run(node, "chrony/chronyd.pid") is not None, 10, f"chronyd on {node.name}")
    rt.record_pidfile(node, "chronyd-unsynced", "/run/chrony/chronyd.pid")


HANDWRITTEN_CHRONY_CONF = """# Hand-written chrony configuration (ddpfix lab, {scenario}): no confdir, no include.
server {source} iburst
driftfile /var/lib/chrony/{drift}
makestep 1 3
"""


@scenario(
    "chrony-no-confdir",
    "the highest-address node's hand-written /etc/chrony/chrony.conf has no confdir/include; chronyd -x runs unsynced",
    ("time.unsynchronized",),
)
def _chrony_no_confdir(plan: LabPlan) -> None:
    """Issue 8 item 8 (a fix must reach the file the service reads). nodeN's /etc/chrony/chrony.conf is
    hand-written: one `server <unused lab address> iburst` (nobody answers), a driftfile and makestep, and
    no `confdir`/`include`, so nothing in /etc/chrony/conf.d is read (the lab's own conf.d/lab.conf is
    emptied to a comment there). chronyd runs with the lab's `-F 1 -x` (never touches the clock) and is
    recorded as `chronyd-unsynced`. Finding: time.unsynchronized on nodeN; remediate must add a
    managed `confdir` line to that file, or its drop-in is never read."""
    node = last(plan)
    node.chrony = None
    node.files["chrony/chrony.conf"] = HANDWRITTEN_CHRONY_CONF.format(
        scenario="chrony-no-confdir", source=plan.spare_address(3), drift="chrony.drift"
    )
    node.files["chrony/conf.d/lab.conf"] = "# ddpfix lab (chrony-no-confdir): not read, chrony.conf has no confdir\n"
    node.tasks.append(_start_unsynced_chrony)


@scenario(
    "chrony-rhel-layout",
    "the highest-address node has RHEL's layout: chronyd -f /etc/chrony.conf (no confdir), no /etc/chrony/; unsynced",
    ("time.unsynchronized",),
)
def _chrony_rhel_layout(plan: LabPlan) -> None:
    """Issue 8 item 8, RHEL's layout. On nodeN chronyd reads /etc/chrony.conf (`-f /etc/chrony.conf` in
    /etc/default/chrony's DAEMON_OPTS, besides the lab's `-F 1 -x`), as RHEL's chronyd reads its
    compiled-in /etc/chrony.conf; that file has one `server <unused lab address> iburst`, a driftfile
    and makestep, and no confdir/include (RHEL's default reads no drop-in directory). /etc/chrony/ is
    removed from the node's /etc. chronyd runs unsynced, recorded as `chronyd-unsynced`.
    Finding: time.unsynchronized on nodeN; the fix must write /etc/chrony.d and make /etc/chrony.conf read it."""
    node = last(plan)
    node.chrony = None
    node.files["chrony.conf"] = HANDWRITTEN_CHRONY_CONF.format(
        scenario="chrony-rhel-layout", source=plan.spare_address(3), drift="drift"
    )
    node.files["default/chrony"] = (
        "# ddpfix lab (chrony-rhel-layout): -x = never adjust the system clock; "
        'RHEL\'s configuration file\nDAEMON_OPTS="-F 1 -x -f /etc/chrony.conf"\n'
    )
    node.tasks.append(_remove_debian_chrony_dir)
    node.tasks.append(_start_unsynced_chrony)


def _remove_debian_chrony_dir(rt: Runtime, node: NodePlan) -> None:
    rt.exec(node, ["rm", "-rf", "--one-file-system", "/etc/chrony"])  # the node's private /etc copy


@scenario(
    "machine-id-clone",
    "the highest-address node has the same /etc/machine-id as node(N-1), like a cloned VM",
    ("hosts.duplicate-machine-id",),
    min_nodes=2,
)
def _machine_id_clone(plan: LabPlan) -> None:
    """Failure mode: duplicate hosts (clone leftovers). nodeN and node(N-1) share one /etc/machine-id;
    hostnames stay unique. Finding: hosts.duplicate-machine-id (cluster, naming both nodes)."""
    mid = hashlib.sha256(f"ddpfix-lab-{plan.name}-clone".encode()).hexdigest()[:32]
    for node in plan.nodes[-2:]:
        node.files["machine-id"] = mid + "\n"


@scenario(
    "somaxconn-low",
    "net.core.somaxconn on node1 (per network namespace) is below the world size",
    ("net.somaxconn-low",),
    min_nodes=2,
)
def _somaxconn_low(plan: LabPlan) -> None:
    """Failure mode: the master port at scale, in miniature. node1's network namespace has net.core.somaxconn
    = N-1 (N nodes, one process each, so the world size is N): the master's listen backlog is
    smaller than the number of ranks dialling it at once. sysctl of node1's namespace only.
    Finding: net.somaxconn-low on node1."""
    plan.master.sysctls["net.core.somaxconn"] = str(len(plan.nodes) - 1)


STORAGE_NET = ipaddress.ip_network("172.31.0.0/24")  # a second IPv4 network inside a node (never routed out)


@scenario(
    "rp-filter-strict",
    "node2 is multi-homed (a second IPv4 NIC stor0) and its cluster NIC has strict reverse-path filtering "
    "(rp_filter 1)",
    min_nodes=2,
    expect=(
        Expect(
            "net.rp-filter-strict",
            "node2",
            lambda info: [
                f"net.ipv4.conf.{info.node('node2').ifname}.rp_filter = 1 (effective 1, strict)",
                f"{info.node('node2').ifname} {info.node('node2').address}",
                f"stor0 {STORAGE_NET.network_address + 12}",
            ],
        ),
    ),
)
def _rp_filter_strict(plan: LabPlan) -> None:
    """Strict reverse-path filtering on a multi-homed node. node2 gets a second IPv4 interface `stor0`
    (172.31.0.<10+i>/24; a veth whose peer `stor0p` stays inside the node), created after the cluster NIC so NCCL's
    default order still picks the cluster NIC, and its network namespace has net.ipv4.conf.<cluster NIC>.rp_filter
    = 1 (net.ipv4.conf.* is per network namespace; conf.all stays 0). The lab's own traffic still flows (every
    peer is on-link on the cluster NIC), as on a real node until a route back leaves by the other NIC.
    Finding: net.rp-filter-strict on node2."""
    if plan.subnet.overlaps(STORAGE_NET):
        raise LabError(
            f"scenario rp-filter-strict uses {STORAGE_NET} inside node2: pick another --subnet", ExitCode.INVALID_INPUT
        )
    node = second(plan)
    node.post_ip += [
        "link add stor0 type veth peer name stor0p",
        f"addr add {STORAGE_NET.network_address + 10 + node.index}/{STORAGE_NET.prefixlen} dev stor0",
        "link set stor0p up",
        "link set stor0 up",
    ]
    node.sysctls[f"net.ipv4.conf.{node.ifname}.rp_filter"] = "1"


NOFILE_LAB_SOFT = 512  # below what lab B's 3 nodes need (ddpfix.hostenv.nofile_needed(3) = 896)


@scenario(
    "nofile-low",
    f"node2's SSH logins get a soft open-file limit of {NOFILE_LAB_SOFT} from a site limits.d file",
    min_nodes=2,
    expect=(
        Expect("limits.nofile-low", "node2",
               lambda info: [f"RLIMIT_NOFILE of the ssh session: soft {NOFILE_LAB_SOFT}", "needed at 3 nodes: 896"]),
    ),
)
def _nofile_low(plan: LabPlan) -> None:
    """node2's sshd uses PAM (UsePAM yes, as on a stock distribution) and /etc/security/limits.d/10-site-nofile.conf
    sets `soft nofile 512` for * and root, so every SSH session there (the launch path of a login shell) may open
    512 files, fewer than NCCL and Gloo need at 3 nodes. Finding: limits.nofile-low on node2; ddpfix remediate
    --apply writes 90-ddpfix-nofile.conf (a later file, so it wins) within the session's hard limit."""
    victim = second(plan)
    victim.files["ssh/sshd_config.d/00-ddpfix-lab-0pam.conf"] = (
        "# ddpfix lab (nofile-low): PAM on, so pam_limits applies limits.d to new logins\nUsePAM yes\n"
    )
    victim.files["security/limits.d/10-site-nofile.conf"] = (
        "# a site default left from an old image (ddpfix lab scenario nofile-low)\n"
        f"*     soft  nofile  {NOFILE_LAB_SOFT}\nroot  soft  nofile  {NOFILE_LAB_SOFT}\n"
    )


ARP_LAB_IFNAME = "arp0"
ARP_LAB_SPARE = 6  # plan.spare_address(6): an address of the cluster network nobody else holds


def inner_veth(ifname: str, address: str) -> list[str]:
    """`ip -batch` lines for a veth `ifname` holding `address`, up, whose peer (`ifname`p) stays inside the node: an
    interface that carries an address but reaches nothing outside."""
    return [f"link add {ifname} type veth peer name {ifname}p", f"addr add {address} dev {ifname}",
            f"link set {ifname}p up", f"link set {ifname} up"]


def _arp_node(plan: LabPlan) -> NodePlan:
    return plan.nodes[2] if len(plan.nodes) > 2 else plan.nodes[-1]


@scenario(
    "arp-flux",
    f"node3 has a second interface ({ARP_LAB_IFNAME}) with an address in the cluster network and the ARP sysctls at "
    "their defaults",
    min_nodes=2,
    expect=(
        Expect("net.arp-flux", "node3", lambda info: [
            "net.ipv4.conf.all.arp_ignore = 0, arp_announce = 0",
            f"{info.node('node3').ifname} {info.node('node3').address}: arp_ignore 0, arp_announce 0 (effective 0/0)",
            f"{ARP_LAB_IFNAME} ",
        ]),
    ),
)
def _arp_flux(plan: LabPlan) -> None:
    """ARP flux: node3 (the last node) gets a second interface arp0 (a veth whose peer arp0p stays inside the node),
    up, holding a /32 of the cluster network (no
    second on-link route, so the lab's own traffic keeps to the cluster NIC), created after the cluster NIC so
    NCCL's default order still picks the cluster NIC; net.ipv4.conf.*.arp_ignore/arp_announce stay 0 (per network
    namespace). The cluster NIC then answers ARP for arp0's address too. Finding: net.arp-flux on node3; ddpfix
    remediate --apply sets arp_ignore 1 / arp_announce 2 on both, at runtime and in /etc/sysctl.d."""
    node = _arp_node(plan)
    node.post_ip += inner_veth(ARP_LAB_IFNAME, f"{plan.spare_address(ARP_LAB_SPARE)}/32")


TORCH_LAB_FAKE = "2.4.1+cu121"


@scenario(
    "torch-version-mismatch",
    f"node3's ddp_python is a stand-in that reports torch {TORCH_LAB_FAKE} (CUDA 12.1, NCCL 2.20.5); the others run "
    "the lab's torch",
    min_nodes=2,
    expect=(
        Expect("env.torch-version-mismatch", "node3", lambda info: [
            f"on node3: torch {TORCH_LAB_FAKE} (CUDA 12.1, NCCL 2.20.5)", "node1: torch ",
        ]),
    ),
)
def _torch_version_mismatch(plan: LabPlan) -> None:
    """node3's ddp_python (host var) is a stand-in script in its /run that prints what ddpfix's torch reader prints
    for a CUDA 12.1 build of torch 2.4.1 with NCCL 2.20.5; the other nodes run the lab's interpreter (torch 2.13.0,
    CPU). Finding: env.torch-version-mismatch on node3 (detect only)."""
    node = _arp_node(plan)
    node.hostvars["ddp_python"] = f"/run/{FABRIC_RUN}/bin/python-torch"
    text = (
        "#!/bin/sh\n# ddpfix lab stand-in: what ddpfix's torch reader prints for a CUDA 12.1 build of torch 2.4.1\n"
        f"echo '{{\"version\": \"{TORCH_LAB_FAKE}\", \"cuda\": \"12.1\", \"hip\": null, \"nccl\": \"2.20.5\", "
        "\"error\": null}'\n"
    )
    node.tasks.append(_stub_task("python-torch", text))


def ula_address(plan: LabPlan, node: NodePlan) -> str:
    """The lab's IPv6 ULA address of `node` (fd00:dd:<3rd octet of the subnet>::<10+index>)."""
    return f"fd00:dd:{plan.subnet.network_address.packed[2]:x}::{10 + node.index:x}"


@scenario(
    "family-mismatch",
    "every node also has an IPv6 ULA on its NIC; the highest-address node's /etc/hosts maps its peers to IPv6 only",
    ("addr.family-mismatch",),
    min_nodes=2,
)
def _family_mismatch(plan: LabPlan) -> None:
    """Failure mode: addresses (address family). Every node gets an IPv6 ULA address
    (fd00:dd:<3rd octet>::<10+i>/64, see `ula_address`) on its cluster NIC besides its IPv4
    address; on nodeN /etc/hosts maps every peer's hostname to the peer's ULA only, while the
    other nodes map them to IPv4. So peers resolve to IPv6 on nodeN and to IPv4 elsewhere (and to
    an address outside the IPv4 cluster CIDR on nodeN). Findings: addr.family-mismatch (cluster),
    and hosts.peer-mismatch on nodeN."""
    for n in plan.nodes:
        n.post_ip.append(f"addr add {ula_address(plan, n)}/64 dev {n.ifname} nodad")
    node = last(plan)
    peers = {m.hostname: m for m in plan.nodes if m is not node}
    hosts = [(a, [x for x in names if x not in peers]) for a, names in node.hosts]
    node.hosts = [(a, names) for a, names in hosts if names]
    node.hosts += [(ula_address(plan, m), [hn]) for hn, m in peers.items()]


# ----------------------------------------------------------------- fleet shape (no fault: a second, data network)


def data_network(subnet: ipaddress.IPv4Network | str) -> ipaddress.IPv4Network:
    """The data network of the `multi-homed` scenario for a lab on `subnet`: 10.<3rd octet of the subnet>.0.0/24. It
    exists only inside the lab (node namespaces and the lab switch), so labs with the same data network coexist."""
    return ipaddress.IPv4Network(f"10.{ipaddress.ip_network(subnet).network_address.packed[2]}.0.0/24")


def data_address(subnet: ipaddress.IPv4Network | str, index: int) -> ipaddress.IPv4Address:
    """Node `index`'s (1-based) first address on the data network: .<10+index>, as on the management network."""
    return data_network(subnet).network_address + 10 + index


#: Interface names of the data NIC, by node index (1-based): not the same on every node, as on real fleets.
DATA_IFNAMES = ("data0", "ens6f1", "data0", "enp65s0")


@scenario(
    "multi-homed",
    "SSH and hostnames on the management network, ddp_cluster_cidr on a second (data) network: data NIC names "
    "differ per node, node3 has two data addresses",
    ("hosts.peer-name-other-network",),
    min_nodes=2,
)
def _multi_homed(plan: LabPlan) -> None:
    """No fault: the common fleet shape. Every node keeps its management NIC (SSH, the default route, /etc/hosts
    names on management addresses) and gets a data NIC onto the lab switch with an address on the data network
    10.<3rd octet>.0.<10+i>/24 (`data_network`), named `data0` on node1 and node3 and `ens6f1` on node2 (names
    differ per node, as on real fleets); node3 (when there is one) also has a second data address (.<100+i>).
    The inventory's ddp_cluster_cidr is the data network. An audit must find nothing at warning or above; after
    `remediate --apply` every env file has MASTER_ADDR = node1's data address and each node's own data NIC as its
    socket interface, and a torch all-reduce runs over the data network."""
    net = data_network(plan.subnet)
    if plan.subnet.overlaps(net):
        raise LabError(f"scenario multi-homed uses {net} inside the lab: pick another --subnet",
                       ExitCode.INVALID_INPUT)
    for n in plan.nodes:
        name = unused_ifname(n, DATA_IFNAMES[(n.index - 1) % len(DATA_IFNAMES)], "data1")
        address = ipaddress.IPv4Interface(f"{data_address(plan.subnet, n.index)}/{net.prefixlen}")
        n.extra_nics.append(ExtraNic(name, address))
        if n.index == 3:
            n.post_ip.append(f"addr add {net.network_address + 100 + n.index}/{net.prefixlen} dev {name}")
    plan.groupvars["ddp_cluster_cidr"] = str(net)


ISO_IFNAME = "iso0"
ISO_SPARE = 7  # plan.spare_address(7): an address of the cluster network nobody else holds (single-network labs)


def isolated_address(plan: LabPlan, node_index: int) -> ipaddress.IPv4Address:
    """iso0's address on node `node_index`: inside the cluster network (the data network when `multi-homed` came
    first and set ddp_cluster_cidr: .<200+i>; else the lab subnet's spare address ISO_SPARE)."""
    cidr = plan.groupvars.get("ddp_cluster_cidr")
    if cidr:
        return ipaddress.IPv4Network(str(cidr)).network_address + 200 + node_index
    return plan.spare_address(ISO_SPARE)


@scenario(
    "isolated-nic",
    f"node3's env file names {ISO_IFNAME}, an interface with a cluster-network address on a link that reaches no peer",
    ("netif.cannot-reach-peers",),
    min_nodes=2,
)
def _isolated_nic(plan: LabPlan) -> None:
    """A second NIC in the cluster network that is cabled nowhere (an unplugged port, another VLAN): node3 (the last
    node in a 2-node lab) gets `iso0`, a veth whose peer `iso0p` stays inside the node, up, holding a /32 of the
    cluster network (the data network when it follows `multi-homed` in the scenario list, else a spare address of
    the lab subnet), created after the cluster NIC; its env file names iso0 as GLOO/NCCL/TP_SOCKET_IFNAME. The
    node's ARP sysctls are the ones that stop ARP flux (net.ipv4.conf.all.arp_ignore 1, arp_announce 2), so no other
    NIC answers for iso0's address: a connect from that address (bound to it, as Gloo and NCCL bind) reaches no
    peer, and one bound to the device finds no route. torch fails on node3 until the env file names the interface
    that reaches every peer. Finding: netif.cannot-reach-peers on node3; ddpfix remediate --apply writes the
    cluster NIC with a `# GLOO_SOCKET_IFNAME:` line saying why."""
    node = _arp_node(plan)
    node.post_ip += inner_veth(ISO_IFNAME, f"{isolated_address(plan, node.index)}/32")
    node.sysctls["net.ipv4.conf.all.arp_ignore"] = "1"
    node.sysctls["net.ipv4.conf.all.arp_announce"] = "2"
    node.env = plan.env_for(node, **dict.fromkeys(_IFNAME_KEYS, ISO_IFNAME))


# ----------------------------------------------------------------- SSH setups (no fault: how the controller logs in)

LAB_USER = "ddpuser"
LAB_SSH_PORT = 2222
#: Scenarios that change how the controller reaches the nodes rather than adding a fault; combine them with a fault.
SSH_SETUPS = ("bastion", "nonroot-become", "nonroot-nobecome", "ssh-port")


@scenario(
    "bastion",
    "the controller reaches node1 only; the others through it "
    "(ProxyJump in an ssh_config the inventory's ansible.cfg names)",
    min_nodes=2,
)
def _bastion(plan: LabPlan) -> None:
    """A cluster behind a bastion (jump host), set up the way an Ansible user does it. node1 is the bastion: the lab
    switch drops the controller's SSH connections to every other node (a network ACL outside the nodes, so their
    own firewalls are untouched and node-to-node traffic is free). `lab up` writes, next to hosts.yml, an
    `ansible.cfg` with `[ssh_connection] ssh_args = -F <inventory dir>/ssh_config` and that `ssh_config`, whose
    `ProxyJump node1-address` covers the other nodes. ddpfix must read that ansible.cfg (it is not in the
    directory ddpfix runs in) and keep its ssh_args. No finding by itself: combine it with a fault."""
    plan.bastion = plan.master.name


@scenario(
    "nonroot-become",
    f"SSH as '{LAB_USER}' (root login refused) with passwordless sudo; the inventory sets ansible_become: true",
)
def _nonroot_become(plan: LabPlan) -> None:
    """Every node has a user `ddpuser` (in the node's own /etc/passwd, home under the node's /home, the lab key in
    its authorized_keys) with passwordless sudo (/etc/sudoers.d/ddpfix-lab-ddpuser); sshd refuses root logins
    (`PermitRootLogin no`). The inventory sets `ansible_user: ddpuser` and `ansible_become: true`.
    No finding by itself: combine it with a fault."""
    plan.ssh_user, plan.sudo, plan.become = LAB_USER, True, True


@scenario(
    "nonroot-nobecome",
    f"SSH as '{LAB_USER}' (root login refused), no sudo and no become: ddpfix reads as an unprivileged user",
)
def _nonroot_nobecome(plan: LabPlan) -> None:
    """Like `nonroot-become`, but `ddpuser` has no sudo rights and the inventory sets no become: every fact is
    read as an unprivileged user (e.g. the firewall rule sets cannot be read), and nothing can be fixed."""
    plan.ssh_user, plan.sudo, plan.become = LAB_USER, False, False


@scenario(
    "ssh-port",
    f"sshd on port {LAB_SSH_PORT} (nothing on 22) on every node; the inventory sets ansible_port: {LAB_SSH_PORT}",
)
def _ssh_port(plan: LabPlan) -> None:
    """sshd listens on port 2222 only (ListenAddress <address>:2222) on every node; known_hosts entries are
    `[address]:2222`, the inventory sets `ansible_port: 2222`. No finding by itself: combine it with a fault."""
    plan.ssh_port = LAB_SSH_PORT


# --------------------------------------------------------------------------- GPU fabric (synthetic RDMA sysfs)
#
# A lab node cannot get a /sys/class/infiniband of its own: sysfs has no such directory here to mount over, and
# creating one is not possible. So each fabric scenario writes a synthetic tree in the kernel's layout
# (ddpfix.lab.fabrictree) into the node's private /run (/run/ddpfix-lab-fabric/{sys,dev}) and points the facts
# role at it with the host vars ddpfix_facts_sysfs_root / ddpfix_facts_dev_root. The memlock limit is real: it is
# the SSH session's RLIMIT_MEMLOCK. The lab cannot grant unlimited (no CAP_SYS_RESOURCE here; sessions inherit the
# host's 8 MiB hard limit), so fabric scenarios set ddp_memlock: 8192 (KiB), the lab's "enough".
LAB_MEMLOCK_KIB = 8192

FABRIC_RUN = "ddpfix-lab-fabric"


def _fabric_devices(plan: LabPlan, node: NodePlan, kind: str) -> list[Any]:
    from ddpfix.lab.fabrictree import Device, ib_port, roce_port

    if kind == "roce":
        return [
            Device(
                f"mlx5_{r}",
                [roce_port(f"10.{10 + r}.0.{10 + node.index}", f"rdma{r}")],
                netdevs=[f"rdma{r}"],
                numa_node=r,
            )
            for r in (0, 1)
        ]
    return [
        Device(f"mlx5_{r}", [ib_port(f"b83f:d203:00{node.index:02x}:0a1{r}")], netdevs=[f"ib{r}"], numa_node=r)
        for r in (0, 1)
    ]


def fabric_everywhere(
    plan: LabPlan, kind: str = "ib", edit: Callable[[NodePlan, list[Any], dict[str, Any]], None] | None = None
) -> None:
    """Give every node a synthetic RDMA tree (`kind` ib or roce); `edit(node, devices, opts)` may change a node's
    devices, and `opts` (write_tree's `uverbs`, `modules`), before they are written."""
    plan.groupvars["ddp_memlock"] = LAB_MEMLOCK_KIB
    for n in plan.nodes:
        n.hostvars["ddpfix_facts_sysfs_root"] = f"/run/{FABRIC_RUN}/sys"
        n.hostvars["ddpfix_facts_dev_root"] = f"/run/{FABRIC_RUN}/dev"
        devices = _fabric_devices(plan, n, kind)
        opts: dict[str, Any] = {"uverbs": True, "modules": ()}
        if edit:
            edit(n, devices, opts)
        n.tasks.append(_fabric_task(devices, opts))


def _fabric_task(devices: list[Any], opts: dict[str, Any]) -> Callable[[Runtime, NodePlan], None]:
    def task(rt: Runtime, node: NodePlan) -> None:
        from ddpfix.lab.fabrictree import write_tree

        root = rt.node_dir(node) / "run" / FABRIC_RUN
        write_tree(root / "sys", devices, dev_root=root / "dev", **opts)

    return task


@scenario(
    "fabric-port-down",
    "synthetic InfiniBand on every node; node2's mlx5_1 port 1 is DOWN (Disabled)",
    ("fabric.port-down",),
    min_nodes=2,
)
def _fabric_port_down(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails (mlx5_0, mlx5_1; synthetic sysfs, see fabric_everywhere); on node2
    mlx5_1/1 is `1: DOWN` with phys_state `3: Disabled`. Finding: fabric.port-down on node2."""
    victim = second(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        if n.name == victim:
            devs[1].ports[0].state = "DOWN"

    fabric_everywhere(plan, "ib", edit)


@scenario(
    "fabric-gid-differs",
    "synthetic RoCE on every node; the highest-address node's RoCE v2 IPv4 GID is at index 5, not 3",
    ("fabric.gid-index-differs",),
    min_nodes=2,
)
def _fabric_gid_differs(plan: LabPlan) -> None:
    """Every node has two 100G RoCE rails (netdevs rdma0/rdma1, RoCE v2 IPv4 GID at index 3 as mlx5 fills it); on
    nodeN the table holds one more address first, so its RoCE v2 IPv4 GID is index 5. Finding:
    fabric.gid-index-differs (cluster); the env plan writes no NCCL_IB_GID_INDEX."""
    victim = last(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        if n.name == victim:
            from ddpfix.lab.fabrictree import Gid, ipv4_gid, roce_port

            for r, d in enumerate(devs):
                p = roce_port(f"10.{10 + r}.0.{10 + n.index}", f"rdma{r}", v2_index=5)
                p.gids += [
                    Gid(2, ipv4_gid(f"10.{20 + r}.0.{10 + n.index}"), "IB/RoCE v1", f"rdma{r}"),
                    Gid(3, ipv4_gid(f"10.{20 + r}.0.{10 + n.index}"), "RoCE v1", f"rdma{r}"),
                ]
                d.ports[0] = p

    fabric_everywhere(plan, "roce", edit)


@scenario(
    "fabric-pkey-mismatch",
    "synthetic InfiniBand on every node; node2's ports sit in partition 0x8001, the others in 0xffff",
    ("fabric.pkey-mismatch",),
    min_nodes=2,
)
def _fabric_pkey_mismatch(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails; node2's pkeys/0 is 0x8001 (partition 1), the others' 0xffff (the
    default partition). Finding: fabric.pkey-mismatch (cluster)."""
    victim = second(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        if n.name == victim:
            for d in devs:
                d.ports[0].pkey0 = "0x8001"

    fabric_everywhere(plan, "ib", edit)


@scenario(
    "fabric-link-layer-mixed",
    "synthetic InfiniBand on every node but the highest-address one, which has RoCE (Ethernet)",
    ("fabric.link-layer-mixed",),
    min_nodes=2,
)
def _fabric_link_layer_mixed(plan: LabPlan) -> None:
    """node1..node(N-1) have two HDR InfiniBand rails, nodeN two RoCE rails (link_layer Ethernet) with the same
    device names, as when a ConnectX port type was left at ETH. Finding: fabric.link-layer-mixed (cluster)."""
    victim = last(plan)

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        if n is victim:
            devs[:] = _fabric_devices(plan, n, "roce")

    fabric_everywhere(plan, "ib", edit)


@scenario(
    "fabric-rate-mismatch",
    "synthetic InfiniBand on every node; node2's mlx5_0 runs at 100 Gb/s (4X EDR), the others at 200",
    ("fabric.rate-mismatch",),
    min_nodes=2,
)
def _fabric_rate_mismatch(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails; node2's mlx5_0/1 negotiated 100 Gb/sec (4X EDR), as with a bad
    cable or an EDR switch port. Finding: fabric.rate-mismatch on node2."""
    victim = second(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        if n.name == victim:
            devs[0].ports[0].rate = "100 Gb/sec (4X EDR)"

    fabric_everywhere(plan, "ib", edit)


@scenario(
    "fabric-roce-no-v2-gid",
    "synthetic RoCE on every node; node2's mlx5_0 GID table has no RoCE v2 entry (v1 only)",
    ("fabric.roce-no-v2-gid",),
    min_nodes=2,
)
def _fabric_roce_no_v2_gid(plan: LabPlan) -> None:
    """Every node has two 100G RoCE rails; on node2 mlx5_0/1 has only RoCE v1 GIDs (RoCE v2 disabled). Finding:
    fabric.roce-no-v2-gid on node2."""
    victim = second(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        if n.name == victim:
            from ddpfix.lab.fabrictree import roce_port

            devs[0].ports[0] = roce_port(f"10.10.0.{10 + n.index}", "rdma0", with_v2=False)
            devs[0].ports[0].gids = [g for g in devs[0].ports[0].gids if g.type != "RoCE v2"]

    fabric_everywhere(plan, "roce", edit)


@scenario(
    "fabric-hca-includes-mgmt",
    "synthetic InfiniBand plus a 25G RoCE NIC on the SSH interface; node2's env file says NCCL_IB_HCA=mlx5",
    ("fabric.hca-includes-mgmt",),
    min_nodes=1,
)
def _fabric_hca_includes_mgmt(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails and a third RDMA device mlx5_2 (25 Gb/s RoCE) whose netdev is the
    node's cluster/SSH interface; node2's env file sets NCCL_IB_HCA=mlx5, which selects it too. Finding:
    fabric.hca-includes-mgmt on node2 (the env plan writes NCCL_IB_HCA==mlx5_0:1,mlx5_1:1)."""
    from ddpfix.lab.fabrictree import Device, roce_port

    victim = second(plan)

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        devs.append(
            Device(
                "mlx5_2",
                [roce_port(str(n.address), n.ifname, rate="25 Gb/sec (1X EDR)")],
                netdevs=[n.ifname],
                numa_node=0,
            )
        )

    fabric_everywhere(plan, "ib", edit)
    victim.env = plan.env_for(victim, NCCL_IB_HCA="mlx5")


@scenario(
    "fabric-no-uverbs",
    "synthetic InfiniBand on every node; node2 has no /dev/infiniband/uverbs* (ib_uverbs not loaded)",
    ("fabric.no-uverbs",),
    min_nodes=1,
)
def _fabric_no_uverbs(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails; node2's /dev/infiniband holds only rdma_cm (no uverbs*, no umad*),
    as when ib_uverbs is not loaded. Finding: fabric.no-uverbs on node2."""
    victim = second(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        opts["uverbs"] = n.name != victim

    fabric_everywhere(plan, "ib", edit)


@scenario(
    "fabric-peermem-missing",
    "synthetic InfiniBand and GPU driver on every node; nvidia_peermem loaded everywhere but node2",
    ("fabric.peermem-missing",),
    min_nodes=1,
)
def _fabric_peermem_missing(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails and /sys/module/nvidia (synthetic); /sys/module/nvidia_peermem
    exists on every node but node2. Finding: fabric.peermem-missing on node2."""
    victim = second(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        opts["modules"] = ("nvidia",) if n.name == victim else ("nvidia", "nvidia_peermem")

    fabric_everywhere(plan, "ib", edit)


def _stub(rt: Runtime, node: NodePlan, name: str, text: str) -> None:
    rt.write_run(node, f"{FABRIC_RUN}/bin/{name}", text, 0o755)


def _stub_task(name: str, text: str) -> Callable[[Runtime, NodePlan], None]:
    """A node task writing the stand-in executable `name` (see _stub)."""

    def task(rt: Runtime, node: NodePlan) -> None:
        _stub(rt, node, name, text)

    return task


@scenario(
    "fabric-efa-provider-missing",
    "synthetic EFA device on every node; node2's fi_info -p efa finds no efa provider",
    ("fabric.efa-provider-missing",),
    min_nodes=1,
)
def _fabric_efa_provider_missing(plan: LabPlan) -> None:
    """Every node has one EFA device (driver efa, link layer Unspecified; synthetic sysfs). The lab has no
    libfabric, so each node gets a stand-in fi_info (host var ddpfix_facts_fi_info) answering as libfabric does:
    `provider: efa` on the others, `fi_getinfo: -61 (No data available)` and exit 1 on node2 (aws/aws-ofi-nccl#67).
    Finding: fabric.efa-provider-missing on node2. The env plan writes FI_PROVIDER=efa everywhere."""
    from ddpfix.lab.fabrictree import Device, Port

    victim = second(plan).name

    def edit(n: NodePlan, devs: list[Any], opts: dict[str, Any]) -> None:
        devs[:] = [Device("rdmap16s27", [Port(rate="100 Gb/sec (4X EDR)", link_layer="Unspecified")], driver="efa")]
        opts["modules"] = ("nvidia",)

    fabric_everywhere(plan, "ib", edit)
    for n in plan.nodes:
        n.hostvars["ddpfix_facts_fi_info"] = f"/run/{FABRIC_RUN}/bin/fi_info"
        text = "#!/bin/sh\n# ddpfix lab stand-in for libfabric's fi_info (no EFA here)\n" + (
            "echo 'fi_getinfo: -61 (No data available)' >&2\nexit 1\n"
            if n.name == victim
            else "printf 'provider: efa\\n    fabric: efa\\n    domain: rdmap16s27-rdm\\n'\n"
        )
        n.tasks.append(_stub_task("fi_info", text))


@scenario(
    "fabric-nccl-version-mismatch",
    "synthetic InfiniBand on every node; node2's torch reports NCCL 2.18.1, the others 2.21.5",
    ("fabric.nccl-version-mismatch",),
    min_nodes=2,
)
def _fabric_nccl_version_mismatch(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails. The lab's torch is a CPU build without NCCL, so the facts role asks
    a stand-in interpreter (host var ddpfix_facts_python) that prints the version torch.cuda.nccl.version() would:
    2.18.1 on node2, 2.21.5 elsewhere. Finding: fabric.nccl-version-mismatch (cluster)."""
    victim = second(plan).name
    fabric_everywhere(plan, "ib")
    for n in plan.nodes:
        n.hostvars["ddpfix_facts_python"] = f"/run/{FABRIC_RUN}/bin/python-nccl"
        version = "2.18.1" if n.name == victim else "2.21.5"
        text = (
            f"#!/bin/sh\n# ddpfix lab stand-in: what torch.cuda.nccl.version() prints on a GPU build\necho {version}\n"
        )
        n.tasks.append(_stub_task("python-nccl", text))


@scenario(
    "fabric-memlock-low",
    "synthetic InfiniBand on every node; on node2 a site limits.d file sets memlock 64 KiB for SSH logins",
    ("fabric.memlock-low",),
    min_nodes=1,
)
def _fabric_memlock_low(plan: LabPlan) -> None:
    """Every node has two HDR InfiniBand rails; node2's sshd uses PAM (UsePAM yes, as on a stock distribution) and
    /etc/security/limits.d/10-site-memlock.conf sets `soft memlock 64` (KiB) for * and root, so every SSH session
    there gets 64 KiB. Finding: fabric.memlock-low on node2; ddpfix remediate --apply writes 90-ddpfix-memlock.conf
    (a later file, so it wins) and new logins get the lab's ddp_memlock."""
    victim = second(plan)
    victim.files["ssh/sshd_config.d/00-ddpfix-lab-0pam.conf"] = (
        "# ddpfix lab (fabric-memlock-low): PAM on, so pam_limits applies limits.d to new logins\nUsePAM yes\n"
    )
    victim.files["security/limits.d/10-site-memlock.conf"] = (
        "# a site default left from an old image (ddpfix lab scenario fabric-memlock-low)\n"
        "*     soft  memlock  64\nroot  soft  memlock  64\n"
    )
    fabric_everywhere(plan, "ib")


# --------------------------------------------------------------------------- fabric cases on a running lab
#
# Every fabric scenario differs from `clean` only in what apply_fabric can redo in place: the synthetic tree and
# stand-ins under the nodes' /run/ddpfix-lab-fabric, files in the nodes' /etc (the env file, memlock-low's PAM and
# limits.d files) and inventory variables. So the lab tests bring up one lab and switch it from case to case.
FABRIC_APPLIED = "fabric-applied.json"  # in the lab's state dir: what the last apply_fabric changed, to undo it
_SESSION_ETC = ("ssh/", "security/", "pam.d/")  # /etc files sshd reads per login: restart sshd when they change


class _InPlace:
    """The part of the lab's Runtime that fabric tasks use (node_dir, write_run), for a lab that is already up."""

    def __init__(self, sdir: Path) -> None:
        self.sdir = sdir

    def node_dir(self, node: NodePlan) -> Path:
        return self.sdir / "nodes" / node.name

    def write_run(self, node: NodePlan, rel: str, text: str, mode: int = 0o644) -> None:
        _replace_file(self.node_dir(node) / "run" / rel, text, mode)


def _replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


def _etc_files(node: NodePlan) -> dict[str, str]:
    """What the plan writes into the node's /etc copy besides the base image (as `up` does: env file, then files)."""
    files: dict[str, str] = {}
    if node.env is not None:  # as `up` writes it (ddpfix.lab: env_text)
        files[ENV_PATH.removeprefix("/etc/")] = "# written by hand, long ago (ddpfix lab scenario)\n" + "".join(
            f"{k}={v}\n" for k, v in node.env.items()
        )
    files.update(node.files)
    return files


def fabric_plan(name: str, nodes: int, scenario_name: str, subnet: str, ifnames: list[str]) -> LabPlan:
    """The plan of `scenario_name` (clean or fabric-*) for a lab; LabError when it differs from the clean plan in
    more than apply_fabric redoes in place (host/group vars, env file, /etc files, /run tasks)."""
    from ddpfix import lab

    if scenario_name != "clean" and not scenario_name.startswith("fabric-"):
        raise LabError(f"apply_fabric: {scenario_name!r} is not a fabric scenario", ExitCode.INVALID_INPUT)
    plan = lab.plan_lab(name, nodes, scenario_name, subnet, ifnames)
    base = lab.plan_lab(name, nodes, "clean", subnet, ifnames)

    def rest(p: LabPlan) -> tuple[LabPlan, list[NodePlan]]:
        return (
            replace(p, nodes=[], scenarios=[], groupvars={}),
            [replace(n, hostvars={}, env=None, files={}, tasks=[]) for n in p.nodes],
        )

    if rest(plan) != rest(base):
        raise LabError(
            f"apply_fabric: {scenario_name} changes more than files and variables; bring up a lab with it",
            ExitCode.INVALID_INPUT,
        )
    return plan


def apply_fabric(info: LabInfo, scenario_name: str) -> None:
    """Switch a running lab, brought up with `clean` or a fabric scenario, to fabric scenario `scenario_name` (or
    back to `clean`) in place, as if `lab up` had built it with that scenario alone.

    The scenario is planned for the lab's nodes; a scenario that changes anything besides host/group vars, env
    files, /etc files and /run tasks is refused (LabError). On every node the tree under /run/ddpfix-lab-fabric is
    rewritten, /etc files a previous apply wrote are restored and the new ones written (sshd restarted where a
    file it reads at login changed, which also ends the controller's persistent connections there), and the
    inventory's host and group variables are replaced. The lab's state still names its first scenario."""
    from ddpfix import lab

    ifnames = [n.ifname for n in info.nodes]
    for name in info.scenarios:
        if name != "clean" and not name.startswith("fabric-"):
            raise LabError(
                f"apply_fabric: lab {info.name} was brought up with {name}, not a fabric scenario",
                ExitCode.INVALID_INPUT,
            )
    plan = fabric_plan(info.name, len(info.nodes), scenario_name, info.subnet, ifnames)
    sdir = lab.state_dir(info.name)
    record_path = sdir / FABRIC_APPLIED
    if record_path.exists():
        prev = json.loads(record_path.read_text())
    else:  # what `up` wrote for the lab's own scenarios (the /etc files were not in the image)
        first = lab.plan_lab(info.name, len(info.nodes), info.scenarios, info.subnet, ifnames)
        prev = {
            "hostvars": {n.name: sorted(n.hostvars) for n in first.nodes},
            "groupvars": sorted(first.groupvars),
            "etc": {n.name: dict.fromkeys(_etc_files(n)) for n in first.nodes},
        }
    rt = _InPlace(sdir)
    record: dict[str, Any] = {"scenario": scenario_name, "hostvars": {}, "groupvars": sorted(plan.groupvars), "etc": {}}
    restart: list[str] = []
    for n in plan.nodes:
        etc = rt.node_dir(n) / "etc"
        originals: dict[str, str | None] = prev["etc"].get(n.name, {})
        wanted = _etc_files(n)
        rels = sorted(set(originals) | set(wanted))
        before = {rel: _read(etc / rel) for rel in rels}
        for rel, text in originals.items():  # undo the previous case
            if text is None:
                (etc / rel).unlink(missing_ok=True)
            else:
                _replace_file(etc / rel, text)
        record["etc"][n.name] = {rel: _read(etc / rel) for rel in wanted}
        for rel, text in wanted.items():
            _replace_file(etc / rel, text)
        if any(rel.startswith(_SESSION_ETC) and _read(etc / rel) != before[rel] for rel in rels):
            restart.append(n.name)
        shutil.rmtree(rt.node_dir(n) / "run" / FABRIC_RUN, ignore_errors=True)
        for task in n.tasks:
            task(rt, n)  # type: ignore[arg-type]  # fabric tasks use node_dir and write_run only
        record["hostvars"][n.name] = sorted(n.hostvars)
    _rewrite_inventory_vars(info.inventory, plan, prev)
    for name in restart:
        lab.stop_sshd(info.name, name)
        lab.start_sshd(info.name, name)
    record_path.write_text(json.dumps(record, indent=2))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _rewrite_inventory_vars(path: Path, plan: LabPlan, prev: dict[str, Any]) -> None:
    """Replace the variables a previous apply_fabric set with the plan's, keeping the header `lab down` checks."""
    import yaml

    text = path.read_text()
    lines = text.splitlines(keepends=True)
    header = "".join(ln for ln in lines[: next(i for i, ln in enumerate(lines) if not ln.startswith("#"))])
    doc = yaml.safe_load(text)
    group = doc["all"]["children"]["ddp_nodes"]
    for key in prev["groupvars"]:
        group["vars"].pop(key, None)
    group["vars"].update(plan.groupvars)
    for n in plan.nodes:
        host = group["hosts"][n.name]
        for key in prev["hostvars"].get(n.name, []):
            host.pop(key, None)
        host.update(n.hostvars)
    tmp = path.with_suffix(".yml.tmp")
    tmp.write_text(header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    tmp.replace(path)


def help_text() -> str:
    width = max(len(s) for s in SCENARIOS)
    return "\n".join(f"{s.name.ljust(width)}  {s.summary}" for s in SCENARIOS.values())
