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

import pytest
from unit_helpers import ROOT, Sim, load_role_module

from ddpfix.audit import host_facts
from ddpfix.rules.probes import probe_not_evaluated

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


def test_a_dials_time_wait_port_is_free_for_the_next_runs_listener() -> None:
    """A dial's ephemeral port lingers in TIME_WAIT after the prober closes it; the next run's random probe port
    may be that port (same range), and its listener must still bind (a CI run failed on "probe listener could not
    start on this node": a TIME_WAIT of a socket without SO_REUSEADDR blocks every later bind of its port)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    assert pr.tcp_connect("127.0.0.1", srv.getsockname()[1], "127.0.0.1", "", 1.0)["ok"]
    conn, (_, dial_port) = srv.accept()
    time.sleep(0.1)  # the prober closed first: its side is in TIME_WAIT
    conn.close()
    srv.close()
    socks, held, err = pr.bind_listeners([("127.0.0.1", dial_port, "peer", False)])
    assert err is None and held == [("127.0.0.1", dial_port, "peer")], err
    for s, _ in socks:
        s.close()


def _held_port() -> tuple[socket.socket, socket.socket, socket.socket, int]:
    """A port of 127.0.0.1 held by a live connection of this node's own (a dial without SO_REUSEADDR, as most
    programs dial): no listener on it, and no listener can bind it. Returns (server, dialer, accepted, port)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    d = socket.socket()
    d.connect(srv.getsockname())
    c, _ = srv.accept()
    return srv, d, c, d.getsockname()[1]


def test_a_probe_port_held_by_a_connection_moves_to_an_alternate_that_the_dialers_find() -> None:
    """The probe port is random in the ephemeral range, where the node's own outgoing connections get theirs: a busy
    node may hold it. Its listener takes the plan's next alternate, and a dialer refused on the probe port tries the
    alternates at once (the audit said "probe listener could not start on this node", a false error)."""
    held = _held_port()
    port = held[3]
    try:
        socks, got, err = pr.bind_listeners([("127.0.0.1", port, "peer", False, [port + 1, port + 2])])
        if err is not None and f"{port + 1}" in err:  # the alternates are busy on this machine too: rare
            pytest.skip(f"ports {port + 1} and {port + 2} are in use on this machine: {err}")
        assert err is None and got == [("127.0.0.1", port + 1, "peer")], err
        pid, fd = pr.fork_prober(socks, _args([{"name": "me", "address": "127.0.0.1", "port": port,
                                                "alt_ports": [port + 1, port + 2], "kind": "peer"}], {"peer": 1}))
        result, error = pr.wait_inline(pid, fd)
        assert error is None and result["inbound"] == {"peer": 1}
        (c,) = result["connects"]
        assert c["ok"] and c["port"] == port + 1 and c["attempts"] == 2, c
    finally:
        for s in held[:3]:
            s.close()


def test_without_a_free_alternate_the_listener_names_every_port_it_tried() -> None:
    held = [_held_port() for _ in range(3)]
    a, b, c = (h[3] for h in held)
    try:
        socks, got, err = pr.bind_listeners([("127.0.0.1", a, "peer", False, [b, c])])
        assert socks == [] and got == [] and err == f"cannot listen on 127.0.0.1:{a} (and {b}, {c}): Address already in use"
    finally:
        for h in held:
            for s in h[:3]:
                s.close()


def test_a_refused_peer_with_no_listener_anywhere_is_reported_on_its_probe_port() -> None:
    port = _free_port()
    pid, fd = pr.fork_prober([], _args([{"name": "x", "address": "127.0.0.1", "port": port,
                                         "alt_ports": [_free_port()], "kind": "peer"}], {}, wait=0.4, hold=0.8))
    result, _ = pr.wait_inline(pid, fd)
    (c,) = result["connects"]
    assert not c["ok"] and "ECONNREFUSED" in c["error"] and c["port"] == port and c["attempts"] >= 4, c


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
    # (1 attempt: under load the prober's fork took longer than the 30 ms and the listener was up first)
    assert c["ok"] and 1 <= c["attempts"] <= 5, c
    assert c["last_try"] - up < 0.15, (c, up)  # was up to 0.2 s with a fixed 200 ms interval


def test_detached_prober_is_collected_and_stopped(tmp_path: Path) -> None:
    port = _free_port()
    socks, _, _ = pr.bind_listeners([("127.0.0.1", port, "peer", False)])
    path = pr.result_dir(str(tmp_path))  # a private directory: mkdtemp, 0700, random name
    d = Path(path).parent
    assert d.parent == tmp_path and d.name.startswith("ddpfix-probe-") and oct(d.stat().st_mode & 0o777) == "0o700"
    # expects an inbound connect that never comes: it would hold for 30 s, the collector stops it
    pid, fd = pr.fork_prober(socks, _args([], {"peer": 1}, wait=30, hold=30), result_path=path)
    assert fd is None
    start = pr.proc_start(pid)
    t0 = time.time()
    result, error = pr.collect_detached(pid, start, path, 0.3)
    assert error is None and result["inbound"] == {"peer": 0} and time.time() - t0 < 5
    assert not os.path.exists(path) and not d.exists()  # the file and its directory are removed
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


# ---------------------------------------------------------------- issue 20, item 5: probers that cannot be fooled


def test_only_connects_from_the_planned_dialers_count() -> None:
    """A connect from an address no planned dialer has (another local address here) is closed and listed, never
    counted: the prober keeps waiting for its real peer and stops at its deadline."""
    port = _free_port()
    socks, _, _ = pr.bind_listeners([("0.0.0.0", port, "peer", False)])
    args = _args([], {"peer": 1}, wait=1.5, hold=1.5)
    args["sources"] = {"peer": [{"name": "node9", "address": "127.0.0.9"}]}
    pid, fd = pr.fork_prober(socks, args)
    time.sleep(0.3)
    foreign = socket.socket()
    foreign.bind(("127.0.0.2", 0))
    foreign.connect(("127.0.0.1", port))
    foreign.close()
    t0 = time.time()
    result, error = pr.wait_inline(pid, fd)
    assert error is None and result["inbound"] == {"peer": 0}, result
    assert result["ignored_inbound"] == {"peer": {"count": 1, "sources": ["127.0.0.2"]}}
    assert time.time() - t0 > 0.8  # not stopped by the foreign connect: it waited for its deadline
    # the planned dialer's connect counts, and ends the prober at once
    socks, _, _ = pr.bind_listeners([("0.0.0.0", port, "peer", False)])
    args = _args([], {"peer": 1}, wait=10, hold=10)
    args["sources"] = {"peer": [{"name": "node9", "address": "127.0.0.9"}]}
    pid, fd = pr.fork_prober(socks, args)
    time.sleep(0.3)
    good = socket.socket()
    good.bind(("127.0.0.9", 0))
    good.connect(("127.0.0.1", port))
    good.close()
    t0 = time.time()
    result, _ = pr.wait_inline(pid, fd)
    assert result["inbound"] == {"peer": 1} and result["ignored_inbound"] == {} and time.time() - t0 < 3


def test_allowed_sources_from_addresses_names_and_the_node_itself() -> None:
    table = {"node2": ["10.0.0.2"], "node3.example": ["10.0.0.3", "fd00::3"]}
    got = pr.allowed_sources({"peer": [{"name": "node2", "address": "192.0.2.2"},
                                       {"name": "x", "address": "node3.example"}],
                              "master": []}, "10.0.0.1", resolver=lambda n: table.get(n, []))
    assert got == {"peer": {"10.0.0.1", "192.0.2.2", "10.0.0.2", "10.0.0.3", "fd00::3"}, "master": {"10.0.0.1"}}
    assert pr.allowed_sources(None, "10.0.0.1") is None  # no plan of dialers: every source counts (as before)
    # hostile plan values are only compared, never used otherwise
    assert pr.allowed_sources({"peer": [{"name": "$(touch /x)", "address": "{{ 7*191 }}"}]}, "",
                              resolver=lambda n: []) == {"peer": set()}


def test_probe_plan_names_the_dialers_of_each_listener() -> None:
    pp = load_role_module("filter/ddpfix_probe_plan.py", "ddpfix_probe_plan")
    order = ["n1", "n2", "n3", "n4"]
    addrs = {h: f"10.0.0.{i + 1}" for i, h in enumerate(order)}
    p3 = pp.ddpfix_probe_plan(order, "n3", order, addrs, "n1", 29500, 2, 45678)
    # n3 dials n4 and n1 (its 2 ring successors); n2 and n1 (its 2 predecessors) dial n3
    assert [t["name"] for t in p3["targets"] if t["kind"] == "peer"] == ["n4", "n1"]
    assert p3["sources"] == {"peer": [{"name": "n2", "address": "10.0.0.2"}, {"name": "n1", "address": "10.0.0.1"}],
                             "master": []}
    p1 = pp.ddpfix_probe_plan(order, "n1", order, addrs, "n1", 29500, 2, 45678)
    assert [d["name"] for d in p1["sources"]["master"]] == order and p1["expect_master"] == 4
    # the listener's alternates (its node may hold the probe port): the next ports, never the master port, and the
    # same in every peer target that dials it
    assert p3["alt_ports"] == [45679, 45680] and {tuple(t["alt_ports"]) for t in p3["targets"] if t["kind"] == "peer"} == {
        (45679, 45680)}
    assert pp.alternate_ports(29499, 29500) == [29501, 29502] and pp.alternate_ports(65535, 1024) == [1025, 1026]
    for me in order:  # every planned dial has its dialer among the target's sources
        for t in pp.ddpfix_probe_plan(order, me, order, addrs, "n1", 29500, 2, 45678)["targets"]:
            src = pp.ddpfix_probe_plan(order, t["name"], order, addrs, "n1", 29500, 2, 45678)["sources"][t["kind"]]
            assert {"name": me, "address": addrs[me]} in [{k: d[k] for k in ("name", "address")} for d in src]
            # play order: a later host is marked on both sides (the rolling probe, forks below the hosts)
            later = order.index(t["name"]) > order.index(me)
            assert bool(t.get("after")) == later
            assert [bool(d.get("after")) for d in src if d["name"] == me] == [not later and t["name"] != me]


def test_inline_prober_ends_when_its_parent_is_gone() -> None:
    """The module process that forked an inline prober dies (its SSH session went with the controller): the
    prober ends within about a second, not at its deadline, and its listener is gone."""
    import subprocess
    import sys

    port = _free_port()
    code = (
        "import sys, time\n"
        "from unit_helpers import load_role_module\n"
        "load_role_module('module_utils/ddpfix_nodeinfo.py', 'ddpfix_nodeinfo')\n"
        "pr = load_role_module('module_utils/ddpfix_probe.py', 'ddpfix_probe')\n"
        "port = int(sys.argv[1])\n"
        "socks, _, _ = pr.bind_listeners([('127.0.0.1', port, 'peer', False)])\n"
        "now = time.time()\n"
        "pid, fd = pr.fork_prober(socks, dict(targets=[], expect={'peer': 1}, bind_address='127.0.0.1',\n"
        "    bind_ifname='', timeout=1.0, dial_until=now + 60, hold_until=now + 60, lock_path='', run_id=''))\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    here = ROOT / "tests" / "unit"  # the child imports unit_helpers
    p = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True, cwd=here,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(here), *sys.path])})
    assert p.stdout is not None
    child = int(p.stdout.readline())
    assert pr.proc_start(child) is not None
    p.kill()
    p.wait()
    t0 = time.time()

    def running() -> bool:  # a zombie (ended, not reaped yet by whoever adopted it) holds no socket
        try:
            return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    while running() and time.time() - t0 < 20:
        time.sleep(0.05)
    # it checks every 0.5 s (its deadline here is 60 s): a few seconds at most, even on a loaded machine
    assert time.time() - t0 < 8, "the prober outlived its parent"
    s = socket.socket()
    assert s.connect_ex(("127.0.0.1", port)) != 0
    s.close()


def test_prober_life_is_capped_whatever_it_is_asked(monkeypatch: Any) -> None:
    """An hour asked for (a plan from a hostile or broken controller): the prober ends at MAX_HOLD (120 s; 0.5 s
    here) even though the inbound connect it waits for never comes."""
    assert pr.MAX_HOLD == 120
    monkeypatch.setattr(pr, "MAX_HOLD", 0.5)
    socks, _, _ = pr.bind_listeners([("127.0.0.1", _free_port(), "peer", False)])
    t0 = time.time()
    result = pr.prober(socks, [], {"peer": 1}, "127.0.0.1", "", 1.0, t0 + 3600, t0 + 3600, "", "")
    assert time.time() - t0 < 1.5 and result["inbound"] == {"peer": 0}


def test_result_file_is_created_exclusively_without_following_links(tmp_path: Path) -> None:
    path = pr.result_dir(str(tmp_path))
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    Path(f"{path}.{os.getpid()}.tmp").symlink_to(victim)  # planted at the temporary name
    import pytest

    with pytest.raises(FileExistsError):
        pr.write_result(path, b"{}")
    assert victim.read_text() == "keep\n"
    os.unlink(f"{path}.{os.getpid()}.tmp")
    pr.write_result(path, b'{"ok": 1}')
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    # the collector refuses any path that is not such a private directory of ours
    assert "not a ddpfix prober result path" in pr.collect_detached(0, "", str(victim), 0)[1]
    shared = tmp_path / "ddpfix-probe-shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert "not a private directory" in pr.collect_detached(0, "", str(shared / "result.json"), 0)[1]
    assert pr.collect_detached(0, "", path, 0) == ({"ok": 1}, None) and not Path(path).parent.exists()
