"""The one place that says what an IP address, a CIDR and a Linux interface name are: small predicates and parsers
that every layer (factguard, inventory, rules, plan, ifselect, lab) uses. A leaf: imports nothing of ddpfix.

An address may carry a `%scope` suffix where a node reports one (`fe80::1%eth0`): the scope must be an interface
name or an index, else the text is no address. `scoped=True` (the default) drops it before parsing, `scoped=False`
parses the text as it is (ipaddress itself accepts an IPv6 scope, not an IPv4 one).
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The characters of a Linux interface name as ddpfix accepts one (the kernel refuses '/', whitespace and ':' in
#: new names; ':' and '@' appear in what ip(8) and /proc report for aliases and stacked devices)
_IFNAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:@+-")
IFNAMSIZ = 16  # the kernel's buffer, its NUL included: at most 15 characters


def ip(s: object, *, scoped: bool = True) -> Address | None:
    """`s` as an IP address, None when it is not one (or not a string)."""
    if not isinstance(s, str):
        return None
    text, _, scope = s.partition("%")
    if "%" in s and (not 0 < len(scope) < IFNAMSIZ or not set(scope) <= _IFNAME_CHARS):
        return None  # a scope is an interface name or an index: with anything else the text is no address
    try:
        return ipaddress.ip_address(text if scoped else s)
    except ValueError:
        return None


def is_ip(s: object, *, scoped: bool = True) -> bool:
    return ip(s, scoped=scoped) is not None


def is_loopback(s: object) -> bool:
    a = ip(s)
    return a is not None and a.is_loopback


def is_link_local(s: object) -> bool:
    a = ip(s)
    return a is not None and a.is_link_local


def network(s: object, *, strict: bool = False) -> Network | None:
    """`s` as a network ('a.b.c.d/n'; with strict, no host bits), None when it is not one (or not a string)."""
    if not isinstance(s, str):
        return None
    try:
        return ipaddress.ip_network(s, strict=strict)
    except ValueError:
        return None


def is_cidr(s: object) -> bool:
    return network(s) is not None


def in_network(addr: object, net: Network | None, *, scoped: bool = True) -> bool:
    """Whether `addr` (a string) is an address inside `net`; False when either is missing or not one."""
    a = ip(addr, scoped=scoped)
    return a is not None and net is not None and a in net


def valid_ifname(s: object) -> bool:
    """A Linux interface name: 1-15 characters of _IFNAME_CHARS, not '.' or '..'."""
    return isinstance(s, str) and 0 < len(s) < IFNAMSIZ and set(s) <= _IFNAME_CHARS and s not in (".", "..")
