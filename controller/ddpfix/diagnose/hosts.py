"""What a log tells about the hosts, besides its failures: the interfaces and addresses NCCL chose (and what kind
of address each is: loopback, link-local, a container/VM bridge, a public address), the versions each node or rank
reports (torch, NCCL, the NCCL net plugin and network), compared across them, and the store address as dialled.
Every regex runs on lines already cut by `bounded.for_matching`; each is anchored by a literal and bounded."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: `host:pid:tid [dev]` (NCCL's prefix), after an optional launcher prefix (`[1] `, `[rank1]: `, `0: `)
_WHO = re.compile(r"^(?:\[[Rr]ank ?\d{1,6}\]:? ?|\[\d{1,6}\]:? |\d{1,6}: )?([\w.-]{1,64}):\d{1,9}:\d{1,9} \[\d{1,4}\]")
_RANK = re.compile(r"\[[Rr]ank ?(\d{1,6})\]|^\[(\d{1,6})\]:? |^(\d{1,6}): ")
#: NCCL >= 2.4: `NET/Socket : Using [0]eth0:10.0.0.1<0>`, `Bootstrap : Using eth0:10.0.0.1<0>`;
#: NCCL 2.3: `NET : Using interface eth0:10.0.0.1<0>`, `NET/Socket : Using interface eth0:10.0.0.1<0>`
_USING = re.compile(r"(?:NET/Socket|Bootstrap|NET) ?: Using (?:interface )?"
                    r"([^;\s]{1,256}(?: \[\d{1,3}\][^;\s]{1,256}){0,16})")
_ONE = re.compile(r"(?:\[\d{1,3}\]|(?<![\w.:-]))([\w.-]{1,64}(?::[a-z]{1,16})?):([0-9A-Fa-f:.%]{2,64})<\d{1,5}>")
VERSION_RX: dict[str, re.Pattern[str]] = {
    "nccl": re.compile(r"NCCL version:? ?(\d{1,2}\.\d{1,3}\.\d{1,3})"),
    "torch": re.compile(r"(?:PyTorch version|torch version|torch\.__version__|\btorch==)[:= ]{0,3}"
                        r"(\d{1,2}\.\d{1,3}\.\d{1,3}(?:\+[\w.]{1,32})?)"),
    "net plugin": re.compile(r"NET/Plugin ?: ?(?:Loaded (?:net|coll) plugin |Using )([\w .-]{1,48}?)"
                             r"(?: \(v\d{1,3}\)|$)|Initializing (aws-ofi-nccl [\w.-]{1,32})|"
                             r"Plugin Path ?: ?(\S{1,256})|"
                             r"NET/Plugin ?: ?(?P<internal>Could not find|No plugin found)"),
    "network": re.compile(r"NCCL INFO Using network ([\w -]{1,32})$"),
}
_BRIDGE = re.compile(r"^(?:docker|veth|virbr|br-|cni|flannel|cali|vxlan|lxcbr|weave|tailscale|wg|tunl|cilium)")
_STORE = re.compile(r"(?:connect to|network address(?:es)? of|to host) \(?\[?([\w.:-]{1,128}?)\]?(?:, |:)(\d{2,5})\b")


@dataclass(frozen=True)
class Interface:
    who: str  # the node (NCCL's prefix) or the rank that printed it
    name: str
    address: str
    kind: str  # loopback, link-local, bridge, public, private

    def to_json(self) -> dict[str, str]:
        return {"who": self.who, "name": self.name, "address": self.address, "kind": self.kind}


@dataclass
class HostFacts:
    interfaces: list[Interface] = field(default_factory=list)
    #: kind ("torch", "nccl", "net plugin", "network") -> who -> version
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    stores: list[str] = field(default_factory=list)  # host:port as dialled
    #: the 0-based line where each (kind, who) version was read
    at: dict[tuple[str, str], int] = field(default_factory=dict)

    def differing(self) -> dict[str, dict[str, str]]:
        """The versions that differ between the nodes (or ranks) that report them."""
        return {k: v for k, v in self.versions.items() if len(set(v.values())) > 1}

    def odd_interfaces(self) -> list[Interface]:
        """Interfaces a peer on another node cannot reach: loopback, link-local, a bridge."""
        return [i for i in self.interfaces if i.kind in ("loopback", "link-local", "bridge")]

    def to_json(self) -> dict[str, Any]:
        return {"interfaces": [i.to_json() for i in self.interfaces], "versions": self.versions,
                "versions_differ": sorted(self.differing()), "stores": self.stores}


def address_kind(name: str, address: str) -> str:
    if _BRIDGE.match(name):
        return "bridge"
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return "private"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    return "public" if ip.is_global else "private"


def _who(line: str) -> str:
    if m := _WHO.search(line):
        return m.group(1)
    if m := _RANK.search(line):
        return "rank " + next(g for g in m.groups() if g is not None)
    return "?"


def _value(m: re.Match[str]) -> str:
    """A version (or plugin) from a match: "internal" for NCCL's own plugin when no libnccl-net.so was found."""
    if m.groupdict().get("internal"):
        return "internal"
    return next((g for g in m.groups() if g), "").strip()


def read_hosts(lines: Iterable[str]) -> HostFacts:
    """What the lines (already cut) say about the hosts; each fact once per node."""
    facts = HostFacts()
    seen: set[tuple[str, str, str]] = set()
    done: set[str] = set()  # "Using" segments already read (an INFO log repeats them on every rank)
    for n, line in enumerate(lines):
        if "Using" in line and (m := _USING.search(line)):
            who = _who(line)
            if (who + m.group(1)) not in done:
                done.add(who + m.group(1))
                for name, addr in _ONE.findall(m.group(1)):
                    if (who, name, addr) not in seen:
                        seen.add((who, name, addr))
                        facts.interfaces.append(Interface(who, name, addr, address_kind(name, addr)))
        if "ersion" in line or "torch==" in line or "Plugin" in line or "Initializing" in line or (
                "Using network" in line):
            for kind, rx in VERSION_RX.items():
                if (m := rx.search(line)) and (v := _value(m)):
                    who = _who(line)
                    if who not in facts.versions.setdefault(kind, {}):
                        facts.versions[kind][who] = v
                        facts.at[(kind, who)] = n
        if len(facts.stores) < 8 and ("onnect to" in line or "address" in line or "to host" in line) and (
                m := _STORE.search(line)) and f"{m.group(1)}:{m.group(2)}" not in facts.stores:
            facts.stores.append(f"{m.group(1)}:{m.group(2)}")
    # a version printed without a node prefix (rank 0's banner) counts only when no node printed one
    for by in facts.versions.values():
        if len(by) > 1 and "?" in by:
            del by["?"]
    return facts


def versions_line(differ: Mapping[str, Mapping[str, str]]) -> str:
    return "; ".join(f"{k}: " + ", ".join(f"{w} {v}" for w, v in sorted(by.items())) for k, by in differ.items())
