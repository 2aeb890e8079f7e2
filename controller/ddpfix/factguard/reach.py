"""A probe's `reach` as a node returned it: which peer it reached over which interface and address."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpfix.factguard.grammar import (
    Checker,
    Problem,
    int_in,
    is_hostname,
    one_line,
    optional,
    show_value,
)
from ddpfix.model.net import is_ip, valid_ifname


def _peer_name(v: object) -> bool:
    """A probe target's name as the plan gave it: an inventory host name or an IP address."""
    return isinstance(v, str) and (is_hostname(v) or is_ip(v))


def check_reach(ck: Checker, reach: Any) -> dict[str, dict[str, Any]]:
    """probe.reach: {ifname: {address, speed, device, reached: [peer], failed: {peer: error}}}. An entry with an
    invalid interface name or address is dropped whole (its results cannot be attributed); an invalid peer name is
    dropped from its list; an error is kept as one line."""
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(reach, Mapping):
        ck.problems.append(("probe.reach", show_value(reach), "not a mapping of interfaces"))
        return out
    for ifname, e in reach.items():
        if not ck.ok("probe.reach", ifname, valid_ifname, "not an interface name"):
            continue
        where = f"probe.reach.{ifname}"
        if not isinstance(e, Mapping):
            ck.problems.append((where, show_value(e), "not a mapping"))
            continue
        if not ck.ok(f"{where}.address", e.get("address"), is_ip, "not an IP address"):
            continue
        speed = e.get("speed")
        if not ck.ok(f"{where}.speed", speed, optional(int_in(1, 10_000_000)), "not a link speed (Mb/s)"):
            speed = None
        got, fails = e.get("reached"), e.get("failed")
        reached: list[Any] = got if isinstance(got, list) else []
        failed: Mapping[Any, Any] = fails if isinstance(fails, Mapping) else {}
        out[ifname] = {
            "address": e["address"],
            "speed": speed,
            "device": e.get("device") is True,
            "reached": [p for p in reached if ck.ok(f"{where}.reached", p, _peer_name, "not a host name or IP")],
            "failed": {p: one_line(str(why), 200) for p, why in failed.items()
                       if ck.ok(f"{where}.failed", p, _peer_name, "not a host name or IP")},
        }
    return out


def guard_reach(reach: Any) -> tuple[list[Problem], dict[str, dict[str, Any]]]:
    """(the problems of a probe's `reach` as a node returned it, the well-formed part): interface names by the
    kernel's grammar, addresses by ipaddress, peers as host names or IPs, errors as one line."""
    ck = Checker()
    return ck.problems, check_reach(ck, reach)
