"""The node-side prober (plugins/module_utils/ddpfix_probe.py) on loopback: forked listener + dialer, retries
until a late peer's listener is up, detached mode collected and stopped; and the controller's reading of failed
connects (checks.probe_not_evaluated) and of a host's returned facts (audit.host_facts)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from conftest import Sim, load_role_module

from ddpfix.audit import host_facts
from ddpfix.checks import probe_not_evaluated

load_role_module("module_utils/ddpfix_nodeinfo.py", "ddpfix_nodeinfo")  # imported by ddpfix_probe
pr = load_role_module("module_utils/ddpfix_probe.py", "ddpfix_probe")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _args(targets: list[dict[str, Any]], expect: dict[str, int], wait: float = 3.0, hold: float = 5.0) -> dict[str, Any]:
    now = time.time()
    return {"targets": targets, "expect": expect, "bind_address": "127.0.0.1", "bind_ifname": "", "timeout": 1.0,
                "dial_until": now + wait, "hold_until": now + hold, "lock_path": "", "run_id": ""}


def test_inline_prober_dials_itself_and_counts_inbound() -> None:
    port = _free_port()
    socks, held, err = pr.bind_listeners([("127.0.0.1", port, "peer", False)])
    assert err is None and held == [("127.0.0.1", port, "peer")]
    pid, fd = pr.fork_prober(socks, _args([{"name": "me", "address": "127.0.0.1", "port": port, "kind": "peer"}],
                                          {"peer": 1}))
    result, error = pr.wait_inline(pid, fd)
    assert error is None and result["inbound"] == {"peer": 1}
    (c,) = result["connects"]
    assert c["ok"] and c["attempts"] == 1 and result["up_at"] <= c["last_try"] <= result["down_at"]


def _dial_late_listener(delay: float) -> tuple[dict[str, Any], float]:
    """A prober dialling a port whose listener comes up `delay` s later: its connect result, and when it was up."""
    late = _free_port()
    up: list[float] = []

    def start_late() -> None:
        time.sleep(delay)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", late))
        s.listen(8)
        up.append(time.time())
        c, _ = s.accept()
        c.close()
        s.close()

    th = threading.Thread(target=start_late)
    th.start()
    pid, fd = pr.fork_prober([], _args([{"name": "late", "address": "127.0.0.1", "port": late, "kind": "peer"}], {}))
    result, _ = pr.wait_inline(pid, fd)
    th.join()
    (c,) = result["connects"]
    return c, up[0]


def test_refused_dials_are_retried_until_the_late_listener_is_up() -> None:
    c, _ = _dial_late_listener(0.8)
    assert c["ok"] and c["attempts"] > 1, c


def test_refused_until_the_deadline_is_reported_with_its_attempts() -> None:
    pid, fd = pr.fork_prober([], _args([{"name": "x", "address": "127.0.0.1", "port": _free_port(), "kind": "peer"}],
                                       {}, wait=0.6, hold=1.0))
    result, _ = pr.wait_inline(pid, fd)
    (c,) = result["connects"]
    assert not c["ok"] and "ECONNREFUSED" in c["error"] and c["attempts"] >= 2


def test_a_listener_that_comes_up_a_moment_later_is_found_at_once() -> None:
    """Refused dials are retried after 25, 50, 100, then 200 ms: a peer 30 ms late is dialled within ~50 ms of it."""
    c, up = _dial_late_listener(0.03)
    assert c["ok"] and 2 <= c["attempts"] <= 5, c
    assert c["last_try"] - up < 0.15, (c, up)  # was up to 0.2 s with a fixed 200 ms interval


def test_detached_prober_is_collected_and_stopped(tmp_path: Path) -> None:
    port = _free_port()
    socks, _, _ = pr.bind_listeners([("127.0.0.1", port, "peer", False)])
    path = str(tmp_path / "result.json")
    # expects an inbound connect that never comes: it would hold for 30 s, the collector stops it
    pid, fd = pr.fork_prober(socks, _args([], {"peer": 1}, wait=30, hold=30), result_path=path)
    assert fd is None
    start = pr.proc_start(pid)
    t0 = time.time()
    result, error = pr.collect_detached(pid, start, path, 0.3)
    assert error is None and result["inbound"] == {"peer": 0} and time.time() - t0 < 5
    assert not os.path.exists(path)
    s = socket.socket()
    assert s.connect_ex(("127.0.0.1", port)) != 0  # its listener is gone
    s.close()


def test_failed_connect_to_a_peer_that_did_not_run_is_not_evaluated(sim: Sim) -> None:
    sim.set_unreachable("node3", "unreachable")
    ctx = sim.context()
    c = {"name": "node3", "address": "192.168.77.13", "port": 40003, "kind": "peer", "ok": False,
         "error": "connection refused (ECONNREFUSED)"}
    assert probe_not_evaluated(ctx, c) == "node3 was not audited"


def test_refused_before_the_listener_was_up_is_not_evaluated_but_a_reject_is(sim: Sim) -> None:
    sim.node("node3")["probe"].update(up_at=100.0, down_at=110.0)
    ctx = sim.context()
    c = {"name": "node3", "address": "192.168.77.13", "port": 40003, "kind": "peer", "ok": False,
         "error": "connection refused (ECONNREFUSED)", "last_try": 99.0}
    assert "not up" in (probe_not_evaluated(ctx, c) or "")
    assert probe_not_evaluated(ctx, {**c, "last_try": 105.0}) is None
    assert probe_not_evaluated(ctx, {**c, "error": "no route to host (EHOSTUNREACH)"}) is None


def test_host_facts_reads_the_probe_from_inside_ddpfix_node(sim: Sim) -> None:
    node = dict(sim.node("node1"), probe={**sim.node("node1")["probe"], **sim.probe("node1"), "checked": 2},
                now_elapsed=1.5)
    h = host_facts("node1", node, window=(10.0, 20.0))
    assert h.reachable and h.node == node and h.window == (11.5, 20.0)
    assert h.probe is not None and {k: h.probe[k] for k in ("connects", "resolve", "routes", "checked")} == \
        {**sim.probe("node1"), "checked": 2}
    assert not host_facts("node2", None, error="unreachable", unreachable=True).reachable
