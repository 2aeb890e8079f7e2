"""Network interfaces: the cluster NIC on every node, its name, MTU and state, the interface NCCL and Gloo pick,
and whether it reaches every peer (the interface reach probe)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddpfix import ifreach
from ddpfix.ifselect import (
    NCCL_AUTO_STEPS,
    gloo_autoselect,
    inet_of,
    nccl_autoselect,
    nccl_select,
    owner_of,
    virtual_kind,
)
from ddpfix.model.finding import Explains, Finding, Severity
from ddpfix.model.net import is_loopback
from ddpfix.plan import cluster_nic
from ddpfix.rules.context import SRC_ENV, SRC_IFACES, SRC_PROBE, Context, cluster_if, hosts_lines, iface_named
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import ENV_FILE, PIN_IFNAME

E, W = Severity.ERROR, Severity.WARNING


def _autoselect_nccl(ctx: Context, name: str, ifaces: Sequence[Mapping[str, Any]],
                     actual: str | None) -> Iterable[Finding]:
    """netif.autoselect-wrong for NCCL with NCCL_SOCKET_IFNAME unset: each NCCL version's bootstrap pick (see
    NCCL_AUTO_STEPS) that lies outside the CIDR, or is a virtual/overlay interface or link-local address other than
    the cluster interface."""
    wrong: dict[str, tuple[Mapping[str, Any], str, str]] = {}
    picks: dict[str, list[tuple[Mapping[str, Any], str]]] = {}
    for version in NCCL_AUTO_STEPS:
        picks[version] = got = nccl_autoselect(ifaces, version)
        if not got:
            continue
        i, addr = got[0]
        kind = virtual_kind(i, addr) if i.get("name") != actual else None
        if kind or not ctx.in_cidr(addr):
            wrong[version] = (i, addr, kind or f"outside {ctx.cidr}")
    if not wrong:
        return
    said = {v: f"{i['name']} ({addr}, {why})" for v, (i, addr, why) in wrong.items()}
    if len(set(said.values())) == 1 and len(wrong) == len(NCCL_AUTO_STEPS):
        what = f"NCCL would pick {next(iter(said.values()))}"
    else:
        what = "; ".join(f"NCCL {v} would pick {pick}" for v, pick in said.items())
        what += "".join(f" (NCCL {v} picks {got[0][0]['name']})" for v, got in picks.items() if got and v not in wrong)
    lists: dict[str, list[str]] = {}  # the order each version returns (the same list once), the first 6 entries
    for v, got in picks.items():
        shown = [f"{i['name']}={a}" for i, a in got[:6]] + ([f"... {len(got) - 6} more"] if len(got) > 6 else [])
        lists.setdefault(", ".join(shown), []).append(v)
    order = "; ".join(" and ".join(f"{v} (ib*, then not {', '.join(NCCL_AUTO_STEPS[v][1][1:])})" for v in vs)
                      + f": {text}" for text, vs in lists.items() if text)
    yield finding(
        "netif.autoselect-wrong",
        name,
        f"with NCCL_SOCKET_IFNAME unset {what}, "
        f"not the cluster interface {actual or '(none found in ' + str(ctx.cidr) + ')'}",
        f"NCCL's automatic order, {order}; picked: "
        + ", ".join(dict.fromkeys(f"{i['name']} {addr} ({why})" for i, addr, why in wrong.values())),
        ifname=actual or "<cluster interface>",
    )


def _configured_ifnames(ctx: Context, name: str, f: Mapping[str, Any]) -> dict[str, str]:
    """Socket interface settings in force on this node: inventory override and existing env file values."""
    out: dict[str, str] = {}
    node = ctx.cluster.node(name)
    if node.socket_ifname:
        out["ddp_socket_ifname"] = node.socket_ifname
    env = (f.get("env_file") or {}).get("values") or {}
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        if env.get(k):
            out[k] = env[k]
    return out


#: the rule of the interface reach probe (the engine lists it as not evaluated where the probe could not decide)
REACH_RULE = "netif.cannot-reach-peers"


@rules(
    MISSING := Rule(
        "netif.missing",
        E,
        "the configured socket interface (override or env file's NCCL/GLOO_SOCKET_IFNAME, NCCL grammar) does not "
        "exist or has no address in the CIDR",
        "Set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME per node to the node's own cluster interface (ddpfix env --apply).",
        remedies=(ENV_FILE,),
        reads=SRC_IFACES | SRC_ENV,
    ),
    NAME_MISMATCH := Rule(
        "netif.name-mismatch",
        W,
        "the cluster NIC has different names while one name is configured for all",
        "Write per-node interface names (ddpfix env files) instead of one cluster-wide name; optionally pin names "
        "(--pin-ifnames).",
        remedies=(ENV_FILE, PIN_IFNAME),
        reads=SRC_IFACES | SRC_ENV,
        scope="cluster", explains=(Explains("netif.missing", "any"),),
    ),
    AUTOSELECT_WRONG := Rule(
        "netif.autoselect-wrong",
        W,
        "with no IFNAME set, NCCL's default order or Gloo's hostname path would pick a non-cluster interface: "
        "outside the CIDR, or a virtual/overlay device (docker0, br-*, veth*, virbr*, cni0, flannel.1, cali*, weave, "
        "tailscale0, wg*) or a link-local address (169.254.0.0/16, fe80::/10) other than the cluster NIC",
        "Set NCCL_SOCKET_IFNAME=={ifname} and GLOO_SOCKET_IFNAME={ifname} on this node (ddpfix env --apply writes "
        "them). NCCL excludes only docker*, lo* (and, from 2.28.3, virbr* and interfaces without carrier) from its "
        "automatic choice, and Gloo binds whatever the hostname resolves to.",
        remedies=(ENV_FILE,),
        reads=SRC_IFACES | SRC_ENV,
    ),
    MTU_MISMATCH := Rule(
        "netif.mtu-mismatch",
        W,
        "cluster interface MTUs differ",
        "Set the same MTU on every node's cluster interface (and the switch); not changed automatically.",
        reads=SRC_IFACES,
        scope="cluster",
    ),
    DOWN := Rule(
        "netif.down",
        E,
        "the cluster interface is down",
        "Bring the interface up (ip link set {ifname} up) and fix its configuration; not changed automatically.",
        reads=SRC_IFACES,
    ),
)
def check_interfaces(ctx: Context) -> Iterable[Finding]:
    names: dict[str, str] = {}
    mtus: dict[str, int] = {}
    configured_all: dict[str, dict[str, str]] = {}
    for name, f in ctx.audited():
        ifaces = f.get("interfaces") or []
        cl: Mapping[str, Any] = f.get("cluster") or {}
        actual = ctx.plan[name].ifname
        # the NIC holding the cluster address, even when a (wrong) override hid it from the plan
        real = actual or cluster_nic(f, cidr=ctx.cidr)
        if real:
            names[name] = real
        if actual:
            i = iface_named(f, actual) or {}
            if i.get("mtu"):
                mtus[name] = int(i["mtu"])
            if "UP" not in (i.get("flags") or []) or i.get("operstate") == "DOWN":
                yield finding(
                    "netif.down",
                    name,
                    f"cluster interface {actual} is down",
                    f"ip link: {actual} flags={','.join(i.get('flags') or [])} operstate={i.get('operstate')}",
                    ifname=actual or "<cluster interface>",
                )
        elif not cl.get("address") and not ctx.cluster.node(name).socket_ifname:
            yield finding(
                "netif.missing",
                name,
                f"no interface on {name} has an address in {ctx.cidr}",
                "interfaces: " + "; ".join(f"{i['name']} {','.join(inet_of(i)) or '-'}" for i in ifaces),
            )
        configured = _configured_ifnames(ctx, name, f)
        configured_all[name] = configured
        for key, value in configured.items():
            if key == "NCCL_SOCKET_IFNAME":
                chosen = nccl_select(value, ifaces)
                ok = [i for i in chosen if any(ctx.in_cidr(a) for a in inet_of(i))]
                if not ok:
                    yield finding(
                        "netif.missing",
                        name,
                        f"{key}={value} matches no interface with an address in {ctx.cidr} on {name}",
                        f"{key}={value} matched: {', '.join(i['name'] for i in chosen) or 'nothing'}; "
                        f"{cluster_if(actual)}",
                    )
            else:
                for ifn in [v for v in value.split(",") if v]:
                    found = iface_named(f, ifn)
                    if found is None:
                        yield finding(
                            "netif.missing",
                            name,
                            f"{key}={value}: interface {ifn} does not exist on {name}",
                            f"{key}={value}; interfaces present: {', '.join(x['name'] for x in ifaces)}; "
                            f"{cluster_if(actual)}",
                        )
                    elif not any(ctx.in_cidr(a) for a in inet_of(found)):
                        yield finding(
                            "netif.missing",
                            name,
                            f"{key}={value}: {ifn} has no address in {ctx.cidr}",
                            f"{key}={value}; {ifn} addresses: {', '.join(inet_of(found)) or 'none'}",
                        )
        if not configured.get("NCCL_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
            yield from _autoselect_nccl(ctx, name, ifaces, actual)
        if not configured.get("GLOO_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
            hn = f.get("hostname") or ""
            bound = gloo_autoselect(f)
            owner = owner_of(ifaces, bound) if bound else None
            kind = virtual_kind(owner, bound) if owner and owner.get("name") != actual else None
            if bound and not is_loopback(bound) and (kind or not ctx.in_cidr(bound)):
                yield finding(
                    "netif.autoselect-wrong",
                    name,
                    f"with GLOO_SOCKET_IFNAME unset Gloo would bind {bound} (what hostname {hn} resolves to), "
                    + (f"on {owner['name']} ({kind}), not the cluster interface {actual}" if kind and owner
                       else f"outside {ctx.cidr}"),
                    hosts_lines(f, hn) + (f"; {bound} is on {owner['name']}" if owner else ""),
                    ifname=actual or "<cluster interface>",
                )
    if len(set(names.values())) > 1:
        single = {frozenset(c.items()) for c in configured_all.values() if c}
        one_name = len(single) == 1 and len(configured_all) == len(names) and all(configured_all.values())
        if one_name:
            yield finding(
                "netif.name-mismatch",
                None,
                "the cluster interface is named differently across nodes but one name is configured for all",
                "cluster interfaces: "
                + ", ".join(f"{n}={i}" for n, i in sorted(names.items()))
                + "; configured: "
                + ", ".join(f"{k}={v}" for k, v in sorted(next(iter(single)))),
            )
    if len(set(mtus.values())) > 1:
        yield finding(
            "netif.mtu-mismatch",
            None,
            "cluster interface MTUs differ between nodes",
            ", ".join(f"{n}: {names[n]} mtu {m}" for n, m in sorted(mtus.items())),
        )


def in_force_ifnames(ctx: Context, name: str, f: Mapping[str, Any]) -> dict[str, list[str]]:
    """{interface: [what puts it in force]} on a node: ddp_socket_ifname, the env file's GLOO/TP_SOCKET_IFNAME
    (each name of the list) and NCCL_SOCKET_IFNAME (the first interface NCCL's grammar selects: its bootstrap's),
    else the automatic picks: NCCL's first interface in each version's order and Gloo's hostname address."""
    ifaces = f.get("interfaces") or []
    out: dict[str, list[str]] = {}
    configured = _configured_ifnames(ctx, name, f)
    for key, value in configured.items():
        if key == "NCCL_SOCKET_IFNAME":
            names = [str(i.get("name")) for i in nccl_select(value, ifaces)[:1]]
        else:
            names = [v for v in value.split(",") if v]
        for n in names:
            out.setdefault(n, []).append(f"{key}={value}")
    if not configured.get("NCCL_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
        for version in NCCL_AUTO_STEPS:
            got = nccl_autoselect(ifaces, version)
            if got and "NCCL's automatic pick" not in out.get(str(got[0][0].get("name")), []):
                out.setdefault(str(got[0][0].get("name")), []).append("NCCL's automatic pick")
    if not configured.get("GLOO_SOCKET_IFNAME") and not configured.get("ddp_socket_ifname"):
        bound = gloo_autoselect(f)
        owner = owner_of(ifaces, bound) if bound else None
        if owner:
            out.setdefault(str(owner.get("name")), []).append(f"Gloo's automatic pick (the hostname's {bound})")
    return out


@rules(
    CANNOT_REACH_PEERS := Rule(
        "netif.cannot-reach-peers",
        E,
        "the socket interface in force (ddp_socket_ifname, the env file's GLOO/NCCL/TP_SOCKET_IFNAME, or NCCL's or "
        "Gloo's automatic pick) did not reach some probed peer while another candidate interface reached them all "
        "(the interface reach probe: each planned peer dialled from each up IPv4 interface, bound to its device)",
        "Use {good} ({good_address}) on {node}, the interface that reached every probed peer: {how}. Then find why "
        "{bad} reaches no peer (cabling, switch port or VLAN, its address in the cluster network on an isolated link).",
        remedies=(ENV_FILE,),
        reads=SRC_IFACES | SRC_ENV | SRC_PROBE,
        still_open="ddp_socket_ifname in the inventory names the failing interface: ddpfix keeps the inventory's "
                   "interface; change it, or find why that interface reaches no peer",
    ),
)
def check_interface_reach(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        reach = ctx.reach.get(name)
        if not ifreach.decisive(reach):
            continue
        assert reach is not None
        good = ifreach.reached_all(reach)
        if not good:
            continue  # no candidate reached every peer: the probe findings say what fails
        bad = {n: why for n, why in in_force_ifnames(ctx, name, f).items() if ifreach.failed(reach, n)}
        if not bad:
            continue
        planned = ctx.plan[name].ifname
        inside = [n for n in good if ctx.in_cidr(str(reach[n].get("address") or ""))] or good
        best = planned if planned in inside else inside[0]
        override = any(w.startswith("ddp_socket_ifname=") for ws in bad.values() for w in ws)
        how = (f"set ddp_socket_ifname: {best} for {name} in the inventory (ddpfix keeps the inventory's interface)"
               if override else
               f"NCCL_SOCKET_IFNAME=={best} and GLOO_SOCKET_IFNAME={best} in its env file (ddpfix remediate "
               "--apply writes them)")
        said = "; ".join(f"{n} ({', '.join(ws)}) did not reach {', '.join(sorted(ifreach.failed(reach, n)))}"
                         for n, ws in bad.items())
        yield finding(
            REACH_RULE,
            name,
            f"{said}, while {', '.join(good)} reached every probed peer",
            ifreach.describe(reach),
            good=best, good_address=reach[best].get("address"), node=name, how=how, bad=", ".join(bad),
        )
