"""From a row's bucket of checks to the one or two that look at this log's cause: what the evidence line's errno
says (refused, timed out, no route, unreachable), whether the connect was to the store or to a peer, the
interface NCCL chose (a bridge, loopback or link-local address), an InfiniBand completion status. The row's whole
list stays (`finding_ids`); `checks` is where to look first, `why` the reason read from the log."""

from __future__ import annotations

import ipaddress
import re

from ddpfix.diagnose.events import ERRNO_MEANING, errno_of
from ddpfix.diagnose.hosts import HostFacts
from ddpfix.diagnose.model import Diagnosis
from ddpfix.rules import fabric as fabric_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import host as host_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import netif as netif_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import reachability as reachability_rules

_STORE_KEYS = frozenset({"master-unreachable", "store-clients-missing", "rendezvous-timeout"})
_PEER_KEYS = frozenset({"nccl-socket-connect", "gloo-peer-connect", "collective-timeout-first"})
_TO_STORE = re.compile(r"TCPStore|[Ss]tore|MASTER_ADDR|MASTER_PORT|c10d|socket\.cpp|[Rr]endezvous")
_ABORT = re.compile(r"Software caused connection abort|Connect timeout|timed out connecting")

_MASTER = {
    111: (probes_rules.MASTER_PORT_UNREACHABLE.id, firewall_rules.MASTER_PORT_BLOCKED.id),
    110: (firewall_rules.MASTER_PORT_BLOCKED.id, net_rules.MASTER_NOT_PRIVATE.id),
    113: (firewall_rules.MASTER_PORT_BLOCKED.id,),
    101: (net_rules.VIA_GATEWAY.id, reachability_rules.UNREACHABLE.id),
    1: (firewall_rules.MASTER_PORT_BLOCKED.id,),
    13: (firewall_rules.MASTER_PORT_BLOCKED.id,),
}
_PEER = {
    111: (firewall_rules.PEER_PORTS_BLOCKED.id, probes_rules.PEER_UNREACHABLE.id),
    110: (firewall_rules.PEER_PORTS_BLOCKED.id, netif_rules.AUTOSELECT_WRONG.id),
    113: (firewall_rules.PEER_PORTS_BLOCKED.id,),
    101: (net_rules.VIA_GATEWAY.id, probes_rules.PEER_UNREACHABLE.id),
}
_IB = (
    (re.compile(r"status=12\b|error 12\b|[Rr]etry exceeded|RETRY_EXC"),
     (fabric_rules.GID_INDEX_DIFFERS.id, fabric_rules.ROCE_NO_V2_GID.id),
     "completion status 12 (transport retry exceeded): the peers' RoCE GIDs do not match"),
    (re.compile(r"Cannot allocate memory|memlock|register memory"), (fabric_rules.MEMLOCK_LOW.id,),
     "ibverbs could not pin memory: the memlock limit"),
    (re.compile(r"[Pp]_?[Kk]ey"), (fabric_rules.PKEY_MISMATCH.id,), "a partition key (P_Key) problem"),
    (re.compile(r"port .{0,40}(?:down|DOWN|not active)|PORT_DOWN"), (fabric_rules.PORT_DOWN.id,), "an IB port is down"),
)


def _errno_reason(errno: int) -> str:
    return f"errno {errno}: {ERRNO_MEANING[errno]}"


def narrow(d: Diagnosis, facts: HostFacts) -> tuple[tuple[str, ...], str]:
    """The one or two checks that look at this diagnosis's cause, and why (from the log); the row's first two
    checks when the log says nothing more precise."""
    key, line = d.pattern.key, d.line
    errno = errno_of(line)
    if errno is None and _ABORT.search(line):
        errno = 110
    odd = facts.odd_interfaces()
    to_store = key in _STORE_KEYS or (key == "connect-failed" and bool(_TO_STORE.search(line)))
    if to_store:
        public = [s for s in facts.stores if _public(s)]
        if public:
            return (net_rules.MASTER_NOT_PRIVATE.id, firewall_rules.MASTER_PORT_BLOCKED.id), (
                f"the store is dialled at a public address ({public[0]})")
        if errno in _MASTER:
            return _MASTER[errno], f"the connect to the store failed with {_errno_reason(errno)}"
    elif key in _PEER_KEYS or key == "connect-failed":
        if odd:
            i = odd[0]
            return (netif_rules.AUTOSELECT_WRONG.id, netif_rules.CANNOT_REACH_PEERS.id), (
                f"{i.who} chose {i.name} {i.address} ({i.kind}): no peer on another node reaches it")
        if errno in _PEER:
            return _PEER[errno], f"a peer-to-peer connect (not the store) failed with {_errno_reason(errno)}"
    elif key == "nccl-ib":
        for rx, ids, why in _IB:
            if rx.search(line):
                return ids, why
    elif key == "nccl-system-error" and odd:
        i = odd[0]
        return (netif_rules.AUTOSELECT_WRONG.id, netif_rules.MISSING.id), f"{i.who} chose {i.name} ({i.kind})"
    elif key == "open-files-exhausted":
        return (host_rules.NOFILE_LOW.id,), "errno 24: too many open files"
    return d.pattern.finding_ids[:2], ""


def _public(hostport: str) -> bool:
    host = hostport.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_global
    except ValueError:
        return False
