"""/etc/hosts and identity scenarios (rows 2, 3, 10): loopback hostnames, unresolvable or mismatched peers,
duplicate hostnames, a bind-mounted /etc/hosts, cloned machine ids.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ddpfix.lab.model import LabPlan, NodePlan
from ddpfix.lab.scenarios.registry import last, scenario, second
from ddpfix.rules import hosts as hosts_rules

if TYPE_CHECKING:
    from ddpfix.lab.daemons import Runtime

WRONG_PEER_ADDR = "198.51.100.7"  # TEST-NET-2: configuration text only, never contacted
CLAIMED_NAME = "pypi.org"  # the name the hostname-claim node calls itself: never resolved nor contacted by the lab
#: the operator's own /etc/hosts lines for names ddpfix does not manage (RFC 1918 / TEST-NET-3 text, never contacted)
OPERATOR_LINES = (("10.0.0.5", ["nfs01", "storage"]), ("203.0.113.80", [CLAIMED_NAME, "files.pythonhosted.org"]))




@scenario(
    "hostname-loopback",
    "two nodes (incl. the highest-address one) map their own hostname to 127.0.1.1, Debian-style",
    (hosts_rules.HOSTNAME_LOOPBACK.id,),
    min_nodes=2,
)
def _hostname_loopback(plan: LabPlan) -> None:
    """Failure mode: hostname on loopback. On nodeN and node(N-1) /etc/hosts has the Debian installer's
    `127.0.1.1 <own hostname>` line and no other line for the own name, so `getent ahosts
    $(hostname)` gives 127.0.1.1 and Gloo would advertise loopback. Finding:
    hosts_rules.HOSTNAME_LOOPBACK on those two nodes."""
    for node in plan.nodes[-2:]:
        hosts = [(a, [x for x in names if x != node.hostname]) for a, names in node.hosts]
        hosts = [(a, names) for a, names in hosts if names]
        at = next((i + 1 for i, (a, _) in enumerate(hosts) if a == "127.0.0.1"), 0)
        hosts.insert(at, ("127.0.1.1", [node.hostname]))
        node.hosts = hosts


@scenario(
    "hostname-claim",
    f"the highest-address node calls itself {CLAIMED_NAME}, on 127.0.1.1; every /etc/hosts holds operator lines",
    (hosts_rules.NAME_UNVOUCHED.id,),
    min_nodes=2,
)
def _hostname_claim(plan: LabPlan) -> None:
    """A node naming things for others (issue 36): nodeN's hostname (UTS and /etc/hostname) is pypi.org, which its
    /etc/hosts maps to 127.0.1.1 (Debian-style). Every node's /etc/hosts also holds the operator's own lines for
    names ddpfix does not manage: `10.0.0.5 nfs01 storage` and, on the others, a mirror `203.0.113.80 pypi.org
    files.pythonhosted.org` (text only, never contacted). Finding: hosts_rules.NAME_UNVOUCHED on nodeN; ddpfix writes
    pypi.org nowhere and leaves those lines as they are."""
    claimer = last(plan)
    claimer.hostname = CLAIMED_NAME
    for node in plan.nodes:
        node.hosts += [(a, list(names)) for a, names in OPERATOR_LINES
                       if node is not claimer or CLAIMED_NAME not in names]
    at = next((i + 1 for i, (a, _) in enumerate(claimer.hosts) if a == "127.0.0.1"), 0)
    claimer.hosts.insert(at, ("127.0.1.1", [CLAIMED_NAME]))


@scenario(
    "peer-unresolvable",
    "node2's /etc/hosts lacks the other nodes (and the resolver answers nothing)",
    (hosts_rules.PEER_UNRESOLVABLE.id,),
    min_nodes=2,
)
def _peer_unresolvable(plan: LabPlan) -> None:
    """Failure mode: peer name resolution. node2's /etc/hosts only knows localhost and itself; with the resolver at
    127.0.0.1 (nothing listens) no peer name resolves there. Finding: hosts_rules.PEER_UNRESOLVABLE on
    node2 for every other node."""
    node = plan.nodes[1]
    peers = {n.hostname for n in plan.nodes if n is not node} | {n.name for n in plan.nodes if n is not node}
    node.hosts = [(a, names) for a, names in node.hosts if not set(names) & peers]


@scenario(
    "peer-mismatch",
    f"node1 maps node2's name to {WRONG_PEER_ADDR}, outside the subnet (never contacted)",
    (hosts_rules.PEER_MISMATCH.id,),
    min_nodes=2,
)
def _peer_mismatch(plan: LabPlan) -> None:
    """Failure mode: peer name resolution. node1's /etc/hosts maps node2's hostname to 198.51.100.7 (TEST-NET-2,
    outside the cluster CIDR; the lab has no route out, and nothing is ever sent there), while
    every other node maps it to node2's lab address. Finding: hosts_rules.PEER_MISMATCH on node1
    (node2 resolves outside the CIDR / differently on different nodes)."""
    node, peer = plan.nodes[0], plan.nodes[1]
    node.hosts = [(WRONG_PEER_ADDR if peer.hostname in names else a, names) for a, names in node.hosts]


@scenario(
    "duplicate-hostname",
    "the highest-address node has the same hostname as node(N-1), like a cloned VM",
    (hosts_rules.DUPLICATE_HOSTNAME.id, hosts_rules.NAME_FORM_DIFFERS.id),
    min_nodes=2,
)
def _duplicate_hostname(plan: LabPlan) -> None:
    """Failure mode: duplicate hosts. nodeN's hostname (UTS and /etc/hostname) is node(N-1)'s; inventory names
    stay unique and every /etc/hosts still maps the inventory names to the lab addresses (so the
    clone's own name resolves to its twin's address). Findings: hosts_rules.DUPLICATE_HOSTNAME (cluster), and
    hosts_rules.NAME_FORM_DIFFERS on nodeN (its hostname resolves to an address it does not hold)."""
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


@scenario(
    "machine-id-clone",
    "the highest-address node has the same /etc/machine-id as node(N-1), like a cloned VM",
    (hosts_rules.DUPLICATE_MACHINE_ID.id,),
    min_nodes=2,
)
def _machine_id_clone(plan: LabPlan) -> None:
    """Failure mode: duplicate hosts (clone leftovers). nodeN and node(N-1) share one /etc/machine-id;
    hostnames stay unique. Finding: hosts_rules.DUPLICATE_MACHINE_ID (cluster, naming both nodes)."""
    mid = hashlib.sha256(f"ddpfix-lab-{plan.name}-clone".encode()).hexdigest()[:32]
    for node in plan.nodes[-2:]:
        node.files["machine-id"] = mid + "\n"
