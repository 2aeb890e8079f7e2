"""Jinja filter: what one node probes, from every node's ddpfix facts (k*N connections, not N^2)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import re

_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def _name_ok(n):
    """An RFC 1123 host name: only such names of a peer are resolved (a hostile hostname is no probe target)."""
    if not isinstance(n, str) or not n or len(n) > 253:
        return False
    labels = n.split(".")
    return all(_LABEL.match(lbl) for lbl in labels) and not all(lbl.isdigit() for lbl in labels)


def _addr_ok(a):
    try:
        ipaddress.ip_address(str(a))
        return isinstance(a, str)
    except ValueError:
        return False


def _facts(hostvars, host):
    try:
        return hostvars[host]["ansible_facts"]["ddpfix_node"]
    except (KeyError, TypeError):
        return None


def ddpfix_probe_args(hostvars, me, order, master, master_port, peers, live=None):
    """Module arguments for ddpfix_probe on host `me`.

    - resolve every other node's hostname (and fqdn), route to every other node's cluster address;
    - connect to the master port on the master's cluster address, and to the probe listeners of the
      next `peers` nodes of the ring (in `order`, skipping nodes without facts), so each node is dialled
      by `peers` others and the cost is (1 + peers) * N connections.

    `live`: the nodes whose listeners run now (this run's play hosts). Only they are dialled: facts a fact cache
    holds from an earlier run (another slice) still name peers to resolve and route to, but their listeners are
    gone, and a connect to them would report a block that is not there. None: every node with facts.
    """
    mine = _facts(hostvars, me) or {}
    alive = [h for h in order if _facts(hostvars, h) is not None]
    if live is not None:
        live = set(live)
        if master not in live:
            master = None
    names, route_to, connect = [], [], []
    for h in alive:
        if h == me:
            continue
        f = _facts(hostvars, h)
        for n in (f.get("hostname"), f.get("fqdn")):
            if n and _name_ok(n) and n not in names:
                names.append(n)
        addr = (f.get("cluster") or {}).get("address")
        if addr and _addr_ok(addr) and addr not in route_to:
            route_to.append(addr)
    mf = _facts(hostvars, master) if master is not None else None
    if mf:
        maddr = (mf.get("cluster") or {}).get("address")
        if maddr and _addr_ok(maddr):
            connect.append({"name": master, "address": maddr, "port": int(master_port), "kind": "master"})
    ring = [h for h in alive if live is None or h in live]
    if me in ring and len(ring) > 1:
        i = ring.index(me)
        for step in range(1, min(int(peers), len(ring) - 1) + 1):
            h = ring[(i + step) % len(ring)]
            f = _facts(hostvars, h)
            probe = f.get("probe") or {}
            port = probe.get("port")
            if probe.get("address") and _addr_ok(probe["address"]) and isinstance(port, int) and 0 < port < 65536:
                connect.append({"name": h, "address": probe["address"], "port": int(probe["port"]), "kind": "peer"})
    cluster = mine.get("cluster") or {}
    return {
        "bind_address": cluster.get("address") or "",
        "bind_ifname": cluster.get("ifname") or "",
        "names": names,
        "route_to": route_to,
        "connect": connect,
    }


class FilterModule:
    def filters(self):
        return {"ddpfix_probe_args": ddpfix_probe_args}
