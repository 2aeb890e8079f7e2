"""Every audit check on recorded facts, no host needed: the mutations behind the rule fixtures, and the checks' tests.

The recorded clean 3-node cluster (fixtures/facts/clean3, see record.py) with one realistic change each: every
`@case` below is such a mutation, returning the host the finding must name (None for cluster-wide findings) and
substrings of its evidence (the line, rule, value or probe result); every `@passing` one a change after which its id
must not be reported. rule_inputs.py builds each, at test time, into an audit's whole input plus that expectation
(`<id>/{fail,pass}-*`), and tests/unit/rules/test_rule_fixtures.py runs them all. The tests here cover
what a single fixture cannot state: thresholds, ordering, not-evaluated, selection grammars.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from unit_helpers import (
    PYTHON_TOO_OLD,
    ROOT,
    Sim,
    _add_mgmt_hca,
    _fabric,
    _port,
    at_least,
    fabric_facts,
    firewall_fixture,
    nodeinfo,
    recorded,
)

from ddpfix.ifselect import nccl_select
from ddpfix.model.finding import Severity
from ddpfix.rules import env as env_rules
from ddpfix.rules import fabric as fabric_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import netif as netif_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import reachability as reachability_rules
from ddpfix.rules import time as time_rules
from ddpfix.rules.context import Context, HostFacts, Thresholds
from ddpfix.rules.engine import not_evaluated, run_checks
from ddpfix.rules.registry import RULES

Expect = tuple[str | None, list[str]]  # (host or None for cluster-wide, substrings of the evidence)
CASES: dict[str, Callable[[Sim], Expect]] = {}  # "<id>" or "<id>:<variant>" -> mutation


def case(fid: str, variant: str = "") -> Callable[[Callable[[Sim], Expect]], Callable[[Sim], Expect]]:
    assert fid in RULES, fid

    def deco(fn: Callable[[Sim], Expect]) -> Callable[[Sim], Expect]:
        CASES[f"{fid}:{variant}" if variant else fid] = fn
        return fn

    return deco


PASSES: dict[str, Callable[[Sim], None]] = {}  # "<id>:<variant>" -> a change after which the id must NOT be reported


def passing(fid: str, variant: str) -> Callable[[Callable[[Sim], None]], Callable[[Sim], None]]:
    assert fid in RULES, fid

    def deco(fn: Callable[[Sim], None]) -> Callable[[Sim], None]:
        PASSES[f"{fid}:{variant}"] = fn
        return fn

    return deco


def _iptables(rules: list[str], policy: str = "ACCEPT") -> str:
    """An iptables-save text in the recorded format (fixtures/firewall/ipt_reject.iptables-save)."""
    head = firewall_fixture("ipt_reject.iptables-save").splitlines()
    out = [ln for ln in head if not ln.startswith("-A ")]
    out = [f":INPUT {policy} [0:0]" if ln.startswith(":INPUT ") else ln for ln in out]
    i = out.index("COMMIT")
    return "\n".join(out[:i] + rules + out[i:]) + "\n"


def _firewall_state(sim: Sim, name: str, **kv: Any) -> None:
    st = sim.node(name)["firewall"]
    st.update(kv)


def _firewalld_public_without_port() -> dict[str, Any]:
    """The recorded firewalld 1.3.3 state reduced to a stock default zone: public on eth0 with ssh, dhcpv6-client.

    The recording also holds an unrelated iptables-nft rule (DROP 40001, table ip filter): removed, so firewalld's
    own nft table is the only ruleset, as on a stock firewalld host.
    """
    st = json.loads(firewall_fixture("fwd_cli.json"))
    st["iptables"] = ""
    st["nft"]["nftables"] = [o for o in st["nft"]["nftables"]
                             if not any(o.get(k, {}).get("table", o.get(k, {}).get("name")) == "filter"
                                        and o.get(k, {}).get("family") == "ip" for k in o)]
    fw = st["firewalld"]
    pub = fw["zones"]["public"]
    pub.update(ports=[], rich_rules=[], services=["dhcpv6-client", "ssh"], interfaces=["eth0"], sources=[])
    fw["zones"] = {"public": pub}
    fw["default_zone"] = "public"
    return st


def _nonroot_firewall(sim: Sim, name: str) -> dict[str, Any]:
    """The firewall state recorded as a non-root SSH user (fixtures/firewall/record-nonroot.sh), on `name`.

    ddpfix_node_facts copies the collector's `unread` into the node's own list, as here."""
    st = json.loads(firewall_fixture("nonroot_collect.json"))
    sim.node(name)["firewall"] = st
    sim.node(name)["unread"] = list(st["unread"])
    return st


# ============================================================ host / facts / firewall / probes


@case(reachability_rules.UNREACHABLE.id)
def _(sim: Sim) -> Expect:
    err = "Failed to connect to the host via ssh: ssh: connect to host 192.168.77.13 port 22: Connection refused"
    sim.set_unreachable("node3", err)
    return "node3", ["port 22: Connection refused"]


#: What ansible-core 2.19 returns when a module's interpreter exits 1 (recorded on a lab node whose
#: ansible_python_interpreter is a script printing to stderr and exiting 1; see test_audit_lab)
INTERPRETER_EXIT_1 = {
    "failed": True, "changed": False, "rc": 1, "module_stdout": "",
    "module_stderr": "ddpfix-lab: broken python: libpython3.12.so.1.0: cannot open shared object file\n",
    "msg": "Module result deserialization failed: No start of json char found\nSee stdout/stderr for the returned output.",
}


@case(reachability_rules.MODULE_FAILED.id)
def _(sim: Sim) -> Expect:
    sim.set_module_failed("node2", dict(INTERPRETER_EXIT_1))
    return "node2", ["ddpfix_node_facts: Module result deserialization failed", "rc=1",
                     "stderr: ddpfix-lab: broken python: libpython3.12.so.1.0: cannot open shared object file"]


@case(reachability_rules.MODULE_FAILED.id, "module-failure")
def _(sim: Sim) -> Expect:
    # the older wording (ansible-core before 2.19), the interpreter missing
    sim.set_module_failed("node3", {"failed": True, "rc": 127, "module_stdout": "",
                                    "module_stderr": "/bin/sh: 1: /usr/bin/python3: not found\n",
                                    "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error"})
    return "node3", ["MODULE FAILURE", "rc=127", "/usr/bin/python3: not found"]


@case(reachability_rules.PYTHON_UNSUPPORTED.id)
def _(sim: Sim) -> Expect:
    sim.set_module_failed("node2", dict(PYTHON_TOO_OLD))
    return "node2", ["Ansible requires Python 3.9 or newer on the target. Current version: 3.8.18"]


@case(reachability_rules.INCOMPLETE.id)
def _(sim: Sim) -> Expect:
    _nonroot_firewall(sim, "node3")
    return "node3", ["iptables: iptables-save v1.8.9 (nf_tables): Could not fetch rule set generation id: "
                     "Permission denied (you must be root)", "nft: nft -j list ruleset: Operation not permitted"]


@case(reachability_rules.INCOMPLETE.id, "interfaces")
def _(sim: Sim) -> Expect:
    n = sim.node("node2")
    n["interfaces"], n["cluster"] = [], nodeinfo().cluster_interface([], "", "192.168.77.11")
    n["unread"] = [{"source": "interfaces", "reason": "ip -j addr show: not installed ([Errno 2] No such file or directory: 'ip')"}]
    return "node2", ["interfaces: ip -j addr show: not installed"]


@case(reachability_rules.INVALID.id, "hostile-hostname")
def _(sim: Sim) -> Expect:
    sim.node("node2")["hostname"] = "evil\n{{ lookup('pipe', 'id') }}"
    return "node2", ["hostname = \"evil\\n{{ lookup('pipe', 'id') }}\""]


@case(reachability_rules.INVALID.id, "localhost")
def _(sim: Sim) -> Expect:
    sim.node("node3")["hostname"] = "localhost"
    return "node3", ["hostname = 'localhost'"]


@case(reachability_rules.INVALID.id, "address")
def _(sim: Sim) -> Expect:
    sim.node("node2")["cluster"]["address"] = "192.168.77.12 evil"
    return "node2", ["cluster.address = '192.168.77.12 evil'"]


@case(firewall_rules.MASTER_PORT_BLOCKED.id, "iptables")
def _(sim: Sim) -> Expect:
    # recorded iptables-save (nf_tables) that DROPs 29500 and REJECTs the ephemeral range
    _firewall_state(sim, "node1", iptables=firewall_fixture("ipt_reject.iptables-save"))
    return "node1", ["-A INPUT -p tcp -m tcp --dport 29500 -j DROP"]


@case(firewall_rules.MASTER_PORT_BLOCKED.id, "firewalld")
def _(sim: Sim) -> Expect:
    sim.node("node1")["firewall"] = _firewalld_public_without_port()
    return "node1", ["public"]


@case(firewall_rules.MASTER_PORT_BLOCKED.id, "nftables")
def _(sim: Sim) -> Expect:
    # a recorded nftables ruleset written for another network (its @cluster set lacks 192.168.77.0/24)
    _firewall_state(sim, "node1", nft=json.loads(firewall_fixture("nft_inet.json")),
                    nft_text=firewall_fixture("nft_inet.txt"))
    return "node1", ["policy drop"]


@case(firewall_rules.PEER_PORTS_BLOCKED.id)
def _(sim: Sim) -> Expect:
    rule = "-A INPUT -p tcp -m tcp --dport 32768:60999 -j REJECT --reject-with icmp-port-unreachable"
    _firewall_state(sim, "node2", iptables=_iptables([rule]))
    return "node2", [rule]


@case(firewall_rules.PEER_PORTS_BLOCKED.id, "subrange")
def _(sim: Sim) -> Expect:
    # only part of the ephemeral range is closed: sampling must still find it
    rule = "-A INPUT -p tcp -m tcp --dport 45001:45099 -j DROP"
    _firewall_state(sim, "node3", iptables=_iptables([rule]))
    return "node3", [rule]


@case(firewall_rules.PEER_PORTS_BLOCKED.id, "firewalld")
def _(sim: Sim) -> Expect:
    sim.node("node3")["firewall"] = _firewalld_public_without_port()
    return "node3", ["public"]


@case(firewall_rules.WORLD_OPEN.id)
def _(sim: Sim) -> Expect:
    rules = ["-A INPUT -i lo -j ACCEPT",
             "-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
             "-A INPUT -s 192.168.77.0/24 -p tcp -j ACCEPT",
             "-A INPUT -p tcp -m tcp --dport 29500 -j ACCEPT"]
    _firewall_state(sim, "node1", iptables=_iptables(rules, policy="DROP"))
    return "node1", ["--dport 29500 -j ACCEPT", "203.0.113.7"]


@case(firewall_rules.WORLD_OPEN.id, "firewalld")
def _(sim: Sim) -> Expect:
    st = _firewalld_public_without_port()
    st["firewalld"]["zones"]["public"]["ports"] = [["29500", "tcp"]]  # firewall-cmd --add-port=29500/tcp
    st["firewalld"]["zones"]["trusted"] = {**st["firewalld"]["zones"]["public"], "target": "ACCEPT", "interfaces": [],
                                           "ports": [], "services": [], "sources": ["192.168.77.0/24"]}
    sim.node("node1")["firewall"] = st
    return "node1", ["29500"]


def _no_probes(sim: Sim) -> None:
    """`audit --no-probe` (and `check --local`): no connect decides what the rules cannot."""
    for n in sim.docs:
        sim.probe(n)["connects"] = []


UNDECIDED_MASTER = "-A INPUT -p tcp -m tcp --dport 29500 -m set ! --match-set ok src -j DROP"


@case(firewall_rules.UNDECIDED.id)
def _(sim: Sim) -> Expect:
    # the issue's rule: the master port blocked for every source outside the ipset `ok`, policy ACCEPT
    _no_probes(sim)
    _firewall_state(sim, "node1", iptables=_iptables([UNDECIDED_MASTER]))
    return "node1", [UNDECIDED_MASTER, "stands before the accepting rule", "iptables filter INPUT policy ACCEPT"]


@case(firewall_rules.UNDECIDED.id, "ephemeral-hashlimit")
def _(sim: Sim) -> Expect:
    rule = ("-A INPUT -p tcp -m tcp --dport 32768:60999 -m hashlimit --hashlimit-above 10/sec --hashlimit-burst 5 "
            "--hashlimit-mode srcip --hashlimit-name h -j DROP")
    _no_probes(sim)
    _firewall_state(sim, "node2", iptables=_iptables([rule]))
    return "node2", ["-m hashlimit --hashlimit-above 10/sec"]


@case(firewall_rules.UNDECIDED.id, "nft-limit")
def _(sim: Sim) -> Expect:
    _no_probes(sim)
    nft = json.loads(firewall_fixture("nft_unmodelled.json"))
    for o in nft["nftables"]:  # the recorded `tcp dport 29601 limit rate over 10/second drop`, on the master port
        for e in (o.get("rule") or {}).get("expr") or []:
            if (e.get("match") or {}).get("right") == 29601:
                e["match"]["right"] = 29500
    _firewall_state(sim, "node1", nft=nft, nft_text=None)
    return "node1", ['"limit"', "nft inet filter input"]


@case(firewall_rules.UNDECIDED_ACCEPT.id)
def _(sim: Sim) -> Expect:
    rules = ["-A INPUT -i lo -j ACCEPT", "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
             "-A INPUT -p tcp -m set --match-set cluster src -j ACCEPT"]
    _no_probes(sim)
    _firewall_state(sim, "node3", iptables=_iptables(rules, policy="DROP"))
    return "node3", ["-m set --match-set cluster src -j ACCEPT", "iptables filter INPUT policy DROP"]


@case(probes_rules.MASTER_PORT_UNREACHABLE.id)
def _(sim: Sim) -> Expect:
    refused = next(c for c in json.loads(recorded("probe.json"))["connects"] if not c["ok"])["error"]
    c = next(c for c in sim.probe("node2")["connects"] if c["kind"] == "master")
    c.update(ok=False, error=refused)
    return "node2", ["192.168.77.11:29500", "connection refused (ECONNREFUSED)", "192.168.77.12 (eth0)"]


@case(probes_rules.PEER_UNREACHABLE.id)
def _(sim: Sim) -> Expect:
    c = next(c for c in sim.probe("node3")["connects"] if c["kind"] == "peer")
    c.update(ok=False, error="timed out after 2.0s", seconds=2.0)
    return "node3", [f"{c['address']}:{c['port']}", "timed out after 2.0s"]


@case(probes_rules.PEER_UNREACHABLE.id, "listener")
def _(sim: Sim) -> Expect:
    sim.node("node2")["probe"].update(pid=None, port=None, error="OSError: [Errno 99] Cannot assign requested address")
    return "node2", ["Cannot assign requested address"]


@case(probes_rules.PORT_IN_USE.id)
def _(sim: Sim) -> Expect:
    # a real /proc/net/tcp plus one LISTEN socket on 0.0.0.0:29500 (0x733C), read by the real parser
    text = recorded("proc-net-tcp.txt").rstrip("\n") + (
        "\n   1: 00000000:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 "
        "0000000000000000 100 0 0 10 0\n")
    sim.node("node1")["listening"] = nodeinfo().listening_ports(text)
    return "node1", ["TCP port 29500"]


# ============================================================ names


DEBIAN_HOSTS = "127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n\n# The following lines are desirable for IPv6 capable hosts\n" \
               "::1     localhost ip6-localhost ip6-loopback\nff02::1 ip6-allnodes\nff02::2 ip6-allrouters\n"


@case(hosts_rules.HOSTNAME_LOOPBACK.id)
def _(sim: Sim) -> Expect:
    text = DEBIAN_HOSTS.format(name="node2") + "192.168.77.11\tnode1\n192.168.77.13\tnode3\n"
    sim.set_hosts_file("node2", text)
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    return "node2", ["/etc/hosts: 127.0.1.1\tnode2"]


@case(hosts_rules.NAME_UNVOUCHED.id)
def _(sim: Sim) -> Expect:
    """Issue 36: node3 calls itself pypi.org, on 127.0.1.1 (HOSTNAME_LOOPBACK is not raised for it: no fix
    may write a name a node chose)."""
    sim.node("node3")["hostname"] = "pypi.org"
    sim.set_hosts_file("node3", DEBIAN_HOSTS.format(name="pypi.org") + "192.168.77.11\tnode1\n192.168.77.12\tnode2\n")
    sim.node("node3")["resolve_self"] = {"pypi.org": ["127.0.1.1"]}
    return "node3", ["hostname = pypi.org; inventory name node3", "getaddrinfo('pypi.org') on node3 = 127.0.1.1",
                     "/etc/hosts: 127.0.1.1\tpypi.org"]


@passing(hosts_rules.NAME_UNVOUCHED.id, "short-form-under-a-configured-domain")
def _(sim: Sim) -> None:
    sim.set_var(None, ddp_hosts_domains=["cluster.example"])
    sim.node("node3")["hostname"] = "node3.cluster.example"


@case(hosts_rules.PEER_UNRESOLVABLE.id)
def _(sim: Sim) -> Expect:
    text = "127.0.0.1\tlocalhost\n192.168.77.12\tnode2\n192.168.77.13\tnode3\n"
    sim.set_hosts_file("node3", text)
    sim.probe("node3")["resolve"]["node1"] = []
    return "node3", ["getaddrinfo('node1')", "no address"]


@case(hosts_rules.PEER_MISMATCH.id)
def _(sim: Sim) -> Expect:
    # a stale line left from the old network
    sim.set_hosts_file("node2", "127.0.0.1\tlocalhost\n10.0.0.13\tnode3\n192.168.77.11\tnode1\n")
    sim.probe("node2")["resolve"]["node3"] = ["10.0.0.13"]
    return "node2", ["10.0.0.13", "/etc/hosts: 10.0.0.13\tnode3"]


@case(hosts_rules.PEER_MISMATCH.id, "inside-cidr")
def _(sim: Sim) -> Expect:
    # a typo in node1's /etc/hosts: an address inside the cluster network, but not node2's
    text = "\n".join(e["text"].replace("192.168.77.12", "192.168.77.99") for e in sim.node("node1")["hosts_file"])
    sim.set_hosts_file("node1", text + "\n")
    sim.probe("node1")["resolve"]["node2"] = ["192.168.77.99"]
    return "node1", ["= 192.168.77.99", "/etc/hosts: 192.168.77.99\tnode2"]


def _mgmt_nic(sim: Sim, name: str, address: str) -> None:
    """A second NIC `mgmt0` on `name` holding `address` (/24), outside the cluster network."""
    nic = json.loads(json.dumps(sim.iface(name)))
    nic.update(name="mgmt0", index=90)
    nic["addrs"] = [{**nic["addrs"][0], "local": address, "prefixlen": 24}]
    sim.node(name)["interfaces"].append(nic)


@case(hosts_rules.PEER_NAME_OTHER_NETWORK.id)
def _(sim: Sim) -> Expect:
    # multi-homed: node2's name resolves on node1 to node2's own management address (another NIC, another network)
    _mgmt_nic(sim, "node2", "10.9.0.12")
    sim.probe("node1")["resolve"]["node2"] = ["10.9.0.12"]
    return None, ["node2 -> 10.9.0.12 on node1 (node2's mgmt0, 10.9.0.0/24; cluster address 192.168.77.12 on eth0)"]


def test_a_name_on_another_address_of_the_peer_inside_the_cluster_network_is_no_finding() -> None:
    sim = Sim()
    sim.iface("node3")["addrs"].append({**sim.iface("node3")["addrs"][0], "local": "192.168.77.103"})
    sim.probe("node1")["resolve"]["node3"] = ["192.168.77.103"]
    assert not [f for f in sim.findings() if f.id.startswith("hosts.")]


def test_a_name_on_an_address_no_peer_holds_stays_a_mismatch_even_on_a_multi_homed_cluster() -> None:
    sim = Sim()
    _mgmt_nic(sim, "node2", "10.9.0.12")
    sim.probe("node1")["resolve"]["node2"] = ["10.9.0.99"]  # nobody's address
    assert {(f.id, f.host) for f in sim.findings() if f.id.startswith("hosts.")} == {(hosts_rules.PEER_MISMATCH.id, "node1")}


@case(hosts_rules.NAME_FORM_DIFFERS.id)
def _(sim: Sim) -> Expect:
    # node1's FQDN (the dotted alias on its own line) has a stale line of its own, first: another host's address
    n1 = sim.node("node1")
    n1["fqdn"] = "node1.lab.example"
    n1["resolve_self"] = {"node1": ["192.168.77.11"], "node1.lab.example": ["192.168.77.12"]}
    sim.set_hosts_file("node1", "127.0.0.1\tlocalhost\n192.168.77.12\tnode1.lab.example\n"
                                "192.168.77.11\tnode1 node1.lab.example\n192.168.77.12\tnode2\n192.168.77.13\tnode3\n")
    return "node1", ["hostname node1 -> 192.168.77.11 (eth0)", "FQDN node1.lab.example -> 192.168.77.12 (held by node2)",
                     "/etc/hosts: 192.168.77.12\tnode1.lab.example"]


@passing(hosts_rules.NAME_FORM_DIFFERS.id, "every-name-form-on-an-own-address")
def _(sim: Sim) -> None:
    n1 = sim.node("node1")
    n1["fqdn"] = "node1.lab.example"
    n1["resolve_self"] = {"node1": ["192.168.77.11"], "node1.lab.example": ["192.168.77.11"]}


@case(hosts_rules.DUPLICATE_HOSTNAME.id)
def _(sim: Sim) -> Expect:
    n3 = sim.node("node3")  # node3 is a clone of node2 that kept its hostname
    n3["hostname"] = n3["fqdn"] = "node2"
    n3["resolve_self"] = {"node2": ["192.168.77.13"]}
    return None, ["node2: hostname=node2", "node3: hostname=node2"]


@case(hosts_rules.DUPLICATE_MACHINE_ID.id)
def _(sim: Sim) -> Expect:
    mid = sim.node("node2")["machine_id"]
    sim.node("node3")["machine_id"] = mid
    return None, [f"/etc/machine-id = {mid}", "node2, node3"]


# ============================================================ time


@case(time_rules.NO_DAEMON.id)
def _(sim: Sim) -> Expect:
    sim.node("node3")["time"] = {"daemons": [], "chrony_tracking": None}
    return "node3", ["no chronyd/ntpd/systemd-timesyncd"]


@case(time_rules.UNSYNCHRONIZED.id)
def _(sim: Sim) -> Expect:
    sim.node("node2")["time"]["chrony_tracking"] = nodeinfo().parse_chronyc_tracking(recorded("chronyc-unreachable.csv"))
    return "node2", ["'Not synchronised'"]


@case(time_rules.UNSYNCHRONIZED.id, "offset")
def _(sim: Sim) -> Expect:
    sim.node("node3")["time"]["chrony_tracking"]["system_offset"] = -0.25
    return "node3", ["-0.250000s"]


@case(time_rules.UNSYNCHRONIZED.id, "no-answer")
def _(sim: Sim) -> Expect:
    sim.node("node2")["time"]["chrony_tracking"] = None  # `chronyc -c tracking` failed: 506 Cannot talk to daemon
    return "node2", ["chronyc -c tracking failed"]


@case(time_rules.SKEW.id)
def _(sim: Sim) -> Expect:
    sim.node("node3")["now"] += 5.0  # node3's clock is 5 s ahead of the controller's when its facts arrived
    return None, ["node3: +5.05s", "node1: +0.05s"]


# ============================================================ interfaces


@case(netif_rules.MISSING.id)
def _(sim: Sim) -> Expect:
    # inventory override ddp_socket_ifname=ens5 on a node whose NIC is eth0 (facts use the override, as the module does)
    sim.set_var("node2", ddp_socket_ifname="ens5")
    n = sim.node("node2")
    n["cluster"] = nodeinfo().cluster_interface(n["interfaces"], "", "192.168.77.11", "ens5")
    return "node2", ["ddp_socket_ifname=ens5", "interfaces present: lo, eth0"]


@case(netif_rules.MISSING.id, "nccl-spec")
def _(sim: Sim) -> Expect:
    sim.write_planned_env_files(node3={"NCCL_SOCKET_IFNAME": "^eth"})  # excludes the cluster NIC: only lo is left
    return "node3", ["NCCL_SOCKET_IFNAME=^eth matched: lo;"]


@case(netif_rules.MISSING.id, "no-address")
def _(sim: Sim) -> Expect:
    # GLOO_SOCKET_IFNAME names an interface that exists but is not on the cluster network
    sim.node("node1")["interfaces"].append({
        "name": "docker0", "index": 5, "flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], "operstate": "DOWN",
        "mtu": 1500, "kind": "bridge", "addrs": [{"family": "inet", "local": "172.17.0.1", "prefixlen": 16}]})
    sim.write_planned_env_files(node1={"GLOO_SOCKET_IFNAME": "docker0"})
    return "node1", ["GLOO_SOCKET_IFNAME=docker0", "docker0 addresses: 172.17.0.1"]


@case(netif_rules.MISSING.id, "no-cluster-address")
def _(sim: Sim) -> Expect:
    # node3's NIC came up with an address from another network (wrong DHCP scope)
    n = sim.node("node3")
    sim.iface("node3")["addrs"][0].update(local="10.0.0.13")
    n["cluster"] = nodeinfo().cluster_interface(n["interfaces"], "", "192.168.77.11")
    return "node3", ["eth0 10.0.0.13"]


def _rename_nic(sim: Sim, name: str, new: str) -> None:
    n = sim.node(name)
    sim.iface(name)["name"] = new
    n["cluster"] = nodeinfo().cluster_interface(n["interfaces"], "", "192.168.77.11")
    for r in sim.probe(name)["routes"].values():
        r["dev"] = new


@case(netif_rules.NAME_MISMATCH.id)
def _(sim: Sim) -> Expect:
    _rename_nic(sim, "node2", "ens5")
    sim.write_planned_env_files(**{n: {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0", "TP_SOCKET_IFNAME": "eth0"}
                                   for n in ("node1", "node2", "node3")})
    return None, ["node1=eth0", "node2=ens5", "node3=eth0", "GLOO_SOCKET_IFNAME=eth0"]


@case(netif_rules.NAME_MISMATCH.id, "inventory")
def _(sim: Sim) -> Expect:
    # ddp_socket_ifname: eth0 as a group var; node2's NIC is ens5 (the facts follow the override, as the module does)
    sim.set_var(None, ddp_socket_ifname="eth0")
    _rename_nic(sim, "node2", "ens5")
    for n in sim.docs:
        f = sim.node(n)
        f["cluster"] = nodeinfo().cluster_interface(f["interfaces"], "", "192.168.77.11", "eth0")
    return None, ["node2=ens5", "ddp_socket_ifname=eth0"]


def _add_iface(sim: Sim, name: str, ifname: str, index: int, addr: str, prefixlen: int, kind: str = "bridge") -> None:
    sim.node(name)["interfaces"].append({
        "name": ifname, "index": index, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "operstate": "UP",
        "mtu": 1500, "kind": kind, "addrs": [{"family": "inet", "local": addr, "prefixlen": prefixlen}]})


@case(netif_rules.AUTOSELECT_WRONG.id, "nccl")
def _(sim: Sim) -> Expect:
    # docker0 (skipped by NCCL's default) and a docker user network bridge br-* created before eth0 got its index
    _add_iface(sim, "node3", "docker0", 2, "172.17.0.1", 16)
    _add_iface(sim, "node3", "br-1a2b3c4d5e6f", 3, "172.18.0.1", 16)
    sim.node("node3")["interfaces"].sort(key=lambda i: i["index"])
    return "node3", ["br-1a2b3c4d5e6f=172.18.0.1", "eth0=192.168.77.13"]


@case(netif_rules.AUTOSELECT_WRONG.id, "gloo-hostname")
def _(sim: Sim) -> Expect:
    # the hostname resolves to the management NIC's address
    _add_iface(sim, "node2", "ens3", 5, "10.20.0.12", 24, kind="ether")
    sim.set_hosts_file("node2", "127.0.0.1\tlocalhost\n10.20.0.12\tnode2\n192.168.77.11\tnode1\n192.168.77.13\tnode3\n")
    sim.node("node2")["resolve_self"] = {"node2": ["10.20.0.12"]}
    return "node2", ["/etc/hosts: 10.20.0.12\tnode2"]


@case(netif_rules.MTU_MISMATCH.id)
def _(sim: Sim) -> Expect:
    sim.iface("node2")["mtu"] = 1400
    return None, ["node2: eth0 mtu 1400", "node1: eth0 mtu 1500"]


@case(netif_rules.DOWN.id)
def _(sim: Sim) -> Expect:
    i = sim.iface("node3")
    i["flags"] = ["BROADCAST", "MULTICAST"]
    i["operstate"] = "DOWN"
    return "node3", ["flags=BROADCAST,MULTICAST", "operstate=DOWN"]


# ============================================================ addresses, routes, sysctls


@case(net_rules.MASTER_NOT_PRIVATE.id)
def _(sim: Sim) -> Expect:
    sim.write_planned_env_files(node2={"MASTER_ADDR": "203.0.113.10"})
    return "node2", ["/etc/ddpfix/ddp.env: MASTER_ADDR=203.0.113.10"]


@case(hosts_rules.FAMILY_MISMATCH.id)
def _(sim: Sim) -> Expect:
    # node3's /etc/hosts lists IPv6 entries first: getaddrinfo returns them first
    sim.set_hosts_file("node3", "127.0.0.1\tlocalhost\nfd00:77::11\tnode1\nfd00:77::12\tnode2\n"
                                "192.168.77.11\tnode1\n192.168.77.12\tnode2\n192.168.77.13\tnode3\n")
    for peer, v6 in (("node1", "fd00:77::11"), ("node2", "fd00:77::12")):
        sim.probe("node3")["resolve"][peer] = [v6, sim.probe("node3")["resolve"][peer][0]]
    return None, ["node3: IPv6", "node1: IPv4"]


@case(net_rules.VIA_GATEWAY.id)
def _(sim: Sim) -> Expect:
    # the recorded shape of an off-link `ip -j route get` (gateway), moved to the cluster network
    via = next(r for r in json.loads(recorded("probe.json"))["routes"].values() if r.get("via"))
    sim.probe("node2")["routes"]["192.168.77.13"] = dict(via, via="192.168.77.1", src="192.168.77.12")
    return "node2", ["ip route get 192.168.77.13: dev eth0 via 192.168.77.1"]


@case(net_rules.MASTER_PORT_EPHEMERAL.id)
def _(sim: Sim) -> Expect:
    sim.set_var(None, ddp_master_port=40000)
    for n in sim.docs:
        for c in sim.probe(n)["connects"]:
            if c["kind"] == "master":
                c["port"] = 40000
    return "node1", ["net.ipv4.ip_local_port_range = 32768 60999"]


@case(net_rules.SOMAXCONN_LOW.id)
def _(sim: Sim) -> Expect:
    sim.set_var(None, ddp_nproc_per_node=8)  # world size 24
    sim.node("node1")["sysctl"]["somaxconn"] = 16
    return "node1", ["net.core.somaxconn = 16"]


# ============================================================ env files


@case(env_rules.NODE_COUNT_MISMATCH.id)
def _(sim: Sim) -> Expect:
    # what `audit --slurm` writes into the allocation's inventory when SLURM_NNODES disagrees with the list
    from ddpfix.inventory.slurm import inventory_from_allocation

    gvars = inventory_from_allocation({"SLURM_JOB_NODELIST": "node[1-3]", "SLURM_NNODES": "4"},
                                      as_finding=True)["ddp_nodes"]["vars"]
    sim.set_var(None, ddp_slurm_count_mismatch=gvars["ddp_slurm_count_mismatch"])
    return None, ["SLURM_NNODES='4' but SLURM_JOB_NODELIST 'node[1-3]' expands to 3 nodes"]


@case(env_rules.MISSING.id)
def _(sim: Sim) -> Expect:
    return "node2", ["stat /etc/ddpfix/ddp.env: no such file"]  # the clean cluster: nothing written yet


@case(env_rules.MISSING.id, "file-of-the-user-without-our-keys")
def _(sim: Sim) -> Expect:
    for n in sim.docs:  # a file the user (or another tool) put there: ddpfix's keys are missing, nothing disagrees
        sim.set_env_file(n, "MY_KEY=keepme\n")
    assert {f.id for f in sim.findings()} == {env_rules.MISSING.id}
    return "node2", ["/etc/ddpfix/ddp.env: 1 other key(s) (MY_KEY)"]


@case(env_rules.INCONSISTENT.id, "duplicate-rank")
def _(sim: Sim) -> Expect:
    sim.write_planned_env_files(node3={"NODE_RANK": "1", "RANK": "1"})
    return None, ["node2: NODE_RANK=1", "node3: NODE_RANK=1"]


@case(env_rules.INCONSISTENT.id, "cluster-key")
def _(sim: Sim) -> Expect:
    sim.write_planned_env_files(node2={"MASTER_PORT": "29501"})
    return None, ["node2: MASTER_PORT=29501", "node1: MASTER_PORT=29500"]


@case(env_rules.INCONSISTENT.id, "differs-from-plan")
def _(sim: Sim) -> Expect:
    sim.write_planned_env_files(node1={"NCCL_SOCKET_IFNAME": "eth"})
    return "node1", ["NCCL_SOCKET_IFNAME=eth (want =eth0)"]


# ============================================================ GPU fabric (recorded trees: fixtures/sysfs)


@case(fabric_rules.PORT_DOWN.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    _port(sim, "node2").update(state="DOWN", state_num=1, phys_state="Disabled", phys_state_num=3)
    return "node2", ["mlx5_1/ports/1/state: 1: DOWN", "phys_state: 3: Disabled"]


@case(fabric_rules.RATE_MISMATCH.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    _port(sim, "node3", "mlx5_0").update(rate="100 Gb/sec (4X EDR)", rate_gbps=100.0)
    return "node3", ["mlx5_0/1 rate: 100 Gb/sec (4X EDR)", "node1: 200 Gb/sec (4X HDR)"]


@case(fabric_rules.LINK_LAYER_MIXED.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    sim.node("node3")["fabric"] = fabric_facts("roce") | {"memlock": {"soft": -1, "hard": -1}}
    return None, ["node1: InfiniBand", "node3: Ethernet"]


@case(fabric_rules.ROCE_NO_V2_GID.id)
def _(sim: Sim) -> Expect:
    _fabric(sim, "roce")
    p = _port(sim, "node2", "mlx5_0")
    p["gids"] = [g for g in p["gids"] if g["type"] != "RoCE v2"]
    return "node2", ["mlx5_0/ports/1/gids: 0 IB/RoCE v1 fe80:"]


@case(fabric_rules.GID_INDEX_DIFFERS.id)
def _(sim: Sim) -> Expect:
    _fabric(sim, "roce")
    g = next(g for g in _port(sim, "node3", "mlx5_0")["gids"] if g["type"] == "RoCE v2" and g["ipv4"])
    g["index"] = 5
    return None, ["node1: mlx5_0/1 RoCE v2 IPv4 GID index 3", "node3: mlx5_0/1 RoCE v2 IPv4 GID index 5"]


@case(fabric_rules.PKEY_MISMATCH.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    for dev in ("mlx5_0", "mlx5_1"):
        _port(sim, "node2", dev)["pkey0"] = "0x8001"
    return None, ["node2: mlx5_0/1 pkeys/0=0x8001", "node1: mlx5_0/1 pkeys/0=0xffff"]


@case(fabric_rules.HCA_INCLUDES_MGMT.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    _add_mgmt_hca(sim, "node2")
    sim.set_env_file("node2", "NCCL_IB_HCA=mlx5\n")
    return "node2", ["NCCL_IB_HCA=mlx5", "mlx5_2: netdev eth0 holds the SSH address 192.168.77.12"]


@case(fabric_rules.MEMLOCK_LOW.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    sim.node("node1")["fabric"]["memlock"] = {"soft": 65536, "hard": 65536, "source": "ssh session"}
    return "node1", ["soft 65536 (64 KiB)"]


@case(fabric_rules.NO_UVERBS.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    sim.node("node3")["fabric"].update(uverbs=[], umad=[])
    return "node3", ["/dev/infiniband: no uverbs*"]


@case(fabric_rules.PEERMEM_MISSING.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    sim.node("node2")["fabric"]["modules"] = {"nvidia_peermem": False, "gdrdrv": False}
    return "node2", ["nvidia_peermem and gdrdrv absent"]


@case(fabric_rules.EFA_PROVIDER_MISSING.id)
def _(sim: Sim) -> Expect:
    _fabric(sim, "efa")
    for n in sim.docs:
        sim.node(n)["fabric"]["efa"]["fi_info"] = {"ran": True, "ok": True, "path": "/opt/amazon/efa/bin/fi_info",
                                                   "providers": ["efa"], "error": None}
    # the failure of aws/aws-ofi-nccl#67: fi_getinfo finds no efa provider
    sim.node("node2")["fabric"]["efa"]["fi_info"] = {"ran": True, "ok": False, "path": "/opt/amazon/efa/bin/fi_info",
                                                     "providers": [], "error": "fi_getinfo: -61 (No data available)"}
    return "node2", ["/opt/amazon/efa/bin/fi_info -p efa: fi_getinfo: -61"]


@case(fabric_rules.NCCL_VERSION_MISMATCH.id)
def _(sim: Sim) -> Expect:
    _fabric(sim)
    for n, v in (("node1", "2.21.5"), ("node2", "2.21.5"), ("node3", "2.18.1")):
        sim.node(n)["fabric"]["nccl_version"] = v
    return None, ["node1: NCCL 2.21.5", "node3: NCCL 2.18.1"]


@pytest.mark.parametrize("tree", ["ib_hdr", "roce", "efa"])
def test_clean_fabric_cluster_has_no_fabric_finding(sim: Sim, tree: str) -> None:
    """The passing fixture of every fabric.* id: the recorded trees on every node, ddpfix's env files written."""
    _fabric(sim, tree)
    for n in sim.docs:
        sim.node(n)["fabric"]["nccl_version"] = "2.21.5"
        if tree == "efa":
            sim.node(n)["fabric"]["efa"]["fi_info"] = {"ran": True, "ok": True, "path": "/usr/bin/fi_info",
                                                       "providers": ["efa"], "error": None}
    sim.write_planned_env_files()
    assert [(f.id, f.host, f.evidence) for f in sim.findings()] == []


@passing(fabric_rules.PORT_DOWN.id, "down-everywhere-and-unused")
def _(sim: Sim) -> None:
    _fabric(sim)
    for n in sim.docs:
        _port(sim, n).update(state="DOWN", phys_state="Disabled")


def test_unread_fabric_is_not_evaluated_not_passed(sim: Sim) -> None:
    _fabric(sim)
    sim.node("node2")["unread"] = [{"source": "fabric", "reason": "/sys/class/infiniband/mlx5_0/ports: Permission denied"}]
    sim.node("node2")["fabric"]["memlock"] = {"soft": 65536, "hard": 65536}
    assert not [f for f in sim.findings() if f.id == fabric_rules.MEMLOCK_LOW.id]
    assert fabric_rules.MEMLOCK_LOW.id in _ne(sim)["node2"]


# ============================================================ the tests


def test_clean_cluster_has_no_finding_at_warning_or_above(sim: Sim) -> None:
    findings = sim.findings()
    assert at_least(findings, Severity.WARNING) == []
    assert sorted((f.id, f.host) for f in findings) == [(env_rules.MISSING.id, "node1"), (env_rules.MISSING.id, "node2"),
                                                         (env_rules.MISSING.id, "node3")]


def test_clean_cluster_with_planned_env_files_has_no_findings(sim: Sim) -> None:
    sim.write_planned_env_files()
    assert sim.findings() == []


def test_failing_mutations_only_touch_their_own_copy(sim: Sim) -> None:
    before = copy.deepcopy(Sim().docs)
    CASES[netif_rules.DOWN.id](sim)
    assert Sim().docs == before


def _firewalld_trusted_cluster() -> dict[str, Any]:
    st = _firewalld_public_without_port()
    zones = st["firewalld"]["zones"]
    zones["trusted"] = {**zones["public"], "target": "ACCEPT", "interfaces": [], "services": [],
                        "sources": ["192.168.77.0/24"]}  # what remediate does: trust the cluster CIDR
    return st


CORRECT_FIREWALLS = {
    "iptables-policy-drop-cluster-accept": lambda st: st.update(iptables=_iptables(
        ["-A INPUT -i lo -j ACCEPT", "-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
         "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT", "-A INPUT -s 192.168.77.0/24 -p tcp -j ACCEPT"], policy="DROP")),
    "firewalld-trusted-source": lambda st: st.update(_firewalld_trusted_cluster()),
}


@pytest.mark.parametrize("kind", sorted(CORRECT_FIREWALLS))
def test_correct_firewall_on_every_node_yields_no_firewall_finding(sim: Sim, kind: str) -> None:
    for n in sim.docs:
        CORRECT_FIREWALLS[kind](sim.node(n)["firewall"])
    assert at_least(sim.findings(), Severity.WARNING) == []


def test_unreachable_node_does_not_stop_the_others(sim: Sim) -> None:
    CASES[reachability_rules.UNREACHABLE.id](sim)
    sim.iface("node2")["mtu"] = 9000  # still compared between the reachable nodes
    sim.node("node1")["time"] = {"daemons": [], "chrony_tracking": None}
    ids = {(f.id, f.host) for f in sim.findings()}
    assert {(reachability_rules.UNREACHABLE.id, "node3"), (netif_rules.MTU_MISMATCH.id, None), (time_rules.NO_DAEMON.id, "node1")} <= ids
    assert not any(h == "node3" for i, h in ids if i != reachability_rules.UNREACHABLE.id)


def test_module_failure_is_not_unreachable(sim: Sim) -> None:
    """A node whose Python fails answered over SSH: reachability_rules.MODULE_FAILED with the module's error, no SSH fix text,
    counted apart from unreachable nodes; the other nodes are still fully audited."""
    from ddpfix.audit import audit_report

    CASES[reachability_rules.MODULE_FAILED.id](sim)
    sim.node("node1")["time"] = {"daemons": [], "chrony_tracking": None}
    findings = sim.findings()
    ids = {(f.id, f.host) for f in findings}
    assert (reachability_rules.MODULE_FAILED.id, "node2") in ids and (time_rules.NO_DAEMON.id, "node1") in ids
    assert not [f for f in findings if f.id == reachability_rules.UNREACHABLE.id]
    assert not any(h == "node2" for i, h in ids if i != reachability_rules.MODULE_FAILED.id)
    f = next(f for f in findings if f.id == reachability_rules.MODULE_FAILED.id)
    assert "SSH" not in f.fix and f.severity == Severity.ERROR
    doc, _ = audit_report(sim.context(), findings, probe=False)
    assert doc["summary"]["unreachable"] == 0 and doc["summary"]["module_failed"] == 1
    assert doc["hosts"]["node2"]["module_failed"] is True and "rc=1" in doc["hosts"]["node2"]["error"]
    from ddpfix import schemas
    from ddpfix.rules.context import not_read

    schemas.validate(doc)
    sim.set_unreachable("node3", "ssh: connect refused")
    assert not_read(sim.context(), ["node2", "node3"]) == "node2 not read (its module failed), node3 unreachable"


def test_a_module_failure_shows_what_the_node_wrote_as_one_printable_line() -> None:
    from ddpfix.ansible.results import module_failure

    got = module_failure({"failed": True, "rc": 1, "module_stdout": "{{ lookup('pipe', 'id') }}\x1b[2J",
                          "module_stderr": "x" * 5000 + "line1\nERROR: ddpfix: forged\x00\u2028",
                          "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error"})
    assert got is not None and "\n" not in got and "\x1b" not in got and "\x00" not in got and "\u2028" not in got
    assert got.startswith("MODULE FAILURE See stdout/stderr for the exact error; rc=1; stderr: ")
    assert "\\x1b[2J" in got and "\\x00" in got and len(got) < 1000


def test_a_module_that_failed_by_itself_keeps_its_own_message() -> None:
    from ddpfix.ansible.results import HostResult, module_failure, record_event

    assert module_failure({"failed": True, "msg": "nft -j list ruleset failed: Operation not permitted"}) is None
    hosts: dict[str, HostResult] = {}
    record_event(hosts, {"event": "runner_on_failed", "event_data": {
        "host": "n1", "task": "t", "resolved_action": "ddpfix.cluster.ddpfix_node_facts",
        "res": {"failed": True, "msg": "nft -j list ruleset failed: Operation not permitted"}}})
    assert hosts["n1"].failed and not hosts["n1"].unreachable and not hosts["n1"].module_error
    assert hosts["n1"].message == "nft -j list ruleset failed: Operation not permitted"


def test_a_python_the_ansible_core_dropped_is_one_line_naming_node_python_and_ansible_core(sim: Sim) -> None:
    """ansible-core's refusal of a node's Python (2.20 dropped 3.8 on nodes) is its own finding, one line naming the
    node, its Python and the ansible-core version, never MODULE_FAILED; the others are still fully audited."""
    from ddpfix.rules.reachability import ansible_core_version, unsupported_python

    sim.set_module_failed("node2", dict(PYTHON_TOO_OLD))
    findings = sim.findings()
    ids = {(f.id, f.host) for f in findings}
    assert (reachability_rules.PYTHON_UNSUPPORTED.id, "node2") in ids
    assert not any(h == "node2" for i, h in ids if i != reachability_rules.PYTHON_UNSUPPORTED.id)
    f = next(f for f in findings if f.id == reachability_rules.PYTHON_UNSUPPORTED.id)
    assert "\n" not in f.message and f.severity == Severity.ERROR
    assert f"node2 ({sim.node('node2')['cluster']['address']})" in f.message
    assert "Python 3.8.18 " in f.message and f"ansible-core {ansible_core_version()} " in f.message
    assert "Python 3.9 or newer" in f.message
    assert ansible_core_version()[:1].isdigit()
    # anything else a module says is not read as a refusal
    assert unsupported_python(INTERPRETER_EXIT_1["msg"]) is None and unsupported_python("") is None


def test_unreachable_master_is_reported_and_checks_still_run(sim: Sim) -> None:
    sim.set_unreachable("node1", "UNREACHABLE: timed out")
    ids = {(f.id, f.host) for f in sim.findings()}
    assert (reachability_rules.UNREACHABLE.id, "node1") in ids


def test_time_thresholds_are_configurable(sim: Sim) -> None:
    sim.node("node3")["now"] += 0.5
    assert not [f for f in sim.findings() if f.id == time_rules.SKEW.id]
    assert [f for f in sim.findings(Thresholds(max_skew_s=0.2)) if f.id == time_rules.SKEW.id]


def test_missing_collected_at_skips_skew(sim: Sim) -> None:
    sim.node("node3")["now"] += 50
    ctx = sim.context()
    ctx.hosts["node3"] = HostFacts("node3", node=sim.node("node3"), probe=sim.probe("node3"), collected_at=None)
    assert not [f for f in run_checks(ctx) if f.id == time_rules.SKEW.id]


def test_findings_are_sorted_by_severity_then_host(sim: Sim) -> None:
    for key in (time_rules.NO_DAEMON.id, netif_rules.MTU_MISMATCH.id, probes_rules.PEER_UNREACHABLE.id):
        CASES[key](sim)
    fs = sim.findings()
    keys = [(-int(f.severity), f.host or "") for f in fs]
    assert keys == sorted(keys)
    assert len(fs) == len(set(fs))


def test_context_derives_cidr_from_master_when_inventory_has_none(sim: Sim) -> None:
    ctx: Context = sim.context()
    assert ctx.cidr == "192.168.77.0/24"
    sim.set_var(None, ddp_cluster_cidr="192.168.77.0/25")
    assert sim.context().cidr == "192.168.77.0/25"


# ============================================================ unread facts: "not evaluated", never a pass


def _ne(sim: Sim) -> dict[str, dict[str, str]]:
    ctx = sim.context()
    return {h: {x["id"]: x["reason"] for x in v} for h, v in not_evaluated(ctx, run_checks(ctx)).items()}


def test_unreadable_firewall_is_not_evaluated_not_passed(sim: Sim) -> None:
    # node1 (the master) really blocks the master port, but its SSH user cannot read the firewall
    _firewall_state(sim, "node1", iptables=firewall_fixture("ipt_reject.iptables-save"))
    assert {f.id for f in sim.findings() if f.host == "node1"} >= {firewall_rules.MASTER_PORT_BLOCKED.id}
    _nonroot_firewall(sim, "node1")
    found = {(f.id, f.host) for f in sim.findings()}
    assert (reachability_rules.INCOMPLETE.id, "node1") in found
    assert not any(i.startswith("firewall.") for i, _ in found)
    ne = _ne(sim)
    assert set(ne) == {"node1"}
    assert set(ne["node1"]) == {firewall_rules.MASTER_PORT_BLOCKED.id, firewall_rules.PEER_PORTS_BLOCKED.id,
                                firewall_rules.WORLD_OPEN.id, firewall_rules.EGRESS_BLOCKED.id}  # its egress too
    assert all("not read: " in r and "you must be root" in r for r in ne["node1"].values())


def test_unreadable_firewall_on_a_worker_lists_only_the_checks_that_apply_there(sim: Sim) -> None:
    _nonroot_firewall(sim, "node2")
    assert set(_ne(sim)["node2"]) == {firewall_rules.PEER_PORTS_BLOCKED.id, firewall_rules.WORLD_OPEN.id,
                                      firewall_rules.EGRESS_BLOCKED.id}


def test_a_block_found_in_a_readable_layer_is_still_reported(sim: Sim) -> None:
    rule = "-A INPUT -p tcp -m tcp --dport 32768:60999 -j REJECT --reject-with icmp-port-unreachable"
    _firewall_state(sim, "node2", iptables=_iptables([rule]))
    sim.node("node2")["unread"] = [{"source": "nft", "reason": "nft -j list ruleset: timed out (timeout after 10s)"}]
    found = {(f.id, f.host) for f in sim.findings()}
    assert {(firewall_rules.PEER_PORTS_BLOCKED.id, "node2"), (reachability_rules.INCOMPLETE.id, "node2")} <= found
    # reported findings are not "not evaluated"; the node's egress is, with one layer unread
    assert set(_ne(sim)["node2"]) == {firewall_rules.WORLD_OPEN.id, firewall_rules.EGRESS_BLOCKED.id}


def test_a_node_whose_probe_did_not_run_reads_not_evaluated_never_passed(sim: Sim) -> None:
    """The run asked for probes and node2's facts hold no prober result (a probe task skipped): its probe checks
    are not evaluated (the incomplete-facts finding names them), never a silent pass; a prober's error or a run
    without a second node is no such case."""
    from ddpfix.audit import unprobed

    sim.docs["node2"]["probe"] = None
    ctx = sim.context()
    assert unprobed(ctx) == {"node2": "no probe ran on this node (its facts task returned no prober result)"}
    ctx.unanalysed.setdefault("node2", {})["probe"] = unprobed(ctx)["node2"]
    findings = run_checks(ctx)
    (inc,) = [f for f in findings if f.id == reachability_rules.INCOMPLETE.id]
    assert inc.host == "node2" and "could not read probe on node2" in inc.message, inc
    ne = {h: {x["id"] for x in v} for h, v in not_evaluated(ctx, findings).items()}
    assert {probes_rules.MASTER_PORT_UNREACHABLE.id, probes_rules.PEER_UNREACHABLE.id,
            netif_rules.CANNOT_REACH_PEERS.id} <= ne["node2"], ne
    sim.node("node2")["probe"]["error"] = "cannot listen on 192.168.77.12:41000: Address already in use"
    assert unprobed(sim.context()) == {}  # the prober ran and failed: its own finding says so


def test_unread_interfaces_withdraw_netif_findings(sim: Sim) -> None:
    CASES[f"{reachability_rules.INCOMPLETE.id}:interfaces"](sim)
    found = {(f.id, f.host) for f in sim.findings()}
    assert not any(i.startswith("netif.") for i, h in found if h == "node2"), found
    assert {netif_rules.MISSING.id, netif_rules.DOWN.id, firewall_rules.PEER_PORTS_BLOCKED.id} <= set(_ne(sim)["node2"])


def test_hidden_processes_withdraw_time_no_daemon(sim: Sim) -> None:
    sim.node("node3")["time"] = {"daemons": [], "chrony_tracking": None}
    sim.node("node3")["unread"] = [{"source": "processes",
                                    "reason": "/proc hides other users' processes from ddp (mounted with hidepid)"}]
    ids = {(f.id, f.host) for f in sim.findings()}
    assert (time_rules.NO_DAEMON.id, "node3") not in ids and (reachability_rules.INCOMPLETE.id, "node3") in ids
    # every rule that reads the processes (the time daemon and its sync, ...) is withdrawn on node3
    from ddpfix.rules import registry as rules

    reads = {i for i, sources in rules.depends_on().items() if "processes" in sources} - rules.master_only()
    assert set(_ne(sim)["node3"]) == reads >= {time_rules.NO_DAEMON.id, time_rules.UNSYNCHRONIZED.id}


def test_every_dependency_names_a_rule_and_a_documented_source() -> None:
    from ddpfix.rules import registry as rules

    assert set(rules.depends_on()) | rules.master_only() | rules.sound_on_partial() <= set(RULES)
    doc = (ROOT / "plugins" / "modules" / "ddpfix_node_facts.py").read_text()
    for src in set().union(*rules.depends_on().values()):
        assert f"C({src})" in doc, src


def test_report_shows_not_evaluated_per_host(sim: Sim) -> None:
    import io

    from rich.console import Console

    from ddpfix.audit import host_summaries
    from ddpfix.report import document, render_table

    _nonroot_firewall(sim, "node1")
    ctx = sim.context()
    fl = run_checks(ctx)
    doc = document("audit", ["inv"], host_summaries(ctx.hosts, ctx.plan, ctx.cluster, not_evaluated(ctx, fl)), fl)
    h1 = doc["hosts"]["node1"]
    assert [u["source"] for u in h1["facts"]["unread"]] == ["ip6tables", "iptables", "nft"]
    assert {x["id"] for x in h1["not_evaluated"]} == {firewall_rules.MASTER_PORT_BLOCKED.id, firewall_rules.PEER_PORTS_BLOCKED.id,
                                                        firewall_rules.WORLD_OPEN.id, firewall_rules.EGRESS_BLOCKED.id}
    assert doc["hosts"]["node2"]["not_evaluated"] == [] and doc["summary"]["not_evaluated"] == 4
    out = io.StringIO()
    render_table(json.loads(json.dumps(doc)), Console(file=out, width=200))
    text = out.getvalue()
    assert "NOT EVALUATED" in text and firewall_rules.MASTER_PORT_BLOCKED.id in text and "4 check(s) not evaluated on 1 host" in text


# ============================================================ nccl_select: NCCL_SOCKET_IFNAME grammar


def _ifaces(*spec: tuple[str, str | None]) -> list[dict[str, Any]]:
    out = []
    for idx, (name, addr) in enumerate(spec, 1):
        addrs = [{"family": "inet", "local": addr, "prefixlen": 24}] if addr else []
        out.append({"name": name, "index": idx, "addrs": addrs})
    return out


IFACES = _ifaces(("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("eth0", "192.168.77.11"), ("eth1", "10.0.0.1"),
                 ("ens5", "10.1.0.1"), ("virbr0", "192.168.122.1"), ("veth12ab", None), ("br-0f1e", "172.18.0.1"))


def _names(spec: str | None, ifaces: list[dict[str, Any]] = IFACES) -> list[str]:
    return [i["name"] for i in nccl_select(spec, ifaces)]


@pytest.mark.parametrize(("spec", "want"), [
    ("eth", ["eth0", "eth1"]),  # prefix
    ("eth,ens", ["eth0", "eth1", "ens5"]),  # prefix list
    ("=eth0", ["eth0"]),  # exact
    ("=eth", []),  # exact does not prefix-match
    ("=eth0,ens5", ["eth0", "ens5"]),  # exact list
    ("^docker,lo", ["eth0", "eth1", "ens5", "virbr0", "br-0f1e"]),  # exclude prefixes
    ("^=eth0", ["lo", "docker0", "eth1", "ens5", "virbr0", "br-0f1e"]),  # exclude exact
    ("^eth", ["lo", "docker0", "ens5", "virbr0", "br-0f1e"]),
    ("ib", []),
])
def test_nccl_select_grammar(spec: str, want: list[str]) -> None:
    assert _names(spec) == want


def test_nccl_select_default_skips_docker_lo_virbr_and_keeps_index_order() -> None:
    assert _names(None) == ["eth0", "eth1", "ens5", "br-0f1e"]
    assert _names("") == ["eth0", "eth1", "ens5", "br-0f1e"]


def test_nccl_select_default_prefers_ib() -> None:
    ifaces = [*IFACES, {"name": "ib0", "index": 99, "addrs": [{"family": "inet", "local": "10.9.0.1", "prefixlen": 24}]}]
    assert _names(None, ifaces) == ["ib0"]


def test_nccl_select_ignores_interfaces_without_ipv4() -> None:
    ifaces = _ifaces(("eth0", None), ("eth1", "10.0.0.1"))
    ifaces[0]["addrs"] = [{"family": "inet6", "local": "fe80::1", "prefixlen": 64}]
    assert _names(None, ifaces) == ["eth1"]
    assert _names("=eth0", ifaces) == []


def test_nccl_select_orders_by_index_not_list_order() -> None:
    ifaces = list(reversed(_ifaces(("eth0", "10.0.0.1"), ("eth1", "10.0.1.1"))))
    assert _names("eth", ifaces) == ["eth0", "eth1"]


def test_clock_offset_counts_only_what_lies_outside_the_task_window() -> None:
    from ddpfix.rules.time import clock_offset

    assert clock_offset(100.5, (100.0, 101.0), None) == 0.0  # inside: synchronised as far as we can tell
    assert clock_offset(106.0, (100.0, 101.0), None) == 5.0
    assert clock_offset(97.0, (100.0, 101.0), None) == -3.0
    assert clock_offset(103.0, None, 100.0) == 3.0  # no window: fall back to the result's arrival
    assert clock_offset(103.0, None, None) is None


def test_memlock_of_a_launcher_unit_counts_too(sim: Sim) -> None:
    _fabric(sim)
    sim.node("node3")["fabric"]["memlock_units"] = {
        "trainer.service": {"soft": 8388608, "hard": 8388608, "source": "systemd unit trainer.service"}}
    f = [f for f in sim.findings() if f.id == fabric_rules.MEMLOCK_LOW.id]
    assert [x.host for x in f] == ["node3"] and "systemd unit trainer.service: soft 8388608 (8 MiB)" in f[0].evidence


# ---------------------------------------------------------------- the managed hosts block, node against node


def _hosts_with_block(lines: list[str]) -> str:
    return "127.0.0.1 localhost\n# BEGIN ddpfix managed block\n" + "".join(f"{ln}\n" for ln in lines) + \
        "# END ddpfix managed block\n"


def test_hosts_block_digest_is_the_nodes_own() -> None:
    from ddpfix.local import node_facts_module

    digest = node_facts_module().block_digest
    a = _hosts_with_block(["192.168.77.11 node1", "192.168.77.12 node2"])
    assert digest(a) == digest("10.9.9.9 other\n" + a) and len(digest(a)) == 64  # the block only
    assert digest(a) != digest(_hosts_with_block(["192.168.77.11 node1"]))
    assert digest("127.0.0.1 localhost\n") is None and digest("") is None


def test_hosts_block_differs_after_a_fix_under_limit(sim: Sim) -> None:
    """remediate --limit node3 wrote the block on node3 only: one cluster-wide warning naming node3, fixed by the
    hosts block on every node; the same block everywhere, or none anywhere, is no finding."""
    from ddpfix.local import node_facts_module

    digest = node_facts_module().block_digest
    block = digest(_hosts_with_block(["192.168.77.11 node1", "192.168.77.12 node2", "192.168.77.13 node3"]))
    for n in ("node1", "node2", "node3"):
        sim.node(n)["hosts_block_sha256"] = None
    assert hosts_rules.BLOCK_DIFFERS.id not in {f.id for f in sim.findings()}
    sim.node("node3")["hosts_block_sha256"] = block
    (f,) = [f for f in sim.findings() if f.id == hosts_rules.BLOCK_DIFFERS.id]
    assert f.host is None and f.severity == Severity.WARNING and "node3 against node1, node2" in f.message
    assert f"node3: block sha256 {block[:12]}" in f.evidence and "node1, node2: no managed block" in f.evidence
    assert "node3 differ" in f.fix and RULES[f.id].fixable
    for n in ("node1", "node2"):
        sim.node(n)["hosts_block_sha256"] = block
    assert hosts_rules.BLOCK_DIFFERS.id not in {f.id for f in sim.findings()}


def test_hosts_block_of_a_node_not_read_or_invalid_is_left_out(sim: Sim) -> None:
    sim.node("node1")["hosts_block_sha256"] = "a" * 64
    sim.node("node2")["hosts_block_sha256"] = "a" * 64
    sim.node("node3")["hosts_block_sha256"] = "<b>not a digest</b>"  # a node's value is validated, never echoed
    assert hosts_rules.BLOCK_DIFFERS.id not in {f.id for f in sim.findings()}
    sim.node("node3")["hosts_block_sha256"] = None
    sim.node("node3").setdefault("unread", []).append({"source": "hosts_file", "reason": "permission denied"})
    assert hosts_rules.BLOCK_DIFFERS.id not in {f.id for f in sim.findings()}
    sim.set_unreachable("node2", "ssh: timeout")
    sim.node("node3")["unread"] = []
    assert hosts_rules.BLOCK_DIFFERS.id in {f.id for f in sim.findings()}  # node1 has the block, node3 has none


# ============================================================ NCCL's and Gloo's automatic choice: virtual and overlay


def _auto(ifaces: list[dict[str, Any]], version: str = "2.28.3+") -> list[tuple[str, str]]:
    from ddpfix.ifselect import nccl_autoselect

    return [(i["name"], a) for i, a in nccl_autoselect(ifaces, version)]


def _up(ifaces: list[dict[str, Any]], down: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    for i in ifaces:
        i["flags"] = ["BROADCAST", "MULTICAST"] if i["name"] in down else ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"]
        i["operstate"] = "DOWN" if i["name"] in down else "UP"
    return ifaces


def test_nccl_autoselect_replays_each_version() -> None:
    ifaces = _up(_ifaces(("lo", "127.0.0.1"), ("virbr0", "192.168.122.1"), ("eth0", "192.168.77.11")))
    ifaces[0]["operstate"] = "UNKNOWN"  # loopback: IFF_RUNNING with operstate UNKNOWN
    assert _auto(ifaces, "<2.28.3")[0] == ("virbr0", "192.168.122.1")  # "^docker,lo" only
    assert _auto(ifaces) == [("eth0", "192.168.77.11")]  # 2.28.3: "^docker,lo,virbr"
    # then docker*, lo*, and virbr* last
    assert _auto(_up(_ifaces(("lo", "127.0.0.1"), ("virbr0", "192.168.122.1")))) == [("lo", "127.0.0.1")]
    assert _auto(_up(_ifaces(("virbr0", "192.168.122.1"),))) == [("virbr0", "192.168.122.1")]


def test_nccl_autoselect_skips_interfaces_without_carrier_from_2_28_3() -> None:
    ifaces = _up(_ifaces(("cni0", "10.244.0.1"), ("eth0", "192.168.77.11")), down=("cni0",))
    assert _auto(ifaces)[0][0] == "eth0"
    assert _auto(ifaces, "<2.28.3")[0][0] == "cni0"


def test_nccl_autoselect_takes_ipv4_entries_before_ipv6_and_one_per_name() -> None:
    ifaces = _up(_ifaces(("veth1", None), ("eth0", "192.168.77.11")))
    ifaces[0]["addrs"] = [{"family": "inet6", "local": "fe80::1", "prefixlen": 64}]
    ifaces[1]["addrs"].append({"family": "inet6", "local": "fd00::11", "prefixlen": 64})
    assert _auto(ifaces) == [("eth0", "192.168.77.11"), ("veth1", "fe80::1")]


@case(netif_rules.AUTOSELECT_WRONG.id, "overlay-inside-cidr")
def _(sim: Sim) -> Expect:
    # Calico's default pool 192.168.0.0/16 overlaps a broad ddp_cluster_cidr: vxlan.calico is in the CIDR, yet no
    # path between nodes for NCCL's bootstrap
    sim.set_var(None, ddp_cluster_cidr="192.168.0.0/16")
    _add_iface(sim, "node2", "vxlan.calico", 2, "192.168.140.64", 32, kind="vxlan")
    sim.node("node2")["interfaces"].sort(key=lambda i: i["index"])
    return "node2", ["vxlan.calico=192.168.140.64", "eth0=192.168.77.12"]


@case(netif_rules.AUTOSELECT_WRONG.id, "gloo-overlay")
def _(sim: Sim) -> Expect:
    # the hostname resolves (Tailscale MagicDNS, an /etc/hosts line) to the node's tailnet address
    _add_iface(sim, "node3", "tailscale0", 5, "100.101.102.103", 32, kind="tun")
    sim.node("node3")["resolve_self"] = {"node3": ["100.101.102.103", "192.168.77.13"]}
    return "node3", ["100.101.102.103 is on tailscale0"]


def test_gloo_autoselect_skips_what_does_not_bind(sim: Sim) -> None:
    from ddpfix.ifselect import gloo_autoselect

    f = sim.node("node3")
    f["resolve_self"] = {"node3": ["fe80::1", "198.51.100.7", "192.168.77.13"]}  # unscoped link-local, not local
    assert gloo_autoselect(f) == "192.168.77.13"
    f["resolve_self"] = {"node3": ["198.51.100.7"]}
    assert gloo_autoselect(f) is None  # torch falls back to 127.0.0.1 (hosts checks report the name)
    assert [x for x in sim.findings() if x.id == netif_rules.AUTOSELECT_WRONG.id] == []


@passing(netif_rules.AUTOSELECT_WRONG.id, "bridge-holding-the-cluster-address")
def _(sim: Sim) -> None:
    """br0 enslaving the physical NIC is a host's real LAN: NCCL picking it is right."""
    for n in sim.docs:
        for i in sim.node(n)["interfaces"]:
            if i["name"] == "eth0":
                i.update(name="br0", kind="bridge")
        sim.node(n)["cluster"]["ifname"] = "br0"
    _add_iface(sim, "node2", "veth0a1b", 2, "10.244.0.1", 24, kind="veth")
    sim.node("node2")["interfaces"][-1]["index"] = 9
