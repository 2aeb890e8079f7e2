"""ddpfix.model.net: the one definition of an IP address, a CIDR and an interface name, and the callers that use it
(the inventory contract, the fact guard, the lab) accepting and refusing the same names."""

from __future__ import annotations

import ipaddress

import pytest

from ddpfix.ansible.collection import module_utils
from ddpfix.errors import DdpfixError
from ddpfix.factguard.facts import guard_facts
from ddpfix.inventory.contract import check_ifname
from ddpfix.lab.model import LabError, validate_ifname
from ddpfix.model import net

#: (name, a valid Linux interface name for the controller)
IFNAMES = [
    ("eth0", True), ("ens1f0np0", True), ("bond0.100", True), ("ib0:1", True), ("veth1@if2", True),
    ("br-0a1b2c3d4e5f", True), ("a", True), ("x" * 15, True), ("gre+", True), ("_x", True), ("0eth", True),
    ("x" * 16, False), ("", False), (".", False), ("..", False), ("eth 0", False), ("eth0/1", False),
    ("eth0\n", False), ("eth0;", False), ("$(id)", False), ("ethé", False), ("eth\t0", False), ("eth0%", False),
]


@pytest.mark.parametrize(("name", "ok"), IFNAMES)
def test_one_interface_name_rule(name: str, ok: bool) -> None:
    assert net.valid_ifname(name) is ok
    # the inventory's ddp_socket_ifname accepts the same names
    try:
        check_ifname(name, "node1")
        accepted = True
    except DdpfixError:
        accepted = False
    assert accepted is ok
    # a node's facts: the same rule (cluster.ifname)
    assert any(p[0] == "cluster.ifname" for p in guard_facts({"cluster": {"ifname": name}})[0]) is not ok


@pytest.mark.parametrize(("name", "ok"), IFNAMES)
def test_the_lab_narrows_the_rule(name: str, ok: bool) -> None:
    """A name the lab creates is a valid interface name, with a letter first and none of ':', '@', '+', never lo."""
    try:
        validate_ifname(name)
        lab_ok = True
    except LabError:
        lab_ok = False
    assert lab_ok is (ok and name[0].isalpha() and not set(name) & set(":@+") and name != "lo")
    assert not (lab_ok and not ok)


def test_addresses() -> None:
    assert net.ip("10.0.0.1") == ipaddress.ip_address("10.0.0.1")
    assert net.ip("fe80::1%eth0") == ipaddress.ip_address("fe80::1")
    assert net.ip("10.0.0.1%eth0") == ipaddress.ip_address("10.0.0.1")
    assert net.ip("10.0.0.1%eth0", scoped=False) is None  # ipaddress takes a scope on IPv6 only
    assert net.ip("fe80::1%eth0", scoped=False) is not None
    assert [net.ip(x) for x in ("", "10.0.0", "node1", None, 10, b"10.0.0.1")] == [None] * 6
    assert net.is_ip("::1") and not net.is_ip("::1::")
    assert net.is_loopback("127.0.1.1") and net.is_loopback("::1") and not net.is_loopback("10.0.0.1")
    assert not net.is_loopback("localhost") and not net.is_loopback(None)
    assert net.is_link_local("169.254.3.4") and net.is_link_local("fe80::1%eth0") and not net.is_link_local("x")


def test_networks() -> None:
    assert net.network("10.0.0.5/24") == ipaddress.ip_network("10.0.0.0/24")
    assert net.network("10.0.0.5/24", strict=True) is None
    assert net.network("10.0.0.0/24", strict=True) is not None
    assert [net.network(x) for x in ("10.0.0.0/33", "x", "", None)] == [None] * 4
    assert net.is_cidr("fd00::/64") and not net.is_cidr("10.0.0.0/")
    lan = net.network("10.0.0.0/24")
    assert net.in_network("10.0.0.9", lan) and net.in_network("10.0.0.9%eth0", lan)
    assert not net.in_network("10.0.0.9%eth0", lan, scoped=False)
    assert not net.in_network("10.0.1.9", lan) and not net.in_network("fd00::1", lan)
    assert not net.in_network(None, lan) and not net.in_network("10.0.0.9", None) and not net.in_network("x", lan)


def test_the_probes_address_test_on_the_node_agrees() -> None:
    """module_utils ddpfix_probe stays standalone (the node's Python): its `_is_ip` (inet_pton) accepts what the
    controller's is_ip(scoped=False) accepts, but a scoped IPv6 address, which it resolves as a name instead."""
    node_is_ip = module_utils("ddpfix_probe")._is_ip
    table = ["10.0.0.1", "010.0.0.1", "1.2.3", "1.2.3.256", "::1", "::", "::ffff:1.2.3.4", "1::2::3", "", " 1.2.3.4",
             "1.2.3.4 ", "node1", "1.2.3.4%eth0", "fe80::1%eth0"]
    assert [s for s in table if node_is_ip(s) != net.is_ip(s, scoped=False)] == ["fe80::1%eth0"]


@pytest.mark.parametrize("text", ["192.168.77.11%}{{ 7*191 }}", "fe80::1%$(id)", "fe80::1%", "10.0.0.1%a b",
                                  "fe80::1%" + "x" * 16])
def test_a_scope_that_is_no_interface_makes_no_address(text: str) -> None:
    # found by test_ifreach's hypothesis run: a node's "peer" with a template after `%` passed as an address
    assert not net.is_ip(text) and not net.is_ip(text, scoped=False)


def test_a_real_scope_is_kept_or_dropped() -> None:
    assert net.is_ip("fe80::1%eth0") and net.is_ip("fe80::1%eth0", scoped=False) and net.is_ip("fe80::1%2")
