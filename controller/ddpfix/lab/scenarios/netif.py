"""Interface, address and route scenarios (rows 4, 5, 7, 8, 11): interface names, auto-selection, MTU, a downed
interface, a public master address, wrong env files, gateway routes, rp_filter, ARP flux, address families.
"""

from __future__ import annotations

import ipaddress

from ddpfix.errors import ExitCode
from ddpfix.lab.model import ExtraNic, LabError, LabPlan, NodePlan
from ddpfix.lab.scenarios.registry import Expect, last, scenario, second, set_env_everywhere, unused_ifname
from ddpfix.rules import env as env_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import netif as netif_rules

PUBLIC_MASTER_ADDR = "203.0.113.10"  # TEST-NET-3: configuration text only, never contacted




@scenario(
    "ifname-mismatch",
    "eth0 on odd nodes, ens5 on even nodes, and env files everywhere saying GLOO/NCCL_SOCKET_IFNAME=eth0",
    (netif_rules.MISSING.id, netif_rules.NAME_MISMATCH.id),
    min_nodes=2,
)
def _ifname_mismatch(plan: LabPlan) -> None:
    """Failure mode: interface names. The cluster NIC is `eth0` on node1, node3, ... and `ens5` on node2,
    node4, ... (overrides --ifnames); every node has an existing env file (at its default path) with
    GLOO/NCCL/TP_SOCKET_IFNAME=eth0 and otherwise right values (MASTER_ADDR,
    MASTER_PORT, NNODES, NODE_RANK, WORLD_SIZE). Findings: netif_rules.MISSING on the ens5 nodes,
    netif_rules.NAME_MISMATCH (cluster)."""
    for n in plan.nodes:
        n.ifname = "eth0" if n.index % 2 else "ens5"
    set_env_everywhere(plan, GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0")


@scenario(
    "autoselect-wrong",
    "node2 also has docker0 (172.17.0.1/16) and br-<id> (172.18.0.1/16) + veth, indexed before the cluster NIC",
    (netif_rules.AUTOSELECT_WRONG.id,),
)
def _autoselect_wrong(plan: LabPlan) -> None:
    """Failure mode: NIC auto-selection. node2 (node1 in a one-node lab) has Docker-like interfaces created before
    its cluster NIC, so they come first in interface-index (getifaddrs) order: `docker0`
    172.17.0.1/16 (excluded by NCCL's default `^docker,lo,virbr`) and a user-network bridge
    `br-3f9a1c2b7d10` 172.18.0.1/16 with a veth `veth6c2e1f4` attached (up), which NCCL's default
    selection does not exclude and therefore picks instead of the cluster NIC. No env file and no
    IFNAME anywhere. Finding: netif_rules.AUTOSELECT_WRONG on that node."""
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
IFNAME_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def _unset_ifnames(node: NodePlan) -> None:
    """Leave the automatic choice to NCCL and Gloo on `node`: drop the IFNAME keys from an env file an earlier
    scenario of the same lab wrote (lab B's env-wrong writes one everywhere)."""
    if node.env is not None:
        node.env = {k: v for k, v in node.env.items() if k not in IFNAME_KEYS}


@scenario(
    "autoselect-overlay",
    "node1 has flannel's flannel.1 and a CNI bridge cni0 (+ veth) indexed before its cluster NIC; no IFNAME",
    expect=(
        Expect(netif_rules.AUTOSELECT_WRONG.id, "node1", lambda info: [
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
    from an env file an earlier scenario wrote). Finding: netif_rules.AUTOSELECT_WRONG on node1."""
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
        Expect(netif_rules.AUTOSELECT_WRONG.id, "node2", lambda info: [
            f"usb0=169.254.3.{10 + 2}", f"{info.node('node2').ifname}={info.node('node2').address}",
            "link-local, 169.254.0.0/16"]),
    ),
)
def _autoselect_linklocal(plan: LabPlan) -> None:
    """Failure mode: NIC auto-selection on a server whose BMC exposes a USB network interface (Redfish host
    interface, iDRAC/XClarity/iLO `usb0` with a 169.254.x.x address): node2 gets `usb0` (a veth, up) with
    169.254.3.<10+i>/16 before its cluster NIC. NCCL picks it first; a link-local address is never routed, so no
    peer reaches the bootstrap listener there (uccl-project/uccl#1034). The IFNAME keys stay unset on node2 (removed
    from an env file an earlier scenario wrote). Finding: netif_rules.AUTOSELECT_WRONG on node2."""
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
    (netif_rules.MTU_MISMATCH.id,),
    min_nodes=2,
)
def _mtu_mismatch(plan: LabPlan) -> None:
    """Failure mode: MTU. nodeN's cluster NIC has MTU 1400 (its switch port stays at 1500).
    Finding: netif_rules.MTU_MISMATCH (cluster, naming nodeN)."""
    last(plan).mtu = 1400


@scenario(
    "netif-down",
    "the highest-address node's configured socket interface (ddp_socket_ifname=ens6, in the CIDR) is down",
    (netif_rules.DOWN.id,),
)
def _netif_down(plan: LabPlan) -> None:
    """A cluster interface that is down while SSH still works. Design: nodeN gets a second veth
    onto the lab switch, `ens6` (or `ens7` if ens6 is taken), with an address in the cluster CIDR
    (the first address after the node addresses), and the link is down; the inventory sets
    `ddp_socket_ifname: ens6` for nodeN, so ens6 is its configured cluster interface, while
    Ansible keeps reaching nodeN on its management address on the primary NIC.
    Finding: netif_rules.DOWN on nodeN. Bringing ens6 up would give the node two interfaces in one
    subnet; remediation reports this finding rather than fixing it."""
    node = last(plan)
    name = unused_ifname(node, "ens6", "ens7", "eth9")
    addr = ipaddress.IPv4Interface(f"{plan.spare_address(1)}/{plan.subnet.prefixlen}")
    node.extra_nics.append(ExtraNic(name, addr, up=False))
    node.hostvars["ddp_socket_ifname"] = name




@scenario(
    "master-addr-public",
    f"env files everywhere with MASTER_ADDR={PUBLIC_MASTER_ADDR} (a public/NAT address), the rest right",
    (net_rules.MASTER_NOT_PRIVATE.id,),
)
def _master_addr_public(plan: LabPlan) -> None:
    """Failure mode: env files. Every node has an existing env file (at its default path) whose MASTER_ADDR is
    203.0.113.10 (TEST-NET-3, configuration text only: the lab has no route out and nothing
    connects to it), everything else right (port, ranks, sizes, own interface).
    Finding: net_rules.MASTER_NOT_PRIVATE."""
    set_env_everywhere(plan, MASTER_ADDR=PUBLIC_MASTER_ADDR)


@scenario(
    "env-wrong",
    "env files everywhere; on the highest-address node MASTER_ADDR is not the master and the IFNAME does not exist",
    (env_rules.INCONSISTENT.id, net_rules.MASTER_NOT_PRIVATE.id, netif_rules.MISSING.id),
    min_nodes=2,
)
def _env_wrong(plan: LabPlan) -> None:
    """Every node has an existing env file (at its default path); the one on nodeN has MASTER_ADDR = node2's
    lab address (a lab address that is not the master's) and GLOO/NCCL_SOCKET_IFNAME naming an
    interface that does not exist there (`eth1`, or `ens4` if eth1 is taken). The files disagree
    between nodes. Findings: env_rules.INCONSISTENT (cluster), net_rules.MASTER_NOT_PRIVATE and netif_rules.MISSING
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
    (net_rules.VIA_GATEWAY.id,),
    min_nodes=2,
)
def _route_via_gateway(plan: LabPlan) -> None:
    """Failure mode: routes. nodeN has `ip route add <master>/32 via <gw> dev <nic>`. With 3+ nodes
    the gateway is node2, which forwards (ip_forward=1, no ICMP redirects, in node2's namespace
    only), so traffic still arrives but goes around; with 2 nodes it is the lab's non-existent
    gateway address (traffic to the master is then lost inside the lab). nodeN ignores ICMP
    redirects. Finding: net_rules.VIA_GATEWAY on nodeN."""
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


STORAGE_NET = ipaddress.ip_network("172.31.0.0/24")  # a second IPv4 network inside a node (never routed out)


@scenario(
    "rp-filter-strict",
    "node2 is multi-homed (a second IPv4 NIC stor0) and its cluster NIC has strict reverse-path filtering "
    "(rp_filter 1)",
    min_nodes=2,
    expect=(
        Expect(
            net_rules.RP_FILTER_STRICT.id,
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
    Finding: net_rules.RP_FILTER_STRICT on node2."""
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


ARP_LAB_IFNAME = "arp0"
ARP_LAB_SPARE = 6  # plan.spare_address(6): an address of the cluster network nobody else holds


def inner_veth(ifname: str, address: str) -> list[str]:
    """`ip -batch` lines for a veth `ifname` holding `address`, up, whose peer (`ifname`p) stays inside the node: an
    interface that carries an address but reaches nothing outside."""
    return [f"link add {ifname} type veth peer name {ifname}p", f"addr add {address} dev {ifname}",
            f"link set {ifname}p up", f"link set {ifname} up"]


def arp_node(plan: LabPlan) -> NodePlan:
    return plan.nodes[2] if len(plan.nodes) > 2 else plan.nodes[-1]


@scenario(
    "arp-flux",
    f"node3 has a second interface ({ARP_LAB_IFNAME}) with an address in the cluster network and the ARP sysctls at "
    "their defaults",
    min_nodes=2,
    expect=(
        Expect(net_rules.ARP_FLUX.id, "node3", lambda info: [
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
    namespace). The cluster NIC then answers ARP for arp0's address too. Finding: net_rules.ARP_FLUX on node3; ddpfix
    remediate --apply sets arp_ignore 1 / arp_announce 2 on both, at runtime and in /etc/sysctl.d."""
    node = arp_node(plan)
    node.post_ip += inner_veth(ARP_LAB_IFNAME, f"{plan.spare_address(ARP_LAB_SPARE)}/32")


def ula_address(plan: LabPlan, node: NodePlan) -> str:
    """The lab's IPv6 ULA address of `node` (fd00:dd:<3rd octet of the subnet>::<10+index>)."""
    return f"fd00:dd:{plan.subnet.network_address.packed[2]:x}::{10 + node.index:x}"


@scenario(
    "family-mismatch",
    "every node also has an IPv6 ULA on its NIC; the highest-address node's /etc/hosts maps its peers to IPv6 only",
    (hosts_rules.FAMILY_MISMATCH.id,),
    min_nodes=2,
)
def _family_mismatch(plan: LabPlan) -> None:
    """Failure mode: addresses (address family). Every node gets an IPv6 ULA address
    (fd00:dd:<3rd octet>::<10+i>/64, see `ula_address`) on its cluster NIC besides its IPv4
    address; on nodeN /etc/hosts maps every peer's hostname to the peer's ULA only, while the
    other nodes map them to IPv4. So peers resolve to IPv6 on nodeN and to IPv4 elsewhere (and to
    an address outside the IPv4 cluster CIDR on nodeN). Findings: hosts_rules.FAMILY_MISMATCH (cluster),
    and hosts_rules.PEER_MISMATCH on nodeN."""
    for n in plan.nodes:
        n.post_ip.append(f"addr add {ula_address(plan, n)}/64 dev {n.ifname} nodad")
    node = last(plan)
    peers = {m.hostname: m for m in plan.nodes if m is not node}
    hosts = [(a, [x for x in names if x not in peers]) for a, names in node.hosts]
    node.hosts = [(a, names) for a, names in hosts if names]
    node.hosts += [(ula_address(plan, m), [hn]) for hn, m in peers.items()]
