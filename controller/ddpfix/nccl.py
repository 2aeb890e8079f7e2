"""`verify --backend nccl`: bus bandwidth as nccl-tests defines it, and what NCCL_DEBUG=INFO says it chose.

Pure functions over the benchmark's result lines and NCCL's log text (unit-tested on recorded lines in NCCL's
format, tests/unit/test_nccl.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The all-reduce sweep's default message sizes in bytes: 8 MiB .. 1 GiB, doubling.
DEFAULT_SIZES = tuple(8 * 2**20 * 2**i for i in range(8))
RESULT_PREFIX = "DDPFIX_NCCL_RESULT "

# `host:pid:tid [dev] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>`
_NET_USING = re.compile(r"NCCL INFO NET/(IB|Socket|OFI|IBext[^ ]*) : Using (.*?)(?:\s*;\s*OOB (\S+))?\s*$")
_USING_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_VIA = re.compile(r"NCCL INFO Channel \d+/\d+ : .* via "
                  r"(NET/[A-Za-z]+\w*|P2P/\w+|SHM|P2P|COLLNET/\w+)(?:/\d+)?(/GDRDMA)?")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\w+)")
_NO_DEVICE = re.compile(r"NET/IB ?: No device found")
_WARN = re.compile(r"NCCL WARN (.+?)\s*$")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")


def busbw(algbw: float, nranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n (NVIDIA/nccl-tests, doc/PERFORMANCE.md); 0 ranks -> 0."""
    if nranks <= 0:
        return 0.0
    return algbw * 2.0 * (nranks - 1) / nranks


def algbw(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes/s, as nccl-tests prints)."""
    return size_bytes / seconds / 1e9 if seconds > 0 else 0.0


def parse_sizes(text: str) -> tuple[int, ...]:
    """`8M,64M,1G` (K/M/G binary units, or bytes) -> sizes in bytes; ValueError names the bad item."""
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    out = []
    for item in (x.strip() for x in text.split(",")):
        m = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", item, re.I)
        if not m or int(m.group(1)) == 0:
            raise ValueError(f"not a size: {item!r} (use e.g. 8M,64M,1G)")
        out.append(int(m.group(1)) * units[m.group(2).upper()])
    return tuple(sorted(set(out)))


@dataclass
class Transport:
    """What NCCL reported choosing, from NCCL_DEBUG=INFO output."""

    network: str | None = None  # "IB", "Socket", "AWS Libfabric", ... (`Using network X`)
    net_devices: list[str] = field(default_factory=list)  # `[0]mlx5_0:1/IB` entries, or socket interfaces
    via: list[str] = field(default_factory=list)  # distinct `via NET/IB`, `via P2P/IPC`, `via SHM`, ...
    gdrdma: bool = False
    ofi_provider: str | None = None
    no_ib_device: bool = False
    version: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """IB / RoCE / EFA / Socket / intra-node (no network used) / unknown."""
        net = (self.network or "").lower()
        inter = [v for v in self.via if v.startswith("NET/")]
        ofi = any(v.startswith("NET/OFI") or "Libfabric" in v for v in inter)
        if self.ofi_provider == "efa" or "libfabric" in net or ofi:
            return "EFA" if self.ofi_provider in (None, "efa") else f"OFI/{self.ofi_provider}"
        if net == "socket" or any(v.startswith("NET/Socket") for v in inter):
            return "Socket"
        if net.startswith("ib") or any(v.startswith("NET/IB") for v in inter):
            return "RoCE" if self.net_devices and all(d.endswith("/RoCE") for d in self.net_devices) else "IB"
        if self.via and not inter:
            return "intra-node"
        return "unknown"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "network": self.network, "net_devices": self.net_devices, "via": self.via,
                "gdrdma": self.gdrdma, "ofi_provider": self.ofi_provider, "version": self.version,
                "warnings": self.warnings[:5]}


def parse_transport(log: str) -> Transport:
    t = Transport()
    net_using: dict[str, list[str]] = {}
    for line in log.splitlines():
        if m := _USING_NETWORK.search(line):
            t.network = m.group(1)
        elif m := _NET_USING.search(line):
            net_using[m.group(1)] = re.findall(r"\[\d+\](\S+)", m.group(2))
        elif m := _VIA.search(line):
            v = m.group(1)
            if v not in t.via:
                t.via.append(v)
            t.gdrdma = t.gdrdma or bool(m.group(2))
        elif m := _OFI_PROVIDER.search(line):
            t.ofi_provider = m.group(1)
        elif _NO_DEVICE.search(line):
            t.no_ib_device = True
        elif (m := _WARN.search(line)) and m.group(1) not in t.warnings:
            t.warnings.append(m.group(1))
        if m := _VERSION.search(line):
            t.version = m.group(1)
    net = (t.network or "").lower()
    key = "Socket" if net == "socket" else next((k for k in net_using if k.lower().startswith("ib")), None) \
        if net.startswith("ib") else None
    t.net_devices = net_using.get(key or "", []) if key else []
    return t


def fallback_error(t: Transport, rdma_present: bool) -> str | None:
    """A silent fallback to sockets where RDMA devices exist is a failure: the job runs, at a fraction of the speed."""
    if not rdma_present or t.kind != "Socket":
        return None
    why = "NET/IB found no usable device" if t.no_ib_device else "NCCL did not pick an RDMA transport"
    return (f"NCCL fell back to sockets (Using network {t.network or 'Socket'}) although RDMA devices exist: {why}; "
            "see the fabric.* findings (port-down, no-uverbs, memlock-low, efa-provider-missing) and NCCL_IB_HCA")


def parse_results(stdout: str) -> list[dict[str, Any]]:
    """The benchmark's `DDPFIX_NCCL_RESULT {json}` lines (one per node, from local rank 0)."""
    out = []
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            try:
                out.append(json.loads(line[len(RESULT_PREFIX):]))
            except ValueError:
                continue
    return out


def below_threshold(sweep: Iterable[Mapping[str, Any]], min_busbw: float | None) -> list[Mapping[str, Any]]:
    """The sweep points whose bus bandwidth is under `min_busbw` GB/s (only the largest size counts when several:
    small messages are latency-bound, so the threshold applies to the largest size measured)."""
    pts = sorted(sweep, key=lambda r: int(r.get("size", 0)))
    if min_busbw is None or not pts:
        return []
    top = pts[-1]
    return [top] if float(top.get("busbw", 0.0)) < min_busbw else []


def ring_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """(a, b) for every neighbour on the ring of nodes: n pairs for n > 2, one for 2, none for 1."""
    n = len(names)
    if n < 2:
        return []
    if n == 2:
        return [(names[0], names[1])]
    return [(names[i], names[(i + 1) % n]) for i in range(n)]


def format_size(n: int) -> str:
    for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)
