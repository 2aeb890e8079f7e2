"""The rolling probe on loopback (plugins/module_utils/ddpfix_probe.py `fork_rolling`, forks below the nodes): an
early node's task returns at once and its prober goes on; the later node's task dials the early one, hears its
connect and returns; the early prober ends by itself and gives the node lock back; the controller (ddpfix.rolling)
reads the early node's dial from the later node's record. Two nodes: 127.0.0.1 (n1, first in play order) and
127.0.0.2 (n2)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from unit_helpers import load_role_module

from ddpfix.rolling import fold_rolling
from ddpfix.rules.context import HostFacts

load_role_module("module_utils/ddpfix_nodeinfo.py", "ddpfix_nodeinfo")
pr = load_role_module("module_utils/ddpfix_probe.py", "ddpfix_probe")
lk = load_role_module("module_utils/ddpfix_lock.py", "ddpfix_lock")
pp = load_role_module("filter/ddpfix_probe_plan.py", "ddpfix_probe_plan")

ADDRS = {"n1": "127.0.0.1", "n2": "127.0.0.2"}


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _start(me: str, port: int, lock: Path, run_id: str, *, hold: float = 8.0, wait: float = 3.0) -> tuple[int, int]:
    # peers=1 over two nodes: each dials the other, and n1 (the master) is dialled on its master port by both
    plan = pp.ddpfix_probe_plan(["n1", "n2"], me, ["n1", "n2"], ADDRS, "n1", port + 7, 1, port)
    targets = [t for t in plan["targets"] if t["kind"] == "peer"]  # the peer ring only
    socks, _, err = pr.bind_listeners([(ADDRS[me], plan["port"], "peer", False)])
    assert err is None
    now = time.time()
    sources = {"peer": plan["sources"]["peer"]}
    early_targets, early_dialers = pr.rolling_split(targets, sources)
    args: dict[str, Any] = {
        "targets": targets, "expect": {"peer": plan["expect_peers"]}, "bind_address": ADDRS[me], "bind_ifname": "",
        "timeout": 1.0, "dial_until": now + hold, "hold_until": now + hold, "lock_path": str(lock),
        "run_id": run_id, "sources": sources,
        "early": {"targets": early_targets, "dialers": early_dialers, "sources": sources,
                  "later": pr.later_dialers(sources), "dial_until": now + wait,
                  "until": now + wait + 1}}
    pid, fd = pr.fork_rolling(socks, args, str(lock), run_id)
    assert lk.lend(str(lock), run_id, pid, lk.proc_start(pid), now + hold)
    return pid, fd


def _gone(pid: int, until: float) -> bool:
    while time.time() < until:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if lk.proc_start(pid) is None:
            return True
        time.sleep(0.05)
    return False


def test_rolling_probers_one_task_each_and_the_early_dial_is_read_from_the_late_listener(tmp_path: Path) -> None:
    port = _port()
    lock1, lock2 = tmp_path / "n1" / "ddpfix.lock", tmp_path / "n2" / "ddpfix.lock"
    holder = {"run_id": "run-a", "pid": os.getpid()}
    for lock in (lock1, lock2):
        lock.parent.mkdir()
        assert lk.present(str(lock), holder, 600)[1] is None
    t0 = time.time()
    pid1, fd1 = _start("n1", port, lock1, "run-a")
    early1, err = pr.wait_early(pid1, fd1)
    assert err is None and time.time() - t0 < 1.5, early1  # nothing before n1: its task returns at once
    assert early1["connects"] == [] and early1["deferred"] == [
        {"name": "n2", "address": "127.0.0.2", "port": port, "kind": "peer"}]
    assert early1["inbound_planned"] == {"peer": ["n2"]} and early1["inbound_from"] == {}
    time.sleep(0.5)  # n2's task starts later; n1's prober keeps dialling it (refused: no listener yet)
    pid2, fd2 = _start("n2", port, lock2, "run-a")
    early2, err = pr.wait_early(pid2, fd2)
    assert err is None, early2
    (c,) = early2["connects"]
    assert c["ok"] and c["name"] == "n1" and early2["deferred"] == []
    assert early2["inbound_from"] == {"peer": {"n1": "127.0.0.1"}}  # n1's prober's dial, seen by n2's listener
    # n2 is the last to meet n1's prober (the plan's `closes`) and the last node: when its task has returned, no
    # listener of the run is up (a launch started next finds its ports free)
    for addr in ("127.0.0.1", "127.0.0.2"):
        assert "ECONNREFUSED" in (pr.tcp_connect(addr, port, "", "", 1.0)["error"] or ""), addr
    # both probers end by themselves (every dial and connect done) and give their node's lock back
    assert _gone(pid1, time.time() + 5) and _gone(pid2, time.time() + 5)
    assert not lock1.exists() and not lock2.exists()
    # the controller: n1's dial to n2 from n2's record
    hosts = {n: HostFacts(n, node={"cluster": {"address": ADDRS[n], "ifname": "lo"}, "probe": {"address": ADDRS[n]}},
                          probe={**r, "address": ADDRS[n]}) for n, r in (("n1", early1), ("n2", early2))}
    folded = fold_rolling(hosts)
    (got,) = folded["n1"].probe["connects"]  # type: ignore[index]
    assert got["ok"] and got["name"] == "n2" and got["observed"] == "listener" and got["source"] == "127.0.0.1"
    assert folded["n2"] is hosts["n2"]


def test_the_last_node_does_not_wait_past_its_task_for_an_earlier_dialer_that_never_came(tmp_path: Path) -> None:
    """n1 never ran: n2's task reports its dial to n1 refused and n1's connect missing at the end of its window,
    and its prober ends then (nothing later to wait for), not at its 30 s hold."""
    lock = tmp_path / "ddpfix.lock"
    assert lk.present(str(lock), {"run_id": "r", "pid": os.getpid()}, 600)[1] is None
    t0 = time.time()
    pid, fd = _start("n2", _port(), lock, "r", hold=30.0, wait=1.0)
    early, err = pr.wait_early(pid, fd)
    assert err is None and early["inbound_from"] == {} and not early["connects"][0]["ok"]
    assert _gone(pid, t0 + 6) and not lock.exists()


def test_another_run_waits_for_a_lent_lock_and_takes_it_when_the_prober_ends(tmp_path: Path) -> None:
    """A lock lent to a rolling prober of a finished run: another run is not refused; it waits for the prober
    (which gives the lock back when it ends) and takes the lock then. A lent lock whose prober is gone is stale."""
    lock = tmp_path / "ddpfix.lock"
    old = {"run_id": "old", "controller": "elsewhere", "pid": 1}
    assert lk.present(str(lock), old, 600)[1] is None
    sleeper = os.fork()
    if sleeper == 0:
        time.sleep(1.0)
        lk.give_back(str(lock), "old", os.getpid())
        os._exit(0)
    assert lk.lend(str(lock), "old", sleeper, lk.proc_start(sleeper), time.time() + 30)
    t0 = time.time()
    got, failure = lk.present(str(lock), {"run_id": "new", "pid": os.getpid()}, 600)
    os.waitpid(sleeper, 0)
    assert failure is None and got["taken_over"] is None and 0.5 < time.time() - t0 < 10, (got, failure)
    assert json.loads(lock.read_text())["run_id"] == "new"
    # lent to a prober that is gone without giving it back: stale at once
    assert lk.lend(str(lock), "new", sleeper, "1", time.time() + 30)
    got, failure = lk.present(str(lock), {"run_id": "third", "pid": os.getpid()}, 600)
    assert failure is None and "rolling prober" in got["taken_over"]["stale"]


def test_taking_over_a_stale_lock_waits_for_its_rolling_prober_to_end(tmp_path: Path) -> None:
    """The holder of a lent lock is gone (a local controller's PID): the lock is taken over at once, and the new
    holder waits until the old run's prober (which sees the lock is no longer its run's) has ended."""
    lock = tmp_path / "ddpfix.lock"
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    old = {"run_id": "old", "pid": gone, "pid_start": "1", "boot_id": lk.boot_id(), "pidns": lk.pid_namespace()}
    assert lk.present(str(lock), old, 600)[1] is None
    prober = os.fork()
    if prober == 0:
        while json.loads(lock.read_text()).get("run_id") == "old":
            time.sleep(0.1)
        time.sleep(0.3)  # closing its listeners
        os._exit(0)
    assert lk.lend(str(lock), "old", prober, lk.proc_start(prober), time.time() + 30)
    got, failure = lk.present(str(lock), {"run_id": "new", "pid": os.getpid()}, 600)
    assert failure is None and "is gone" in got["taken_over"]["stale"]
    assert os.waitpid(prober, os.WNOHANG)[0] == prober  # ended (a zombie until reaped) before present returned


def test_a_refresh_by_the_same_run_takes_the_lock_back_from_its_prober(tmp_path: Path) -> None:
    """remediate --apply's plays refresh the lock of their run: the prober, ending later, leaves it."""
    lock = tmp_path / "ddpfix.lock"
    holder = {"run_id": "r", "pid": os.getpid()}
    assert lk.present(str(lock), holder, 600)[1] is None
    assert lk.lend(str(lock), "r", os.getpid(), lk.proc_start(os.getpid()), time.time() + 30)
    assert lk.present(str(lock), holder, 600)[1] is None  # the next play's lock task
    assert not lk.give_back(str(lock), "r", os.getpid()) and lock.exists()


def _sleeper(seconds: float) -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(seconds)
        os._exit(0)
    return pid


def test_one_machine_under_two_inventory_names_keeps_the_lock_until_its_last_prober_ends(tmp_path: Path) -> None:
    """One machine listed twice (two inventory names, one node lock): each name's facts task refreshes the run's lock
    and lends it to its own prober. The later prober ending first leaves the lock to the earlier one, which still
    reads the lock as its run's (it would stop its listeners otherwise); the last one to end removes it. Another
    run waits until the later of their deadlines."""
    lock = tmp_path / "ddpfix.lock"
    holder = {"run_id": "r", "pid": os.getpid()}
    first, second = _sleeper(30), _sleeper(30)
    try:
        now = time.time()
        assert lk.present(str(lock), holder, 600)[1] is None  # the first name's facts task
        assert lk.lend(str(lock), "r", first, lk.proc_start(first), now + 20)
        assert lk.present(str(lock), holder, 600)[1] is None  # the second name's facts task
        assert lk.lend(str(lock), "r", second, lk.proc_start(second), now + 10)
        assert lk.prober_alive(json.loads(lock.read_text())) == now + 20
        assert not lk.give_back(str(lock), "r", second)
        assert pr._ours(str(lock), "r") and [p[0] for p in json.loads(lock.read_text())["probers"]] == [first]
        assert not lk.give_back(str(lock), "r", 999999)  # not one of its probers: nothing changes
        assert lk.give_back(str(lock), "r", first) and not lock.exists()
        # a prober that ended without giving back does not keep the lock: the last live one removes it
        assert lk.present(str(lock), holder, 600)[1] is None
        assert lk.lend(str(lock), "r", first, lk.proc_start(first), now + 20)
        assert lk.lend(str(lock), "r", second, "1", now + 20)  # its start time is not second's: not running
        assert lk.give_back(str(lock), "r", first) and not lock.exists()
    finally:
        for pid in (first, second):
            os.kill(pid, 9)
            os.waitpid(pid, 0)


def test_a_refresh_between_two_probers_keeps_the_lock_after_both(tmp_path: Path) -> None:
    """A later task of the run (remediate's lock task) takes the lock back while two probers run: it stays when both
    end, and still records them meanwhile (another run that takes it over waits for them)."""
    lock = tmp_path / "ddpfix.lock"
    holder = {"run_id": "r", "pid": os.getpid()}
    first, second = _sleeper(30), _sleeper(30)
    try:
        assert lk.present(str(lock), holder, 600)[1] is None
        assert lk.lend(str(lock), "r", first, lk.proc_start(first), time.time() + 20)
        assert lk.lend(str(lock), "r", second, lk.proc_start(second), time.time() + 20)
        assert lk.present(str(lock), holder, 600)[1] is None  # the write play's lock task
        doc = json.loads(lock.read_text())
        assert not doc["lent"] and lk.prober_alive(doc) is None and len(lk.live_probers(doc)) == 2
        assert not lk.give_back(str(lock), "r", first) and not lk.give_back(str(lock), "r", second)
        assert json.loads(lock.read_text())["run_id"] == "r"
    finally:
        for pid in (first, second):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
