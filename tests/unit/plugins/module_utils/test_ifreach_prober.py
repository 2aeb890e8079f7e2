"""The interface reach probe on the node side (plugins/module_utils/ddpfix_probe.py), with real sockets on loopback:
which interfaces are candidates, that a node with one candidate dials nothing more, that every other candidate dials
each peer target once, bound to its device, and what counts as reached; and that one dialer's extra connects never
count as another dialer's inbound."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from test_prober import _free_port
from unit_helpers import load_role_module

load_role_module("module_utils/ddpfix_nodeinfo.py", "ddpfix_nodeinfo")  # imported by ddpfix_probe
pr = load_role_module("module_utils/ddpfix_probe.py", "ddpfix_probe")


def _iface(name: str, index: int, *addrs: str, flags: tuple[str, ...] = ("UP", "LOWER_UP"),
           kind: str = "ether", operstate: str = "UP") -> dict[str, Any]:
    return {"name": name, "index": index, "flags": list(flags), "operstate": operstate, "kind": kind,
            "addrs": [{"family": "inet6" if ":" in a else "inet", "local": a.split("/")[0],
                       "prefixlen": int(a.split("/")[1])} for a in addrs]}


def test_candidates_are_up_ipv4_not_loopback_nor_link_local(tmp_path: Path) -> None:
    (tmp_path / "class/net/eth1").mkdir(parents=True)
    (tmp_path / "class/net/eth1/speed").write_text("25000\n")
    (tmp_path / "class/net/eth0").mkdir(parents=True)
    (tmp_path / "class/net/eth0/speed").write_text("-1\n")
    ifaces = [
        _iface("eth1", 3, "192.168.5.2/24", "10.0.0.7/24"),
        _iface("lo", 1, "127.0.0.1/8", kind="loopback", flags=("LOOPBACK", "UP")),
        _iface("eth0", 2, "10.0.0.2/24"),
        _iface("usb0", 4, "169.254.3.12/16"),  # link-local only: never a cluster address
        _iface("eth2", 5, "10.0.0.9/24", flags=("BROADCAST",), operstate="DOWN"),
        _iface("ib0", 6, "fd00::2/64"),  # no IPv4
    ]
    got = pr.reach_candidates(ifaces, "10.0.0.0/24", sysfs=str(tmp_path))
    assert got == [{"ifname": "eth0", "address": "10.0.0.2", "speed": None},
                   {"ifname": "eth1", "address": "10.0.0.7", "speed": 25000}]  # the CIDR address first
    assert pr.reach_extras(got, "eth0") == [got[1]]
    assert pr.reach_extras(got[:1], "eth0") == []  # one candidate: nothing more to dial


def _run(targets: list[dict[str, Any]], via: list[dict[str, Any]], expect: dict[str, int] | None = None,
         socks: list[Any] | None = None) -> dict[str, Any]:
    now = time.time()
    pid, fd = pr.fork_prober(socks or [], {
        "targets": targets, "expect": expect or {}, "bind_address": "127.0.0.1", "bind_ifname": "lo",
        "timeout": 1.0, "dial_until": now + 3, "hold_until": now + 5, "lock_path": "", "run_id": "", "via": via})
    result, error = pr.wait_inline(pid, fd)
    assert error is None
    return dict(result)


@pytest.mark.skipif(os.geteuid() != 0, reason="SO_BINDTODEVICE needs CAP_NET_RAW")
def test_each_other_candidate_dials_each_peer_once_bound_to_its_device() -> None:
    """node2 listens; node3's port is closed (its host refuses: reached); `far` is only reachable off loopback:
    bound to lo, the route lookup finds nothing and no packet leaves (ENETUNREACH: failed)."""
    port, closed = _free_port(), _free_port()
    listener = socket.socket()
    listener.bind(("127.0.0.2", port))
    listener.listen(16)
    try:
        targets = [{"name": "node1", "address": "127.0.0.1", "port": 29500, "kind": "master"},
                   {"name": "node2", "address": "127.0.0.2", "port": port, "kind": "peer"},
                   {"name": "node3", "address": "127.0.0.3", "port": closed, "kind": "peer"}]
        via = [{"ifname": "lo", "address": "127.0.0.9", "speed": None},
               {"ifname": "lo", "address": "127.0.0.9", "speed": None}]
        r = _run(targets, via[:1])
        reach = r["reach"]
        assert set(reach) == {"lo"}  # the main interface and the extra share the name here; both rows counted
        assert reach["lo"]["device"] is True
        assert sorted(reach["lo"]["reached"]) == ["node2", "node2", "node3", "node3"]
        assert reach["lo"]["failed"] == {}
        # only peer targets are dialled from the other candidates: (candidates - 1) * k connects more
        accepted = 0
        listener.settimeout(0.2)
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                break
            accepted += 1
            c.close()
        assert accepted == 2, accepted  # the main dial and one extra dial to node2
        far = _run([{"name": "far", "address": "192.0.2.1", "port": port, "kind": "peer"}],
                   [{"ifname": "lo", "address": "127.0.0.9", "speed": None}])
        assert far["reach"]["lo"]["reached"] == [] and "far" in far["reach"]["lo"]["failed"]
    finally:
        listener.close()


def test_no_reach_without_other_candidates() -> None:
    port = _free_port()
    r = _run([{"name": "node2", "address": "127.0.0.1", "port": port, "kind": "peer"}], [])
    assert "reach" not in r


def test_reached_means_the_peers_host_answered() -> None:
    assert pr.reached({"ok": True, "error": None})
    assert pr.reached({"ok": False, "error": "connection refused (ECONNREFUSED)"})
    assert not pr.reached({"ok": False, "error": "timed out after 1.0s"})
    assert not pr.reached({"ok": False, "error": "no route to host (ICMP host prohibited/unreachable) (EHOSTUNREACH)"})


def test_one_dialers_extra_connects_count_once() -> None:
    """node3 dials from its cluster address and (the reach probe) from its management address, which its name
    resolves to: one dialer, counted once, so the listener keeps waiting for node2's connect."""
    dialers = pr.source_dialers({"peer": [{"name": "node3", "address": "10.0.0.3"},
                                          {"name": "node2", "address": "10.0.0.2"}]}, "10.0.0.1",
                                resolver=lambda n: {"node3": ["192.168.0.3"], "node2": ["192.168.0.2"]}[n])
    assert dialers is not None
    assert pr.inbound_count(["10.0.0.3", "192.168.0.3"], dialers["peer"]) == 1
    assert pr.inbound_count(["10.0.0.3", "192.168.0.3", "10.0.0.2"], dialers["peer"]) == 2
    # two dialers behind one address (NAT) still count twice
    nat = pr.source_dialers({"peer": [{"name": "a", "address": "10.0.0.5"}, {"name": "b", "address": "10.0.0.5"}]},
                            "", resolver=lambda n: [])
    assert nat is not None and pr.inbound_count(["10.0.0.5", "10.0.0.5"], nat["peer"]) == 2


def test_a_candidate_not_dialled_neither_reached_nor_failed() -> None:
    targets = [{"name": "node2", "address": "10.0.0.2", "port": 1, "kind": "peer"},
               {"name": "node3", "address": "10.0.0.3", "port": 1, "kind": "peer"}]
    connects = [{"ok": True, "error": None}, {"ok": False, "error": "connection refused (ECONNREFUSED)"}]
    via = [{"ifname": "iso0", "address": "10.0.0.99", "speed": None}]
    extra = [[({"ok": False, "error": "timed out after 2.0s"}, True)], [None]]  # the prober stopped before node3
    got = pr.reach_result(targets, connects, extra, via, "eth0", "10.0.0.1", 25000, True)
    assert got == {"eth0": {"address": "10.0.0.1", "speed": 25000, "device": True, "reached": ["node2", "node3"],
                            "failed": {}},
                   "iso0": {"address": "10.0.0.99", "speed": None, "device": True, "reached": [],
                            "failed": {"node2": "timed out after 2.0s"}}}
