"""GPU fabric rules (InfiniBand, RoCE, EFA): the comparisons between nodes (rates, link layers, GID indexes,
P_Keys, NCCL versions), the HCA choice, memlock and the RDMA host setup. The views over the facts are
``ddpfix.fabric``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddpfix.fabric import (
    MEMLOCK_UNLIMITED,
    active,
    data_rails,
    devices,
    fabric,
    has_rdma,
    hca_selects,
    is_efa,
    mgmt_reason,
    pname,
    ports,
    v2_ipv4_gid,
    version_tuple,
)
from ddpfix.model.finding import Finding, Remedy, Severity
from ddpfix.rules.context import SRC_ENV, SRC_FABRIC, SRC_IFACES, Context
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import ENV_FILE


def _human(n: int) -> str:
    if n < 0:
        return "unlimited"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def _sysfs(f: Mapping[str, Any], d: Mapping[str, Any], p: Mapping[str, Any], attr: str) -> str:
    return f"{fabric(f).get('sysfs_root') or '/sys'}/class/infiniband/{d.get('name')}/ports/{p.get('port')}/{attr}"


def _env_hca(ctx: Context, name: str, f: Mapping[str, Any]) -> tuple[str, str] | None:
    """(NCCL_IB_HCA value, where it is set) from the node's env file, else the inventory's ddp_nccl_ib_hca."""
    ef = f.get("env_file") or {}
    v = (ef.get("values") or {}).get("NCCL_IB_HCA")
    if v:
        return v, str(ef.get("path"))
    node = ctx.cluster.node(name)
    if getattr(node, "nccl_ib_hca", None):
        return str(node.nccl_ib_hca), "inventory ddp_nccl_ib_hca"
    return None


# ---------------------------------------------------------------- the checks


E, W = Severity.ERROR, Severity.WARNING


@rules(
    PORT_DOWN := Rule("fabric.port-down", E,
         "an RDMA port is not ACTIVE where the same port is ACTIVE on other nodes (or NCCL_IB_HCA names it, or no port "
         "of the node is up)",
         "Check {port}'s cable, transceiver and switch port (phys_state {phys}; ibstat {dev}, ibstatus) and the subnet "
         "manager; or leave the port out of NCCL_IB_HCA. Not changed automatically.", reads=SRC_FABRIC),
    RATE_MISMATCH := Rule("fabric.rate-mismatch", W,
         "an RDMA data port runs slower than the same port on other nodes (same link layer)",
         "Find why {port} negotiated down (cable, transceiver, switch port speed; ibstat, mlxlink) to {want}; the "
         "slowest rail sets the whole ring's speed. Not changed automatically.", reads=SRC_FABRIC),
    LINK_LAYER_MIXED := Rule("fabric.link-layer-mixed", E,
         "data rails are InfiniBand on some nodes and Ethernet (RoCE) on others",
         "Put every node's data rails on the same fabric (set the ConnectX port type with mlxconfig LINK_TYPE_P1, then "
         "reboot), or restrict NCCL_IB_HCA to the HCAs every node shares. Not changed automatically.",
         reads=SRC_FABRIC),
    ROCE_NO_V2_GID := Rule("fabric.roce-no-v2-gid", E, "a RoCE data port has no RoCE v2 GID with an IPv4 address",
         "Give {ndev} its IPv4 address (the GID table is filled from the netdev's addresses) and RoCE v2 as default "
         "(cma_roce_mode -d {dev} -p 1 -m 2); check with show_gids / ibv_devinfo -v. Not changed automatically.",
         reads=SRC_FABRIC),
    GID_INDEX_DIFFERS := Rule("fabric.gid-index-differs", W,
         "the RoCE v2 IPv4 GID index differs between nodes (one NCCL_IB_GID_INDEX cannot fit)",
         "Use NCCL >= 2.21 (selects the RoCE v2 GID by itself) and leave NCCL_IB_GID_INDEX unset; with an older NCCL "
         "set it per node (host var ddp_nccl_ib_gid_index: {indexes}) and run ddpfix env --apply. Not changed "
         "automatically.", reads=SRC_FABRIC, manual="per-node `ddp_nccl_ib_gid_index`, or NCCL >= 2.21"),
    PKEY_MISMATCH := Rule("fabric.pkey-mismatch", E, "InfiniBand ports' default P_Key partitions differ between nodes",
         "Put every node's ports in the same partition in the subnet manager's partitions.conf (OpenSM) / UFM, or pick "
         "the common one with NCCL_IB_PKEY. Not changed automatically.", reads=SRC_FABRIC),
    HCA_INCLUDES_MGMT := Rule("fabric.hca-includes-mgmt", W,
         "NCCL_IB_HCA (env file or `ddp_nccl_ib_hca`) includes the SSH/management NIC or an HCA 4x slower than the "
         "data rails",
         "Restrict NCCL_IB_HCA to the data rails, NCCL_IB_HCA={rails} "
         "(ddp_nccl_ib_hca; ddpfix env --apply derives it).",
         remedies=(ENV_FILE,), reads=SRC_FABRIC | SRC_ENV | SRC_IFACES),
    MEMLOCK_LOW := Rule("fabric.memlock-low", E,
         "RDMA node whose SSH session's memlock limit is below unlimited (or `ddp_memlock`)",
         "Raise memlock to {value} for the launch path: ddpfix remediate --apply writes "
         "/etc/security/limits.d/90-ddpfix-memlock.conf (memlock {value} for * and root) for new PAM logins; for a "
         "systemd launcher list it in ddp_launcher_units (LimitMEMLOCK drop-in).",
         remedies=(Remedy("ddpfix_limits", "limits", how="limits.d", tags=("memlock",)),),
         reads=SRC_FABRIC | frozenset({"memlock_units"})),
    NO_UVERBS := Rule("fabric.no-uverbs", E, "RDMA devices but no `/dev/infiniband/uverbs*`",
         "Load the user-verbs module: modprobe ib_uverbs (persist it in /etc/modules-load.d/ib_uverbs.conf; "
         "rdma-core's rdma-load-modules@ service does this). Not changed automatically.",
         reads=SRC_FABRIC | frozenset({"fabric_dev"})),
    PEERMEM_MISSING := Rule("fabric.peermem-missing", W,
         "GPUs and (non-EFA) RDMA but neither `nvidia_peermem` nor `gdrdrv` loaded",
         "Load GPUDirect RDMA: modprobe nvidia_peermem (persist it in /etc/modules-load.d/nvidia-peermem.conf). Not "
         "changed automatically.", reads=SRC_FABRIC),
    EFA_PROVIDER_MISSING := Rule("fabric.efa-provider-missing", E,
         "EFA devices but `fi_info -p efa` lists no efa provider",
         "Install or repair the AWS EFA installer's libfabric (fi_info -p efa must list provider: efa) and "
         "aws-ofi-nccl. Not changed automatically.", reads=SRC_FABRIC | frozenset({"fi_info"})),
    NCCL_VERSION_MISMATCH := Rule("fabric.nccl-version-mismatch", W,
         "torch's NCCL version (via `ddp_python`) differs between nodes",
         "Install the same torch (and NCCL) build on every node, for example the one with NCCL {version}. Not changed "
         "automatically.", reads=SRC_FABRIC),
)
def check_fabric(ctx: Context) -> Iterable[Finding]:
    nodes = [(n, f) for n, f in ctx.audited() if has_rdma(f)]
    if not nodes:
        return
    addr = {n: ctx.cluster.node(n).address for n, _ in nodes}
    yield from _port_down(ctx, nodes)
    yield from _rates(nodes, addr)
    yield from _link_layers(nodes, addr)
    yield from _roce(nodes, addr)
    yield from _pkeys(nodes)
    yield from _hca_mgmt(ctx, nodes, addr)
    yield from _host_setup(nodes, ctx.cluster.memlock_kib)
    versions = {n: fabric(f).get("nccl_version") for n, f in nodes if fabric(f).get("nccl_version")}
    if len(set(versions.values())) > 1:
        newest = max(versions.values(), key=lambda v: version_tuple(v) or ())
        yield finding("fabric.nccl-version-mismatch", None, "torch's NCCL differs between nodes",
                      ", ".join(f"{n}: NCCL {v}" for n, v in sorted(versions.items())), version=newest)


def _port_down(ctx: Context, nodes: Sequence[tuple[str, Mapping[str, Any]]]) -> Iterable[Finding]:
    up_on: dict[str, list[str]] = {}
    for n, f in nodes:
        for d, p in ports(f):
            if active(p):
                up_on.setdefault(pname(d, p), []).append(n)
    for n, f in nodes:
        any_up = any(active(p) for _, p in ports(f))
        hca = _env_hca(ctx, n, f)
        for d, p in ports(f):
            if active(p):
                continue
            key = pname(d, p)
            others = [o for o in up_on.get(key, []) if o != n]
            listed = hca is not None and hca_selects(hca[0], str(d.get("name")), p.get("port"))
            if not (others or listed or not any_up):
                continue  # an unused port that is down everywhere
            why = (f"ACTIVE on {', '.join(others)}" if others else
                   f"selected by NCCL_IB_HCA={hca[0]} ({hca[1]})" if listed and hca else
                   "no port of this node is ACTIVE")
            yield finding("fabric.port-down", n, f"RDMA port {key} on {n} is {p.get('state')} ({why})",
                          f"{_sysfs(f, d, p, 'state')}: {p.get('state_num')}: {p.get('state')}; "
                          f"phys_state: {p.get('phys_state_num')}: {p.get('phys_state')}",
                          port=key, dev=d.get("name"), phys=p.get("phys_state"))


def _rates(nodes: Sequence[tuple[str, Mapping[str, Any]]], addr: Mapping[str, str]) -> Iterable[Finding]:
    by_key: dict[tuple[str, str], dict[str, tuple[float, str]]] = {}
    for n, f in nodes:  # the same port on each node, on the same link layer (a mixed layer is its own finding)
        for d, p in data_rails(f, addr[n]):
            if p.get("rate_gbps"):
                rate = (float(p["rate_gbps"]), str(p.get("rate")))
                by_key.setdefault((pname(d, p), str(p.get("link_layer"))), {})[n] = rate
    for (key, _), rates in sorted(by_key.items()):
        best = max(r for r, _ in rates.values())
        best_on = sorted(n for n, (r, _) in rates.items() if r == best)
        for n, (r, text) in sorted(rates.items()):
            if r < best:
                want = rates[best_on[0]][1]
                yield finding("fabric.rate-mismatch", n,
                              f"RDMA port {key} on {n} runs at {r:g} Gb/s, {best:g} Gb/s on {', '.join(best_on)}",
                              f"{key} rate: {text}; {best_on[0]}: {want}", port=key, want=want)


def _link_layers(nodes: Sequence[tuple[str, Mapping[str, Any]]], addr: Mapping[str, str]) -> Iterable[Finding]:
    per_node = {n: sorted({str(p.get("link_layer")) for _, p in data_rails(f, addr[n])}) for n, f in nodes}
    per_node = {n: v for n, v in per_node.items() if v}
    if len({tuple(v) for v in per_node.values()}) > 1:
        yield finding("fabric.link-layer-mixed", None,
                      "the data rails' link layers differ between nodes (InfiniBand and RoCE cannot talk)",
                      ", ".join(f"{n}: {'+'.join(v)}" for n, v in sorted(per_node.items())))


def _roce(nodes: Sequence[tuple[str, Mapping[str, Any]]], addr: Mapping[str, str]) -> Iterable[Finding]:
    index: dict[str, tuple[int, str]] = {}
    for n, f in nodes:
        for d, p in data_rails(f, addr[n]):
            if p.get("link_layer") != "Ethernet":
                continue
            g = v2_ipv4_gid(p)
            ndev = ", ".join(d.get("netdevs") or []) or "its netdev"
            if g is None:
                gids = p.get("gids") or []
                table = "; ".join(f"{x['index']} {x.get('type')} {x.get('gid')}" for x in gids) or "no GID"
                yield finding("fabric.roce-no-v2-gid", n,
                              f"RoCE port {pname(d, p)} on {n} has no RoCE v2 GID with an IPv4 address",
                              f"{_sysfs(f, d, p, 'gids')}: {table}", port=pname(d, p), ndev=ndev, dev=d.get("name"))
            elif n not in index:
                index[n] = (int(g["index"]), pname(d, p))
    if len({i for i, _ in index.values()}) > 1:
        yield finding("fabric.gid-index-differs", None,
                      "the RoCE v2 IPv4 GID index differs between nodes (one NCCL_IB_GID_INDEX cannot fit all)",
                      ", ".join(f"{n}: {k} RoCE v2 IPv4 GID index {i}" for n, (i, k) in sorted(index.items())),
                      indexes=", ".join(f"{n}={i}" for n, (i, _) in sorted(index.items())))


def _pkeys(nodes: Sequence[tuple[str, Mapping[str, Any]]]) -> Iterable[Finding]:
    per_node: dict[str, str] = {}
    for n, f in nodes:
        for d, p in ports(f):
            if active(p) and p.get("link_layer") == "InfiniBand" and p.get("pkey0"):
                per_node.setdefault(n, f"{pname(d, p)} pkeys/0={p['pkey0']}")
    # 0xffff (full member) and 0x7fff (limited) share a partition; what must agree is the 15-bit partition number
    parts = {n: int(v.rsplit("=", 1)[1], 16) & 0x7FFF for n, v in per_node.items() if re.search(r"=0x[0-9a-fA-F]+$", v)}
    if len(set(parts.values())) > 1:
        yield finding("fabric.pkey-mismatch", None,
                      "the InfiniBand ports' default P_Key (partition) differs between nodes",
                      ", ".join(f"{n}: {v}" for n, v in sorted(per_node.items())))


def _hca_mgmt(ctx: Context, nodes: Sequence[tuple[str, Mapping[str, Any]]],
              addr: Mapping[str, str]) -> Iterable[Finding]:
    for n, f in nodes:
        hca = _env_hca(ctx, n, f)
        if not hca:
            continue
        for d in devices(f):
            why = mgmt_reason(f, addr[n], d)
            hit = [p for p in d.get("ports") or [] if hca_selects(hca[0], str(d.get("name")), p.get("port"))]
            if why and hit:
                rails = ",".join(sorted({str(x.get("name")) for x, _ in data_rails(f, addr[n])})) or "the data HCAs"
                yield finding("fabric.hca-includes-mgmt", n,
                              f"NCCL_IB_HCA on {n} includes {d.get('name')}, not a data rail ({why})",
                              f"{hca[1]}: NCCL_IB_HCA={hca[0]}; {d.get('name')}: {why}", rails=f"={rails}")


def memlock_low(soft: int, want_kib: int | None) -> bool:
    """Whether an RLIMIT_MEMLOCK (bytes, -1 unlimited) is below what RDMA needs (`want_kib`, None: unlimited)."""
    if soft == MEMLOCK_UNLIMITED:
        return False
    return want_kib is None or soft < want_kib * 1024


def _host_setup(nodes: Sequence[tuple[str, Mapping[str, Any]]], want_kib: int | None) -> Iterable[Finding]:
    want = "unlimited" if want_kib is None else _human(want_kib * 1024)
    for n, f in nodes:
        fb = fabric(f)
        ml = fb.get("memlock") or {}
        limits = [ml, *(fb.get("memlock_units") or {}).values()]
        low = [x for x in limits if x.get("soft") is not None and memlock_low(int(x["soft"]), want_kib)]
        if low:
            yield finding("fabric.memlock-low", n,
                          f"the memlock limit on {n} is {_human(int(low[0]['soft']))} "
                          f"({low[0].get('source') or 'SSH session'}), "
                          f"RDMA needs {want}",
                          "; ".join(f"RLIMIT_MEMLOCK of the {x.get('source') or 'SSH session'}: soft {x['soft']} "
                                    f"({_human(int(x['soft']))}), hard {x.get('hard')} "
                                    f"({_human(int(x['hard'] if x.get('hard') is not None else -1))})" for x in low),
                          value="unlimited" if want_kib is None else str(want_kib))
        if not fb.get("uverbs"):
            names = ", ".join(str(d.get("name")) for d in devices(f))
            yield finding("fabric.no-uverbs", n, f"{n} has RDMA devices ({names}) but no /dev/infiniband/uverbs*",
                          f"/dev/infiniband: {', '.join(fb.get('umad') or []) or 'no uverbs*, no umad*'}")
        ib = [d for d in devices(f) if not is_efa(d)]
        mods = fb.get("modules") or {}
        if fb.get("gpu") and ib and not any(mods.values()):
            yield finding("fabric.peermem-missing", n,
                          f"{n} has GPUs and RDMA but no GPUDirect RDMA module loaded "
                          "(NCCL stages through host memory)",
                          f"{fb.get('sysfs_root') or '/sys'}/module: nvidia present; nvidia_peermem and gdrdrv absent")
        efa = (fb.get("efa") or {})
        fi = efa.get("fi_info") or {}
        if efa.get("devices") and fi.get("ran") and not fi.get("ok"):
            providers = "providers: " + ", ".join(fi.get("providers") or [])
            yield finding("fabric.efa-provider-missing", n,
                          f"{n} has EFA devices ({', '.join(efa['devices'])}) but libfabric lists no efa provider",
                          f"{fi.get('path')} -p efa: {fi.get('error') or providers}")
