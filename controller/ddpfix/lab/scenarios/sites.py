"""No fault, a site's shape: a second (data) network, an isolated NIC, and how the controller logs in (bastion,
non-root with or without become, a non-default SSH port).
"""

from __future__ import annotations

import ipaddress

from ddpfix.errors import ExitCode
from ddpfix.lab.model import ExtraNic, LabError, LabPlan
from ddpfix.lab.scenarios.netif import IFNAME_KEYS, arp_node, inner_veth
from ddpfix.lab.scenarios.registry import scenario, unused_ifname
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import netif as netif_rules


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
    (hosts_rules.PEER_NAME_OTHER_NETWORK.id,),
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
    (netif_rules.CANNOT_REACH_PEERS.id,),
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
    that reaches every peer. Finding: netif_rules.CANNOT_REACH_PEERS on node3; ddpfix remediate --apply writes the
    cluster NIC with a `# GLOO_SOCKET_IFNAME:` line saying why."""
    node = arp_node(plan)
    node.post_ip += inner_veth(ISO_IFNAME, f"{isolated_address(plan, node.index)}/32")
    node.sysctls["net.ipv4.conf.all.arp_ignore"] = "1"
    node.sysctls["net.ipv4.conf.all.arp_announce"] = "2"
    node.env = plan.env_for(node, **dict.fromkeys(IFNAME_KEYS, ISO_IFNAME))



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
