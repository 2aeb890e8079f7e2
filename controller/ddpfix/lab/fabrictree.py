"""Synthetic RDMA sysfs / /dev trees in the kernel's layout (Documentation/ABI/stable/sysfs-class-infiniband).

The lab writes one per node (it cannot mount over a node's real /sys, see README "GPU fabric") and points the facts
module's `sysfs_root` / `dev_root` at it; tests/unit/fixtures/sysfs/ holds trees written by the same function.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

STATES = {"ACTIVE": "4: ACTIVE", "DOWN": "1: DOWN", "INIT": "2: INIT"}
PHYS = {"ACTIVE": "5: LinkUp", "DOWN": "3: Disabled", "INIT": "5: LinkUp"}


@dataclass
class Gid:
    index: int
    gid: str
    type: str = "RoCE v2"
    ndev: str | None = None


@dataclass
class Port:
    state: str = "ACTIVE"
    rate: str = "200 Gb/sec (4X HDR)"
    link_layer: str = "InfiniBand"
    pkey0: str = "0xffff"
    gids: list[Gid] = field(default_factory=list)
    gid_table_len: int = 8


@dataclass
class Device:
    name: str
    ports: list[Port]
    driver: str = "mlx5_core"
    netdevs: list[str] = field(default_factory=list)
    numa_node: int = 0


def ipv4_gid(addr: str) -> str:
    a, b, c, d = (int(x) for x in addr.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a * 256 + b:04x}:{c * 256 + d:04x}"


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_tree(root: Path, devices: list[Device], *, uverbs: bool = True, modules: tuple[str, ...] = (),
               dev_root: Path | None = None) -> None:
    """Write <root>/class/infiniband/... for `devices`, <root>/module/<m> for `modules`, and <dev_root>/infiniband."""
    ib = root / "class" / "infiniband"
    ib.mkdir(parents=True, exist_ok=True)
    _w(root / "class" / "infiniband_mad" / "abi_version", "5")
    drivers = root / "bus" / "pci" / "drivers"
    for i, d in enumerate(devices):
        pci = root / "devices" / "pci0000:00" / f"0000:{0x17 + i:02x}:00.0"
        for nd in d.netdevs:  # every directory holds a file, as in sysfs (and so git keeps the recorded trees)
            _w(pci / "net" / nd / "operstate", "up")
        _w(pci / "numa_node", str(d.numa_node))
        _w(drivers / d.driver / "uevent", f"DRIVER={d.driver}")
        link = pci / "driver"
        if not link.is_symlink():
            os.symlink(os.path.relpath(drivers / d.driver, pci), link)
        ddir = ib / d.name
        ddir.mkdir(parents=True, exist_ok=True)
        if not (ddir / "device").is_symlink():
            os.symlink(os.path.relpath(pci, ddir), ddir / "device")
        _w(ddir / "node_type", "1: CA")
        for pn, p in enumerate(d.ports, start=1):
            pdir = ddir / "ports" / str(pn)
            _w(pdir / "state", STATES.get(p.state, p.state))
            _w(pdir / "phys_state", PHYS.get(p.state, "3: Disabled"))
            _w(pdir / "rate", p.rate)
            _w(pdir / "link_layer", p.link_layer)
            _w(pdir / "pkeys" / "0", p.pkey0)
            by_index = {g.index: g for g in p.gids}
            for n in range(max([p.gid_table_len] + [g.index + 1 for g in p.gids])):
                g = by_index.get(n)
                _w(pdir / "gids" / str(n), g.gid if g else "0000:0000:0000:0000:0000:0000:0000:0000")
                if g:  # the kernel answers EINVAL for the attributes of an empty GID entry; written only when set
                    _w(pdir / "gid_attrs" / "types" / str(n), g.type)
                    if g.ndev:
                        _w(pdir / "gid_attrs" / "ndevs" / str(n), g.ndev)
    for m in modules:
        _w(root / "module" / m / "initstate", "live")
    if dev_root is not None:
        ibdev = dev_root / "infiniband"
        ibdev.mkdir(parents=True, exist_ok=True)
        if uverbs:
            for i in range(len(devices)):
                (ibdev / f"uverbs{i}").touch()
                (ibdev / f"umad{i}").touch()
        (ibdev / "rdma_cm").touch()


def roce_port(addr: str, ndev: str, *, v2_index: int = 3, state: str = "ACTIVE", rate: str = "100 Gb/sec (4X EDR)",
              with_v2: bool = True) -> Port:
    """A RoCE port as mlx5 fills its GID table: link-local v1/v2 at 0/1, the IPv4 address as v1 and v2 after."""
    ll = "fe80:0000:0000:0000:0a5e:45ff:fe00:" + f"{sum(int(x) for x in addr.split('.')):04x}"
    gids = [
        Gid(0, ll, "IB/RoCE v1", ndev),
        Gid(1, ll, "RoCE v2", ndev),
        Gid(v2_index - 1, ipv4_gid(addr), "IB/RoCE v1", ndev),
    ]
    if with_v2:
        gids.append(Gid(v2_index, ipv4_gid(addr), "RoCE v2", ndev))
    return Port(state=state, rate=rate, link_layer="Ethernet", gids=gids)


def ib_port(guid_tail: str, *, state: str = "ACTIVE", rate: str = "200 Gb/sec (4X HDR)", pkey0: str = "0xffff") -> Port:
    return Port(
        state=state,
        rate=rate,
        link_layer="InfiniBand",
        pkey0=pkey0,
        gids=[Gid(0, "fe80:0000:0000:0000:" + guid_tail, "IB/RoCE v1", None)],
    )
