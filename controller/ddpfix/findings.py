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


