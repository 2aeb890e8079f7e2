"""Findings: the public contract of every check (ids, severities, fixability, the fix)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Severity(enum.IntEnum):
    INFO = 1
    WARNING = 2
    ERROR = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    fixable: bool
    summary: str
    fix: str


_RULES = [
    Rule("host.unreachable", Severity.ERROR, False, "node not reachable over SSH",
         "Make the node reachable over SSH (sshd running, key, known_hosts, network) and re-run."),
    Rule("facts.incomplete", Severity.WARNING, False, "some facts could not be read on this node (the checks using them are not evaluated)",
         "Let the SSH user read them (root, or become: true with passwordless sudo) or install the missing tool, then re-run; "
         "until then the checks listed as not evaluated say nothing about this node."),
    Rule("facts.invalid", Severity.ERROR, False, "the node returned a value ddpfix will not write anywhere (bad hostname/address)",
         "Fix {fact} on the node (e.g. hostnamectl set-hostname with an RFC 1123 name); ddpfix leaves it out of every "
         "peer's files and refuses to remediate or write env files until it is fixed."),
    Rule("firewall.master-port-blocked", Severity.ERROR, True, "master's firewall blocks MASTER_PORT from the cluster",
         "Allow TCP from {cidr} to port {port} on the master (ddpfix remediate adds {cidr} as a trusted source / an ACCEPT rule)."),
    Rule("firewall.peer-ports-blocked", Severity.ERROR, True, "firewall blocks NCCL/Gloo's ephemeral ports from peers",
         "Allow TCP from {cidr} to the ephemeral range {range} (ddpfix remediate trusts {cidr} on this node)."),
    Rule("firewall.world-open", Severity.WARNING, False, "training ports open to the whole internet",
         "Replace the rule with one limited to source {cidr}; ddpfix adds the CIDR-limited rule but never removes yours."),
    Rule("probe.master-port-unreachable", Severity.ERROR, True, "TCP to MASTER_ADDR:MASTER_PORT fails from this node",
         "Fix the firewall/route on the path to the master; re-run audit to confirm the connect succeeds."),
    Rule("probe.peer-unreachable", Severity.ERROR, True, "TCP from this node to a peer's port fails",
         "Open the peer's ephemeral range to {cidr} and check the route between the two nodes."),
    Rule("probe.port-in-use", Severity.ERROR, False, "something already listens on MASTER_PORT on the master",
         "Stop the process holding port {port} on the master, or choose another ddp_master_port outside the ephemeral range."),
    Rule("hosts.hostname-loopback", Severity.ERROR, True, "the node's hostname resolves to loopback (Gloo advertises 127.x)",
         "Map the hostname to its cluster address in /etc/hosts and take it off the loopback line (ddpfix remediate)."),
    Rule("hosts.peer-unresolvable", Severity.ERROR, True, "a peer's hostname does not resolve here",
         "Add the managed /etc/hosts block mapping every node to its cluster address (ddpfix remediate)."),
    Rule("hosts.peer-mismatch", Severity.ERROR, True, "a peer's hostname resolves to the wrong address here",
         "Use the same managed /etc/hosts block on every node (ddpfix remediate); remove stale entries."),
    Rule("hosts.duplicate-hostname", Severity.ERROR, False, "two nodes share a hostname (cloned VMs)",
         "Give {nodes} each a unique hostname (hostnamectl set-hostname <new-name> on each) and a fresh /etc/machine-id; not changed automatically."),
    Rule("hosts.duplicate-machine-id", Severity.WARNING, False, "two nodes share /etc/machine-id (cloned VMs)",
         "Regenerate it on the clone: rm /etc/machine-id && systemd-machine-id-setup; not changed automatically."),
    Rule("time.no-daemon", Severity.WARNING, True, "no time-sync daemon running",
         "Install and run chrony with common servers (ddp_ntp_servers) or the master as local source (ddp_ntp_local_master)."),
    Rule("time.unsynchronized", Severity.WARNING, True, "the time daemon is not synchronised",
         "Give chrony reachable sources (ddp_ntp_servers or ddp_ntp_local_master) with iburst and makestep; ddpfix remediate configures it."),
    Rule("time.skew", Severity.WARNING, False, "clocks differ between nodes",
         "Synchronise every node to the same sources (chrony); elastic rendezvous heartbeats compare wall clocks."),
    Rule("netif.missing", Severity.ERROR, True, "the configured socket interface is missing or not on the cluster network",
         "Set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME per node to the node's own cluster interface (ddpfix env --apply)."),
    Rule("netif.name-mismatch", Severity.WARNING, True, "the cluster NIC has different names on different nodes",
         "Write per-node interface names (ddpfix env files) instead of one cluster-wide name; optionally pin names (--pin-ifnames)."),
    Rule("netif.autoselect-wrong", Severity.WARNING, True, "with no IFNAME set, NCCL/Gloo would pick a non-cluster interface",
         "Set NCCL_SOCKET_IFNAME=={ifname} and GLOO_SOCKET_IFNAME={ifname} on this node (ddpfix env --apply writes them)."),
    Rule("netif.mtu-mismatch", Severity.WARNING, False, "cluster interfaces' MTUs differ",
         "Set the same MTU on every node's cluster interface (and the switch); not changed automatically."),
    Rule("netif.down", Severity.ERROR, False, "the cluster interface is down",
         "Bring the interface up (ip link set {ifname} up) and fix its configuration; not changed automatically."),
    Rule("addr.master-not-private", Severity.ERROR, True, "MASTER_ADDR is not the master's cluster address",
         "Use the master's private address in {cidr} as MASTER_ADDR (ddpfix env --apply writes it)."),
    Rule("addr.family-mismatch", Severity.WARNING, True, "names resolve to IPv6 on some nodes and IPv4 on others",
         "Use IPv4 literals for MASTER_ADDR and IPv4 /etc/hosts entries (ddpfix remediate); or NCCL_SOCKET_FAMILY=AF_INET."),
    Rule("route.via-gateway", Severity.WARNING, False, "traffic to a peer leaves through a gateway",
         "Make the peer on-link on the cluster interface (fix the netmask or remove the host route); not changed automatically."),
    Rule("net.master-port-ephemeral", Severity.WARNING, False, "MASTER_PORT lies inside the ephemeral port range",
         "Choose a ddp_master_port outside net.ipv4.ip_local_port_range, or an outgoing socket may take it (errno 98)."),
    Rule("net.somaxconn-low", Severity.WARNING, False, "listen backlog smaller than the world size",
         "Raise net.core.somaxconn above the world size on the master (sysctl -w net.core.somaxconn={want} and persist it in /etc/sysctl.d/)."),
    Rule("fabric.port-down", Severity.ERROR, False, "an RDMA port is not ACTIVE where the other nodes' is (or NCCL_IB_HCA names it)",
         "Check {port}'s cable, transceiver and switch port (phys_state {phys}; ibstat {dev}, ibstatus) and the subnet manager; "
         "or leave the port out of NCCL_IB_HCA. Not changed automatically."),
    Rule("fabric.rate-mismatch", Severity.WARNING, False, "an RDMA port runs slower than the same port on other nodes",
         "Find why {port} negotiated down (cable, transceiver, switch port speed; ibstat, mlxlink) to {want}; the slowest rail "
         "sets the whole ring's speed. Not changed automatically."),
    Rule("fabric.link-layer-mixed", Severity.ERROR, False, "data rails are InfiniBand on some nodes and Ethernet (RoCE) on others",
         "Put every node's data rails on the same fabric (set the ConnectX port type with mlxconfig LINK_TYPE_P1, then reboot), "
         "or restrict NCCL_IB_HCA to the HCAs every node shares. Not changed automatically."),
    Rule("fabric.roce-no-v2-gid", Severity.ERROR, False, "a RoCE port has no RoCE v2 GID with an IPv4 address",
         "Give {ndev} its IPv4 address (the GID table is filled from the netdev's addresses) and RoCE v2 as default "
         "(cma_roce_mode -d {dev} -p 1 -m 2); check with show_gids / ibv_devinfo -v. Not changed automatically."),
    Rule("fabric.gid-index-differs", Severity.WARNING, False, "the RoCE v2 IPv4 GID index differs between nodes",
         "Use NCCL >= 2.21 (selects the RoCE v2 GID by itself) and leave NCCL_IB_GID_INDEX unset; with an older NCCL set it "
         "per node (host var ddp_nccl_ib_gid_index: {indexes}) and run ddpfix env --apply. Not changed automatically."),
    Rule("fabric.pkey-mismatch", Severity.ERROR, False, "InfiniBand ports sit in different partitions (P_Key) on different nodes",
         "Put every node's ports in the same partition in the subnet manager's partitions.conf (OpenSM) / UFM, or pick the "
         "common one with NCCL_IB_PKEY. Not changed automatically."),
    Rule("fabric.hca-includes-mgmt", Severity.WARNING, True, "NCCL_IB_HCA includes the management NIC or a far slower HCA",
         "Restrict NCCL_IB_HCA to the data rails, NCCL_IB_HCA={rails} (ddp_nccl_ib_hca; ddpfix env --apply derives it)."),
    Rule("fabric.memlock-low", Severity.ERROR, True, "the locked-memory limit is below what RDMA needs (unlimited, or ddp_memlock)",
         "Raise memlock to {value} for the launch path: ddpfix remediate --apply writes /etc/security/limits.d/90-ddpfix-memlock.conf "
         "(memlock {value} for * and root) for new PAM logins; for a systemd launcher list it in ddp_launcher_units "
         "(LimitMEMLOCK drop-in)."),
    Rule("fabric.no-uverbs", Severity.ERROR, False, "RDMA devices but no /dev/infiniband/uverbs* (user verbs unusable)",
         "Load the user-verbs module: modprobe ib_uverbs (persist it in /etc/modules-load.d/ib_uverbs.conf; rdma-core's "
         "rdma-load-modules@ service does this). Not changed automatically."),
    Rule("fabric.peermem-missing", Severity.WARNING, False, "GPUs and RDMA but neither nvidia_peermem nor gdrdrv is loaded",
         "Load GPUDirect RDMA: modprobe nvidia_peermem (persist it in /etc/modules-load.d/nvidia-peermem.conf). Not changed automatically."),
    Rule("fabric.efa-provider-missing", Severity.ERROR, False, "EFA devices but libfabric has no efa provider (NCCL falls back to sockets)",
         "Install or repair the AWS EFA installer's libfabric (fi_info -p efa must list provider: efa) and aws-ofi-nccl. "
         "Not changed automatically."),
    Rule("fabric.nccl-version-mismatch", Severity.WARNING, False, "torch's NCCL version differs between nodes",
         "Install the same torch (and NCCL) build on every node, for example the one with NCCL {version}. Not changed automatically."),
    Rule("env.missing", Severity.INFO, True, "no ddpfix env file yet",
         "Write it: ddpfix env -i INVENTORY --apply (or ddpfix remediate --apply)."),
    Rule("env.inconsistent", Severity.ERROR, True, "env files disagree between nodes or with the plan",
         "Rewrite them: ddpfix env -i INVENTORY --apply."),
]

RULES: dict[str, Rule] = {r.id: r for r in _RULES}


@dataclass(frozen=True)
class Finding:
    id: str
    host: str | None  # None: the whole cluster
    message: str
    evidence: str
    fix_vars: tuple[tuple[str, str], ...] = ()
    caused_by: str | None = None  # key of the finding that explains this one (see ddpfix.causes)

    @property
    def key(self) -> str:
        """`id@host` (`id@cluster` for cluster-wide findings): how causes refer to each other."""
        return f"{self.id}@{self.host or 'cluster'}"

    def var(self, name: str) -> str | None:
        return dict(self.fix_vars).get(name)

    @property
    def rule(self) -> Rule:
        return RULES[self.id]

    @property
    def severity(self) -> Severity:
        return self.rule.severity

    @property
    def fix(self) -> str:
        values = dict(self.fix_vars)
        try:
            return self.rule.fix.format(**values)
        except KeyError:
            return self.rule.fix

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.label,
            "host": self.host,
            "message": self.message,
            "evidence": self.evidence,
            "fixable": self.rule.fixable,
            "fix": self.fix,
            "caused_by": self.caused_by,
        }


def finding(id: str, host: str | None, message: str, evidence: str, **fix_vars: object) -> Finding:
    if id not in RULES:
        raise KeyError(f"unknown finding id {id}")
    return Finding(id, host, message, evidence, tuple(sorted((k, str(v)) for k, v in fix_vars.items())))


def sort_key(f: Finding) -> tuple[int, str, str, str]:
    return (-int(f.severity), f.host or "", f.id, f.message)


