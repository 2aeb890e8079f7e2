"""Which interface NCCL and Gloo pick on a node: the NCCL_SOCKET_IFNAME grammar and NCCL's and Gloo's automatic
choice, replayed over the node's interface facts. Pure functions, no rules (the netif rules use them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddpfix.model import net

# NCCL's default exclusion list when NCCL_SOCKET_IFNAME is unset (after trying ib* first).
NCCL_DEFAULT_EXCLUDE = ("docker", "lo", "virbr")


def nccl_select(spec: str | None, ifaces: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Interfaces NCCL would use for `NCCL_SOCKET_IFNAME=spec` (None: its default order), IPv4 ones."""
    cands = [
        i
        for i in sorted(ifaces, key=lambda x: x.get("index") or 0)
        if any(a.get("family") == "inet" for a in i.get("addrs") or [])
    ]
    if spec:
        exclude = spec.startswith("^")
        s = spec[1:] if exclude else spec
        exact = s.startswith("=")
        s = s[1:] if exact else s
        pats = [p for p in s.split(",") if p]

        def match(n: str) -> bool:
            return any((n == p) if exact else n.startswith(p) for p in pats)

        return [i for i in cands if match(i["name"]) != exclude]
    ib = [i for i in cands if i["name"].startswith("ib")]
    if ib:
        return ib
    return [i for i in cands if not any(i["name"].startswith(p) for p in NCCL_DEFAULT_EXCLUDE)]


def inet_of(i: Mapping[str, Any]) -> list[str]:
    return [a["local"] for a in i.get("addrs") or [] if a.get("family") == "inet"]


# NCCL's automatic socket interface choice (NCCL_SOCKET_IFNAME unset), replayed from its source: ncclFindInterfaces
# (NVIDIA/nccl src/misc/socket.cc) walks the getifaddrs() entries (glibc asks the kernel for every IPv4 address,
# interface by interface in index order, then every IPv6 one; NCCL skips ::1 and keeps the first address of each
# name) and takes the first non-empty step: names starting with "ib"; the subnet of NCCL_COMM_ID (torch never sets
# it); every name but "^docker,lo"; "docker"; "lo". NCCL 2.28.3 (f1308997, the loop moved to src/os/linux.cc
# ncclOsFindInterfaces) skips interfaces without IFF_RUNNING (up, operstate UP or UNKNOWN), excludes "virbr" too and
# falls back to it last. The bootstrap (src/bootstrap.cc) takes the first interface (maxIfs 1); NET/Socket takes up
# to 16 (MAX_IFS). Nothing else is excluded: cni0, flannel.1, cali*, weave, tailscale0, wg*, br-*, veth* and
# link-local addresses are picked like any NIC (uccl-project/uccl#1034).
NCCL_AUTO_STEPS = {
    "2.28.3+": (("ib",), ("^", "docker", "lo", "virbr"), ("docker",), ("lo",), ("virbr",)),
    "<2.28.3": (("ib",), ("^", "docker", "lo"), ("docker",), ("lo",)),
}

#: Interface name prefixes of virtual and overlay devices, and what they are (a pick of one of them, other than the
#: node's cluster interface, is wrong even when its address lies in the cluster CIDR).
VIRTUAL_IFNAMES = (
    ("docker", "Docker bridge"), ("br-", "Docker user-network bridge"), ("veth", "container veth"),
    ("virbr", "libvirt NAT bridge"), ("cni", "Kubernetes CNI bridge"), ("flannel", "flannel overlay"),
    ("cali", "Calico pod interface"), ("weave", "Weave Net bridge"), ("vxlan", "VXLAN overlay"),
    ("cilium", "Cilium interface"), ("kube-", "Kubernetes proxy interface"), ("tailscale", "Tailscale VPN"),
    ("wg", "WireGuard tunnel"), ("zt", "ZeroTier VPN"), ("tunl", "IP-in-IP tunnel"), ("tun", "tunnel"),
    ("tap", "tap device"),
    ("lxcbr", "LXC bridge"), ("lxdbr", "LXD bridge"), ("podman", "Podman bridge"),
)
#: `ip -d` link kinds that are never a cluster NIC of their own (a bridge may be: br0 holding the host's NIC)
VIRTUAL_KINDS = {"veth": "veth", "vxlan": "VXLAN overlay", "wireguard": "WireGuard tunnel", "geneve": "Geneve overlay",
                 "tun": "tun/tap device", "ipip": "IP-in-IP tunnel", "gre": "GRE tunnel", "sit": "SIT tunnel"}


def _running(i: Mapping[str, Any]) -> bool:
    """IFF_RUNNING as the kernel sets it (dev_get_flags): up, and operstate UP or UNKNOWN (netif_oper_up)."""
    return "UP" in (i.get("flags") or []) and i.get("operstate") in ("UP", "UNKNOWN", None)


def nccl_autoselect(ifaces: Sequence[Mapping[str, Any]],
                    version: str = "2.28.3+") -> list[tuple[Mapping[str, Any], str]]:
    """(interface, address) in the order NCCL's automatic choice of `version` ("2.28.3+" or "<2.28.3") returns
    them; the first one is the bootstrap's (see NCCL_AUTO_STEPS)."""
    ordered = sorted(ifaces, key=lambda x: x.get("index") or 0)
    entries = [(i, str(a.get("local")))
               for fam in ("inet", "inet6") for i in ordered for a in i.get("addrs") or []
               if a.get("family") == fam and a.get("local") and not (fam == "inet6" and net.is_loopback(a["local"]))]
    if version == "2.28.3+":
        entries = [e for e in entries if _running(e[0])]
    for step in NCCL_AUTO_STEPS[version]:
        negate = step[0] == "^"
        pats = step[1:] if negate else step
        got: list[tuple[Mapping[str, Any], str]] = []
        for i, addr in entries:
            name = str(i.get("name") or "")
            if name.startswith(pats) != negate and all(g[0].get("name") != name for g in got):
                got.append((i, addr))
        if got:
            return got
    return []


def virtual_kind(i: Mapping[str, Any], addr: str | None = None) -> str | None:
    """What makes (interface, address) no cluster path: a virtual/overlay device or a link-local address; None."""
    name = str(i.get("name") or "")
    why = [next((what for prefix, what in VIRTUAL_IFNAMES if name.startswith(prefix)), None)
           or VIRTUAL_KINDS.get(str(i.get("kind") or ""))]
    ip = net.ip(addr) if addr else None
    if ip is not None and ip.is_link_local:
        why.insert(0, "link-local, 169.254.0.0/16" if ip.version == 4 else "link-local, fe80::/10")
    return ", ".join(w for w in why if w) or None


def owner_of(ifaces: Sequence[Mapping[str, Any]], addr: str) -> Mapping[str, Any] | None:
    return next((i for i in ifaces for a in i.get("addrs") or [] if a.get("local") == addr), None)


def gloo_autoselect(f: Mapping[str, Any]) -> str | None:
    """The address Gloo binds with GLOO_SOCKET_IFNAME unset: torch's GlooDeviceFactory makeDeviceForHostname takes
    the first getaddrinfo(hostname) result that bind() accepts (doesHostnameResolveToUsableAddress, torch
    torch/csrc/distributed/c10d/GlooDeviceFactory.cpp), i.e. a loopback or a local address (a link-local IPv6 one
    without a scope does not bind); None: nothing binds (torch falls back to 127.0.0.1)."""
    hn = f.get("hostname") or ""
    ifaces = f.get("interfaces") or []
    for a in (f.get("resolve_self") or {}).get(hn) or []:
        if net.is_loopback(a):
            return str(a)
        if not net.is_ip(a) or (net.is_link_local(a) and ":" in a and "%" not in a):
            continue
        if owner_of(ifaces, a) is not None:
            return str(a)
    return None
