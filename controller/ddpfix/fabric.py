"""GPU fabric (InfiniBand, RoCE, EFA): views over the nodes' `fabric` facts and the data-rail choice (the rules are
``ddpfix.rules.fabric``).

Pure functions. The per-node facts come from the facts role's ddpfix_fabric reader; the comparisons between nodes
(rates, link layers, GID indexes, P_Keys, NCCL versions) are the point, a single node only sees itself. The plan
(ddpfix.plan) derives NCCL_IB_HCA / NCCL_IB_GID_INDEX from `data_rails` and `roce_v2_index` here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

#: NCCL picks the RoCE v2 GID by itself from this version on (NCCL_IB_GID_INDEX defaults to -1, "auto").
NCCL_AUTO_GID = (2, 21)
#: NCCL_IB_GID_INDEX's default before that.
NCCL_OLD_DEFAULT_GID = 0
#: A port this many times slower than the node's fastest data port is not a data rail.
SLOW_FACTOR = 4.0
MEMLOCK_UNLIMITED = -1

Port = dict[str, Any]
Dev = dict[str, Any]


def fabric(f: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict((f or {}).get("fabric") or {})


def devices(f: Mapping[str, Any] | None) -> list[Dev]:
    return list(fabric(f).get("devices") or [])


def has_rdma(f: Mapping[str, Any] | None) -> bool:
    return bool(devices(f))


def is_efa(d: Mapping[str, Any]) -> bool:
    return d.get("driver") == "efa"


def ports(f: Mapping[str, Any] | None) -> Iterable[tuple[Dev, Port]]:
    for d in devices(f):
        for p in d.get("ports") or []:
            yield d, p


def pname(d: Mapping[str, Any], p: Mapping[str, Any]) -> str:
    return f"{d.get('name')}/{p.get('port')}"


def active(p: Mapping[str, Any]) -> bool:
    return p.get("state") == "ACTIVE"


def ssh_ifaces(f: Mapping[str, Any], address: str | None) -> set[str]:
    """Interfaces holding the node's SSH (inventory) address: the management network."""
    out = set()
    for i in f.get("interfaces") or []:
        if any(a.get("local") == address for a in i.get("addrs") or []):
            out.add(str(i.get("name")))
    return out


def mgmt_reason(f: Mapping[str, Any], address: str | None, d: Mapping[str, Any]) -> str | None:
    """Why device `d` is not a data rail on this node (its netdev is the SSH interface, or it is far slower)."""
    mgmt = ssh_ifaces(f, address) & set(d.get("netdevs") or [])
    if mgmt:
        return f"netdev {', '.join(sorted(mgmt))} holds the SSH address {address}"
    rates = [p.get("rate_gbps") or 0 for _, p in ports(f) if active(p)]
    mine = max([p.get("rate_gbps") or 0 for p in d.get("ports") or [] if active(p)] or [0])
    if rates and mine and mine * SLOW_FACTOR <= max(rates):
        return f"{mine:g} Gb/s against {max(rates):g} Gb/s on the data rails"
    return None


def data_rails(f: Mapping[str, Any] | None, address: str | None) -> list[tuple[Dev, Port]]:
    """The active, non-management, non-EFA ports that NCCL's IB transport should use, in device order."""
    if not f:
        return []
    return [(d, p) for d, p in ports(f) if active(p) and not is_efa(d) and mgmt_reason(f, address, d) is None]


def v2_ipv4_gid(p: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((g for g in p.get("gids") or [] if g.get("type") == "RoCE v2" and g.get("ipv4")), None)


def roce_v2_index(f: Mapping[str, Any] | None, address: str | None) -> int | None:
    """The RoCE v2 IPv4 GID index of the node's first RoCE data rail (None: no RoCE rail or no such GID)."""
    for _, p in data_rails(f, address):
        if p.get("link_layer") == "Ethernet":
            g = v2_ipv4_gid(p)
            return int(g["index"]) if g else None
    return None


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    if not v or not re.match(r"^\d+(\.\d+)*$", v):
        return None
    return tuple(int(x) for x in v.split("."))


def parse_ib_hca(spec: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL_IB_HCA: (exclude `^`, exact `=`, [(prefix, port)])."""
    s = spec.strip()
    exclude = s.startswith("^")
    s = s.lstrip("^")
    exact = s.startswith("=")
    s = s.lstrip("=")
    items = []
    for part in filter(None, (x.strip() for x in s.split(","))):
        name, _, port = part.partition(":")
        items.append((name, int(port) if port.isdigit() else None))
    return exclude, exact, items


def hca_selects(spec: str, dev: str, port: int | None) -> bool:
    exclude, exact, items = parse_ib_hca(spec)
    hit = any((dev == n if exact else dev.startswith(n)) and (pt is None or pt == port) for n, pt in items)
    return hit != exclude
