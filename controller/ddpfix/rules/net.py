"""Addresses, routes and kernel network settings: the route to peers, the master address, the sysctls the
rendezvous depends on, reverse-path filtering and ARP flux between cluster NICs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpfix.ifselect import inet_of
from ddpfix.model.finding import Explains, Finding, Remedy, Severity
from ddpfix.rules.context import SRC_ENV, Context
from ddpfix.rules.probes import MASTER_PORT_UNREACHABLE, PEER_UNREACHABLE
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import ENV_FILE

E, W = Severity.ERROR, Severity.WARNING


# ---------------------------------------------------------------- addresses, routes, sysctls


@rules(
    VIA_GATEWAY := Rule(
        "route.via-gateway",
        W,
        "the route to a peer leaves through a gateway or another interface",
        "Make the peer on-link on the cluster interface (fix the netmask or remove the host route); not changed "
        "automatically.",
        explains=(Explains(MASTER_PORT_UNREACHABLE.id, "host"), Explains(PEER_UNREACHABLE.id, "dialler")),
    ),
)
def check_routes(ctx: Context) -> Iterable[Finding]:
    for name, _f in ctx.audited():
        routes = (ctx.hosts[name].probe or {}).get("routes") or {}
        ifname = ctx.plan[name].ifname
        for dst, r in routes.items():  # run_checks sorts the findings
            if "error" in r or not (r.get("via") or (ifname and r.get("dev") != ifname)):
                continue
            peer = ctx.by_address.get(dst, dst)
            yield finding(
                "route.via-gateway",
                name,
                f"traffic from {name} to {peer} ({dst}) leaves via {r.get('via') or r.get('dev')} "
                f"instead of on-link on {ifname}",
                f"ip route get {dst}: dev {r.get('dev')}"
                + (f" via {r['via']}" if r.get("via") else "")
                + (f" src {r['src']}" if r.get("src") else ""),
            )


@rules(
    MASTER_NOT_PRIVATE := Rule(
        "addr.master-not-private",
        E,
        "an env file's MASTER_ADDR is not the master's address in the cluster CIDR",
        "Use the master's private address in {cidr} as MASTER_ADDR (ddpfix env --apply writes it).",
        remedies=(ENV_FILE,),
        reads=SRC_ENV,
    ),
)
def check_master_addr(ctx: Context) -> Iterable[Finding]:
    want = ctx.plan[ctx.cluster.master].address if ctx.cluster.master in ctx.plan else None
    for name, f in ctx.audited():
        envf: Mapping[str, Any] = f.get("env_file") or {}
        env = envf.get("values") or {}
        got = env.get("MASTER_ADDR")
        if got and want and got != want:
            kind = "outside the cluster network" if not ctx.in_cidr(got) else "not the master's cluster address"
            yield finding(
                "addr.master-not-private",
                name,
                f"MASTER_ADDR={got} in {envf.get('path')} is {kind} ({ctx.cluster.master} is {want})",
                f"{envf.get('path')}: MASTER_ADDR={got}",
                cidr=ctx.cidr,
            )


@rules(
    MASTER_PORT_EPHEMERAL := Rule(
        "net.master-port-ephemeral",
        W,
        "the master port is inside the ephemeral range",
        "Choose a ddp_master_port outside net.ipv4.ip_local_port_range, or an outgoing socket may take it (errno 98).",
        reads=frozenset({"sysctl"}),
        master_only=True,
    ),
    SOMAXCONN_LOW := Rule(
        "net.somaxconn-low",
        W,
        "`net.core.somaxconn` below the world size",
        "Raise net.core.somaxconn above the world size on the master (sysctl -w net.core.somaxconn={want} and persist "
        "it in /etc/sysctl.d/).",
        reads=frozenset({"sysctl"}),
        master_only=True,
    ),
)
def check_sysctls(ctx: Context) -> Iterable[Finding]:
    mf = ctx.facts.get(ctx.cluster.master)
    if not mf:
        return
    sc: Mapping[str, Any] = mf.get("sysctl") or {}
    lo, hi = sc.get("ip_local_port_range", [32768, 60999])
    if int(lo) <= ctx.cluster.master_port <= int(hi):
        yield finding(
            "net.master-port-ephemeral",
            ctx.cluster.master,
            f"MASTER_PORT {ctx.cluster.master_port} is inside the ephemeral range {lo}-{hi}",
            f"net.ipv4.ip_local_port_range = {lo} {hi}",
        )
    world = ctx.cluster.world_size
    if sc.get("somaxconn") and int(sc["somaxconn"]) < world:
        yield finding(
            "net.somaxconn-low",
            ctx.cluster.master,
            f"net.core.somaxconn={sc['somaxconn']} is below the world size {world}",
            f"net.core.somaxconn = {sc['somaxconn']}",
            want=max(4096, 2 * world),
        )


STRICT_RP_FILTER = 1  # net.ipv4.conf.*.rp_filter: 0 off, 1 strict (RFC 3704), 2 loose


@rules(
    RP_FILTER_STRICT := Rule(
        "net.rp-filter-strict",
        W,
        "strict reverse-path filtering (rp_filter 1, the larger of conf.all and the interface's) on the cluster "
        "interface of a node with more than one IPv4 interface: cluster packets whose route back leaves by another "
        "interface are dropped without a trace",
        "Use loose mode on {ifname}: sysctl -w net.ipv4.conf.{ifname}.rp_filter=2 and persist it as "
        "net.ipv4.conf.{ifname}.rp_filter = 2 in /etc/sysctl.d/90-ddpfix-rp-filter.conf (the kernel uses the larger "
        "of conf.all and conf.{ifname}, so 2 wins over a strict conf.all). A warning, not an error: strict mode only "
        "drops a packet when the route back to its source leaves by another interface (a default route or "
        "host route on {others}), which depends on routes and peers' addresses. Not changed automatically.",
        reads=frozenset({"interfaces", "rp_filter"}),
    ),
)
def check_rp_filter(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        sysctl: Mapping[str, Any] = f.get("sysctl") or {}
        rp = sysctl.get("rp_filter")
        ifname = ctx.plan[name].ifname
        if not isinstance(rp, Mapping) or not ifname:
            continue  # facts of a ddpfix that did not read rp_filter; no cluster interface (rules.netif reports it)
        homed = [
            i
            for i in f.get("interfaces") or []
            if inet_of(i) and "LOOPBACK" not in (i.get("flags") or []) and "UP" in (i.get("flags") or [])
        ]
        if len(homed) < 2:
            continue
        try:
            values = {k: int(rp[k]) for k in ("all", ifname) if k in rp}
        except (TypeError, ValueError):
            continue
        if ifname not in values:
            continue
        effective = max(values.values())
        if effective != STRICT_RP_FILTER:
            continue
        others = [i["name"] for i in homed if i.get("name") != ifname]
        yield finding(
            "net.rp-filter-strict",
            name,
            f"{ifname}, the cluster interface of {name}, filters reverse paths strictly while {name} has "
            f"{len(homed)} IPv4 interfaces: cluster traffic whose route back leaves by "
            f"{', '.join(others)} is dropped",
            f"net.ipv4.conf.all.rp_filter = {values.get('all', '?')}, "
            f"net.ipv4.conf.{ifname}.rp_filter = {values[ifname]} (effective {effective}, strict); "
            "IPv4 interfaces: " + ", ".join(f"{i['name']} {','.join(inet_of(i))}" for i in homed),
            ifname=ifname,
            others=", ".join(others),
        )


ARP_PATH = "/etc/sysctl.d/90-ddpfix-arp.conf"


def sysctl_key(ifname: str, key: str) -> str:
    """The sysctl name of a per-interface IPv4 setting (a '.' in an interface name, a VLAN, is written '/')."""
    return f"net.ipv4.conf.{ifname.replace('.', '/')}.{key}"


def _cluster_ifaces(ctx: Context, f: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    out = []
    for i in f.get("interfaces") or []:
        if "UP" not in (i.get("flags") or []) or not i.get("name"):
            continue
        addrs = [str(a["local"]) for a in i.get("addrs") or [] if a.get("family") == "inet" and ctx.in_cidr(a["local"])]
        if addrs:
            out.append((str(i["name"]), addrs))
    return out


@rules(
    ARP_FLUX := Rule("net.arp-flux", W,
         "two or more interfaces of a node have addresses in the cluster network and arp_ignore/arp_announce at "
         "their defaults (0): each answers ARP for the other's address, so peers send to the wrong port and replies "
         "leave by another NIC (NVIDIA/nccl#1269)",
         "Answer ARP only on the interface that holds the address and announce it from there: {commands}; persist "
         "it in " + ARP_PATH + " (ddpfix remediate --apply writes both, for {ifaces} only).",
         remedies=(Remedy("ddpfix_sysctl", "arp", how="sysctl.d", tags=("sysctl",)),),
         reads=frozenset({"interfaces", "arp"})),
)
def check_arp_flux(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        sysctl: Mapping[str, Any] = f.get("sysctl") or {}
        arp: Any = sysctl.get("arp")
        if not isinstance(arp, Mapping):
            continue  # not collected
        ifaces = [(i, a) for i, a in _cluster_ifaces(ctx, f) if isinstance(arp.get(i), Mapping)]
        if len(ifaces) < 2:
            continue
        al: Mapping[str, Any] = arp["all"] if isinstance(arp.get("all"), Mapping) else {}

        def eff(ifname: str, key: str, al: Mapping[str, Any] = al, arp: Mapping[str, Any] = arp) -> int:
            return max(int(al.get(key) or 0), int(arp[ifname].get(key) or 0))

        flux = [i for i, _ in ifaces if eff(i, "arp_ignore") == 0 or eff(i, "arp_announce") == 0]
        if not flux:
            continue
        names = [i for i, _ in ifaces]
        yield finding(
            "net.arp-flux", name,
            f"{name} has {len(ifaces)} interfaces in the cluster network ({', '.join(names)}) that answer ARP for "
            "each other's addresses",
            f"net.ipv4.conf.all.arp_ignore = {int(al.get('arp_ignore') or 0)}, "
            f"arp_announce = {int(al.get('arp_announce') or 0)}; "
            + "; ".join(f"{i} {', '.join(a)}: arp_ignore {arp[i].get('arp_ignore')}, "
                        f"arp_announce {arp[i].get('arp_announce')} (effective {eff(i, 'arp_ignore')}/"
                        f"{eff(i, 'arp_announce')})" for i, a in ifaces),
            commands="sysctl -w " + " ".join(f"{sysctl_key(i, 'arp_ignore')}=1 {sysctl_key(i, 'arp_announce')}=2"
                                             for i in names),
            ifaces=",".join(names),
        )
