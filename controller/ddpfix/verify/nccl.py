"""`verify --backend nccl`: bus bandwidth as nccl-tests defines it, and what NCCL_DEBUG=INFO says it chose; the
sweep on the nodes (`run_nccl`) and each node's verdict (`nccl_entry`).

Pure functions over the benchmark's result lines and NCCL's log text (unit-tested on recorded lines in NCCL's
format, tests/unit/verify/test_nccl.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpfix.ansible.run import run_playbook
from ddpfix.diagnose.match import cause_line
from ddpfix.fabric import has_rdma
from ddpfix.model.finding import Finding
from ddpfix.progress import Progress
from ddpfix.rules.context import Context
from ddpfix.verify.output import NCCL_FIELDS, capped_output, result_lines
from ddpfix.verify.torch import error_line, torchrun_result

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


# ---------------------------------------------------------------- the sweep on the nodes

NO_GPU = re.compile(r"Cuda is not available|torch\.cuda\.is_available\(\) is False|no GPU for NCCL", re.I)


def _nccl_cause(text: str, finding_ids: Iterable[str]) -> str:
    return cause_line(text, finding_ids)


def nccl_entry(
    host: str, res: dict[str, Any], rdma_present: bool, min_busbw: float | None, finding_ids: Iterable[str] = ()
) -> dict[str, Any]:
    """One node's (or pair's) verdict from the torchrun task result: sweep with algbw/busbw, transport, failures."""
    stdout, stderr, cuts = capped_output(res)
    text = stdout + "\n" + stderr
    transport = parse_transport(text)
    results, bad = result_lines(stdout, RESULT_PREFIX, NCCL_FIELDS)
    entry: dict[str, Any] = {"host": host, "rc": res.get("rc"), "transport": transport.to_json(), "sweep": []}
    if cuts:
        entry["output_cut"] = cuts
    if NO_GPU.search(text):
        entry.update(
            ok=False,
            skipped=True,
            error=f"no GPU on {host}: torch.cuda.is_available() is False",
            cause="verify --backend nccl needs a CUDA GPU and torch with CUDA on every node",
        )
        return entry
    r = results[0] if results else None
    if r:
        world = int(r.get("world_size") or 0)
        entry["world_size"] = world
        entry["gpus"] = r.get("gpus")
        entry["nccl"] = r.get("nccl")
        for pt in r.get("sweep") or []:
            alg = algbw(int(pt["size"]), float(pt["seconds"]))
            entry["sweep"].append(
                {
                    "size": int(pt["size"]),
                    "time_us": round(float(pt["seconds"]) * 1e6, 1),
                    "algbw": round(alg, 3),
                    "busbw": round(busbw(alg, world), 3),
                }
            )
    problems = list(bad)
    if res.get("rc") != 0 or not r or not r.get("ok"):
        problems.append(error_line(text, res.get("rc")) if res.get("rc") != 0 or not r else "all-reduce result wrong")
    fb = fallback_error(transport, rdma_present)
    if fb:
        problems.append(fb)
    slow = below_threshold(entry["sweep"], min_busbw)
    if slow:
        problems.append(
            f"busbw {slow[0]['busbw']:g} GB/s at {format_size(slow[0]['size'])} is below --min-busbw {min_busbw:g}"
        )
    entry["ok"] = not problems
    if problems:
        entry["error"] = "; ".join(problems)
        entry["cause"] = (
            _nccl_cause(text, finding_ids)
            if (res.get("rc") != 0 or not r)
            else ("the transport or the links are slower than required: see transport and the fabric.* findings")
        )
    return entry


def run_nccl(
    ctx: Context,
    *,
    sizes: tuple[int, ...],
    iters: int,
    min_busbw: float | None,
    pairs: bool,
    limit: str | None,
    forks: int | None,
    verbosity: int,
    progress: Progress | None,
    findings: Iterable[Finding],
) -> dict[str, Any]:
    """The whole-gang sweep (and with `pairs`, one two-node sweep per ring neighbour pair)."""
    cluster = ctx.cluster
    ids: dict[str, set[str]] = {}
    for f in findings:
        ids.setdefault(f.host or "", set()).add(f.id)
    base = {
        "ddpfix_verify_backend": "nccl",
        "ddpfix_verify_sizes": list(sizes),
        "ddpfix_verify_iters": iters,
    }

    def one(extravars: dict[str, Any], hosts: list[str], name: str) -> dict[str, dict[str, Any]]:
        lim = ",".join(hosts)
        run = run_playbook(
            "verify_torch.yml",
            cluster.inventories,
            extravars={**base, **extravars},
            limit=lim if not limit else f"{limit}:&{lim}",
            forks=max(forks or 0, len(hosts)),
            n_hosts=len(hosts),
            verbosity=verbosity,
            on_event=progress.on_event if progress else None,
            name=name,
        )
        out = {}
        for h in hosts:
            hr = run.hosts.get(h)
            res = torchrun_result(hr)
            if hr is None or hr.unreachable or not res:
                out[h] = {
                    "host": h,
                    "ok": False,
                    "error": hr.message if hr else "did not run",
                    "cause": "node unreachable or the run failed before torchrun",
                    "sweep": [],
                }
                continue
            out[h] = nccl_entry(h, res, has_rdma(ctx.facts.get(h)), min_busbw, ids.get(h, set()) | ids.get("", set()))
        return out

    gang = one({}, cluster.names, "verify-nccl")
    doc: dict[str, Any] = {"gang": [gang[n] for n in cluster.names], "pairs": None}
    if pairs and not all(e.get("skipped") for e in gang.values()):
        doc["pairs"] = []
        for a, b in ring_pairs(cluster.names):
            master = ctx.plan[a].address or cluster.node(a).address
            over = {
                a: {"NNODES": 2, "NODE_RANK": 0, "MASTER_ADDR": master},
                b: {"NNODES": 2, "NODE_RANK": 1, "MASTER_ADDR": master},
            }
            r = one({"ddpfix_verify_overrides": over}, [a, b], f"verify-nccl-{a}-{b}")
            ea = r[a]
            top = max(ea.get("sweep") or [{}], key=lambda p: p.get("size", 0))
            doc["pairs"].append(
                {
                    "pair": [a, b],
                    "ok": r[a]["ok"] and r[b]["ok"],
                    "busbw": top.get("busbw"),
                    "size": top.get("size"),
                    "transport": ea.get("transport", {}).get("kind"),
                    "error": "; ".join(f"{h}: {r[h]['error']}" for h in (a, b) if r[h].get("error")) or None,
                }
            )
    return doc


def nccl_skip_line(doc: dict[str, Any]) -> str | None:
    gang = doc.get("gang") or []
    if gang and all(e.get("skipped") for e in gang):
        return (
            f"verify --backend nccl: skipped, no GPU on {', '.join(e['host'] for e in gang)} "
            "(torch.cuda.is_available() is False); run it on GPU nodes with CUDA torch (ddp_python)"
        )
    return None
