"""One run at a time (issue 9, item 5): the controller lock, the node lock module, run-dir pruning; and the
--pin-ifnames target choice (item 6) on recorded `ip -j -d addr show` output."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from unit_helpers import ROOT, load_role_module, nodeinfo, recorded

from ddpfix import lock as ddlock
from ddpfix.ansible.results import HostResult, TaskResult, changed_before
from ddpfix.ansible.rundirs import LIVE_LOCK, new_run_dir, prune_runs, release_run_dir
from ddpfix.cli import cli
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.remediate import pin_target
from ddpfix.rules import firewall as firewall_rules

ni = nodeinfo()


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


# ---------------------------------------------------------------- controller lock


def test_second_lock_on_the_same_cluster_names_the_holder() -> None:
    first = ddlock.controller_lock(["10.0.0.2", "10.0.0.1", "10.0.0.3"])
    try:
        with pytest.raises(DdpfixError) as exc:
            ddlock.controller_lock(["10.0.0.3", "10.0.0.1", "10.0.0.2", "10.0.0.1"])  # same nodes, other order
        assert exc.value.code == ExitCode.LOCKED
        msg = str(exc.value)
        assert f"pid {os.getpid()}" in msg and ddlock.STARTED in msg and ddlock.RUN_ID in msg
        assert ddlock.HELD_TEXT in msg and "3 nodes: 10.0.0.1, 10.0.0.2, 10.0.0.3" in msg
        assert msg.endswith("this run changed nothing")
        assert json.loads(first.path.read_text())["pid"] == os.getpid()
        assert os.environ[ddlock.HELD_ENV] == ddlock.cluster_key(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        ddlock.controller_lock(["10.0.0.1", "10.0.0.2"]).release()  # another cluster: its own lock
    finally:
        first.release()
    assert ddlock.HELD_ENV not in os.environ
    ddlock.controller_lock(["10.0.0.1", "10.0.0.2", "10.0.0.3"]).release()  # released: free again


def test_cluster_key_ignores_order_duplicates_and_case() -> None:
    assert ddlock.cluster_key(["B.example", "a.example"]) == ddlock.cluster_key(["a.example", "b.example", "A.example"])
    assert ddlock.cluster_key(["a"]) != ddlock.cluster_key(["a", "b"])


def test_lock_held_by_another_process_and_gone_with_it() -> None:
    code = ("import sys, time; from ddpfix import lock; lock.controller_lock(sys.argv[1:]); "
            "print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, "n1", "n2"], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        with pytest.raises(DdpfixError) as exc:
            ddlock.controller_lock(["n2", "n1"])
        assert exc.value.code == ExitCode.LOCKED and f"pid {p.pid}" in str(exc.value)
    finally:
        p.kill()
        p.wait()
    ddlock.controller_lock(["n1", "n2"]).release()  # the holder died (kill -9): no stale lock


def _flock_then_write(path: Path, delay: float, holder: dict[str, Any]) -> subprocess.Popen[str]:
    """Another process that takes the lock file's flock and writes who it is `delay` s later (as a run does between
    its flock and its pwrite, stretched)."""
    code = ("import fcntl, json, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.ftruncate(fd, 0)\n"
            "print('locked', flush=True)\n"
            "time.sleep(float(sys.argv[2]))\n"
            "os.pwrite(fd, sys.argv[3].encode(), 0)\n"
            "time.sleep(30)\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", code, str(path), str(delay), json.dumps(holder)],
                            stdout=subprocess.PIPE, text=True)


def test_a_run_that_meets_the_lock_before_its_holder_wrote_waits_to_name_it(_state: Path) -> None:
    """The holder writes who it is right after its flock: a second run meeting the lock in between read an empty file
    and said "pid ?, started ?: ? (run ?)" (CI, two `remediate --apply -i ip1,ip2,ip3,` at once). It waits for the
    name (up to HOLDER_WAIT_S), and still refuses when the holder never writes one."""
    key = ddlock.cluster_key(["n1", "n2"])
    path = _state / "locks" / f"cluster-{key}.lock"
    for delay, named in ((0.3, True), (ddlock.HOLDER_WAIT_S + 2, False)):
        p = _flock_then_write(path, delay, {"pid": 4242, "command": "ddpfix remediate --apply", "run_id": "r1"})
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "locked"
            started = time.monotonic()
            with pytest.raises(DdpfixError) as exc:
                ddlock.controller_lock(["n2", "n1"])
            waited = time.monotonic() - started
            assert exc.value.code == ExitCode.LOCKED
            if named:
                assert "pid 4242" in str(exc.value) and "ddpfix remediate --apply" in str(exc.value), exc.value
                assert waited < ddlock.HOLDER_WAIT_S
            else:
                assert "pid ?" in str(exc.value) and waited >= ddlock.HOLDER_WAIT_S
        finally:
            p.kill()
            p.wait()


@pytest.mark.parametrize("spelling", ["adhoc", "file"])
def test_cli_exits_with_the_lock_code_for_any_inventory_naming_the_nodes(tmp_path: Path, spelling: str) -> None:
    """An ad-hoc host list (a new file per run) and an inventory file naming the same nodes share the lock."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("ddp_nodes:\n  hosts: {a: {ansible_host: 10.9.0.1}, b: {ansible_host: 10.9.0.2}}\n")
    held = ddlock.controller_lock(["10.9.0.2", "10.9.0.1"])
    try:
        spec = "10.9.0.1,10.9.0.2," if spelling == "adhoc" else str(inv)
        r = CliRunner().invoke(cli, ["-i", spec, "env"])
    finally:
        held.release()
    assert r.exit_code == ExitCode.LOCKED == 5, r.output
    assert ddlock.HELD_TEXT in r.output and f"pid {os.getpid()}" in r.output


def _wait_free(addresses: list[str], what: str, keep_holder: bool = False) -> None:
    """Until the controller lock of `addresses` can be taken (and is let go again): a keeper dropped it.
    `keep_holder`: the flock only, the file still naming its last holder."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if keep_holder:
                path = ddlock.paths.state_dir() / "locks" / f"cluster-{ddlock.cluster_key(addresses)}.lock"
                with open(path) as f:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return
                    except BlockingIOError:
                        raise DdpfixError("held", ExitCode.LOCKED) from None
            ddlock.controller_lock(addresses).release()
            return
        except DdpfixError:
            assert time.monotonic() < deadline, what
            time.sleep(0.2)


#: An ansible-playbook stand-in: it forks a worker that runs what action ddpfix_cluster runs (twice: a second play of
#: the same run), then lives until its stdin closes.
_PLAYBOOK = """
import os, sys
from ddpfix import lock
pid = os.fork()
if pid == 0:
    try:
        print(repr(lock.hold_for_playbook(sys.argv[1:])), flush=True)
        print(repr(lock.hold_for_playbook(sys.argv[1:])), flush=True)
    finally:
        os._exit(0)
os.waitpid(pid, 0)
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_playbook_holds_the_cluster_lock_until_it_exits_unless_the_cli_holds_it(monkeypatch: pytest.MonkeyPatch,
                                                                                  tmp_path: Path) -> None:
    view = {"addresses": {"node1": "10.8.0.1", "node2": "10.8.0.2"}}
    assert ddlock.cluster_addresses(view) == ["10.8.0.1", "10.8.0.2"]
    assert ddlock.cluster_addresses({"failed": True, **view}) is None and ddlock.cluster_addresses(None) is None
    held = ddlock.controller_lock(["10.8.0.2", "10.8.0.1"])  # the CLI holds it (DDPFIX_CLUSTER_LOCK names it)
    try:
        assert ddlock.hold_for_playbook(["10.8.0.1", "10.8.0.2"]) is None
        monkeypatch.delenv(ddlock.HELD_ENV)  # another run's ansible-playbook: refused, naming the holder
        report = tmp_path / "locked"
        monkeypatch.setenv("DDPFIX_LOCKED_FILE", str(report))  # where the CLI reads it (exit 5)
        with pytest.raises(DdpfixError, match=r"holds the lock for this cluster.*no node was contacted") as exc:
            ddlock.hold_for_playbook(["10.8.0.1", "10.8.0.2"])
        assert exc.value.code == ExitCode.LOCKED
        assert ddlock.HELD_TEXT in report.read_text() and f"pid {os.getpid()}" in report.read_text()
    finally:
        held.release()
    # free: the worker takes it for its ansible-playbook, which keeps it after the worker exited, until it exits
    env = {k: v for k, v in os.environ.items() if k != ddlock.HELD_ENV}
    env["PYTHONPATH"] = str(Path(ddlock.__file__).resolve().parents[1])
    playbook = subprocess.Popen([sys.executable, "-c", _PLAYBOOK, "10.8.0.1", "10.8.0.2"], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert playbook.stdout is not None
        lines = [playbook.stdout.readline().strip() for _ in range(3)]
        assert lines == ["None", "None", "ready"], lines  # the second play of the same run: its own lock
        with pytest.raises(DdpfixError, match=rf"pid {playbook.pid}\b") as exc:
            ddlock.controller_lock(["10.8.0.1", "10.8.0.2"])
        assert exc.value.code == ExitCode.LOCKED
    finally:
        assert playbook.stdin is not None
        playbook.stdin.close()
        playbook.wait(timeout=60)
    _wait_free(["10.8.0.1", "10.8.0.2"], "the lock outlived its ansible-playbook")  # the keeper sees its end
    # no writable state directory (a read-only home on an execution node): a warning, the play goes on
    monkeypatch.setenv("DDPFIX_STATE_DIR", "/proc/ddpfix-no-such-dir")
    warned = ddlock.hold_for_playbook(["10.8.0.3"])
    assert warned and "controller lock not taken" in warned


# ---------------------------------------------------------------- node lock module

lockmod = load_role_module("modules/ddpfix_run_lock.py", "ddpfix_run_lock")
wr = load_role_module("module_utils/ddpfix_writable.py", "ddpfix_writable")


class _Failed(Exception):
    pass


class _Module:
    def fail_json(self, **kw: Any) -> None:
        raise _Failed(kw)


def holder(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "pid": 4242, "controller": "ops1", "command": "ddpfix audit -i inv",
            "started": "2026-01-01T10:00:00+0000"}


def test_node_lock_refuses_a_second_run_and_names_it(tmp_path: Path) -> None:
    path = str(tmp_path / "ddpfix.lock")
    assert lockmod.present(_Module(), path, holder("aaa"), 1200)["taken_over"] is None
    assert lockmod.present(_Module(), path, holder("aaa"), 1200)["taken_over"] is None  # same run: re-entrant
    with pytest.raises(_Failed) as exc:
        lockmod.present(_Module(), path, holder("bbb"), 1200)
    kw = exc.value.args[0]
    assert kw["locked"] and kw["holder"]["run_id"] == "aaa"
    assert "run aaa (pid 4242 on ops1, started 2026-01-01T10:00:00+0000: ddpfix audit -i inv)" in kw["msg"]
    assert not lockmod.absent(path, holder("bbb")) and os.path.exists(path)  # never another run's lock
    assert lockmod.absent(path, holder("aaa")) and not os.path.exists(path)


lockutil = load_role_module("module_utils/ddpfix_lock.py", "ddpfix_lock")


def _record(path: str) -> dict[str, Any]:
    return dict(json.loads(Path(path).read_text()))


def test_node_lock_records_its_holder_and_is_refreshed_by_the_same_run(tmp_path: Path) -> None:
    path = str(tmp_path / "ddpfix.lock")
    first = lockmod.present(_Module(), path, holder("aaa"), 1200)
    rec = _record(path)
    assert first["refreshed"] is False and rec["run_id"] == "aaa" and rec["pid"] == 4242
    assert rec["node_boot_id"] == lockutil.boot_id() != "" and rec["node_pid"] == os.getpid()
    assert rec["node_pid_start"] == lockutil.proc_start(os.getpid()) and rec["lease_s"] == 1200
    # a long run: taken 25 minutes ago, refreshed by each play since; never taken over while it refreshes
    Path(path).write_text(json.dumps(dict(rec, taken_at=time.time() - 1500, refreshed_at=time.time() - 60)))
    with pytest.raises(_Failed):
        lockmod.present(_Module(), path, holder("bbb"), 1200)
    again = lockmod.present(_Module(), path, holder("aaa"), 1200)
    rec2 = _record(path)
    assert again["refreshed"] is True and rec2["refreshed_at"] >= time.time() - 5
    assert rec2["taken_at"] == pytest.approx(time.time() - 1500, abs=5)  # a refresh keeps when it was taken


def test_remote_holder_is_stale_only_when_its_lease_ran_out(tmp_path: Path) -> None:
    path = str(tmp_path / "ddpfix.lock")
    lockmod.present(_Module(), path, holder("dead"), 1200)
    rec = _record(path)
    Path(path).write_text(json.dumps(dict(rec, refreshed_at=time.time() - 1100)))
    with pytest.raises(_Failed):  # 18 minutes without a refresh: still within its lease
        lockmod.present(_Module(), path, holder("new"), 1200)
    Path(path).write_text(json.dumps(dict(rec, refreshed_at=time.time() - 1300)))
    got = lockmod.present(_Module(), path, holder("new"), 1200)
    assert got["taken_over"]["run_id"] == "dead" and "not refreshed for 13" in got["taken_over"]["stale"]
    assert _record(path)["run_id"] == "new"


def test_holder_on_this_node_is_stale_exactly_when_its_process_is_gone(tmp_path: Path) -> None:
    path = str(tmp_path / "ddpfix.lock")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        local = dict(holder("local"), pid=p.pid, pid_start=lockutil.proc_start(p.pid), boot_id=lockutil.boot_id(),
                     pidns=lockutil.pid_namespace())
        lockmod.present(_Module(), path, local, 1200)
        Path(path).write_text(json.dumps(dict(_record(path), refreshed_at=time.time() - 86400)))
        with pytest.raises(_Failed):  # a day without a refresh, but its holder runs: held
            lockmod.present(_Module(), path, holder("other"), 1200)
    finally:
        p.kill()
        p.wait()
    got = lockmod.present(_Module(), path, holder("other"), 1200)  # gone: taken over at once, whatever its age
    assert got["taken_over"]["stale"] == f"its holder, pid {p.pid} on this node, is gone"
    # same PID again but another process (PID reuse: another start time): gone too
    rec = dict(local, node_boot_id=lockutil.boot_id(), pid=os.getpid(), pid_start="1")
    assert "is gone" in lockutil.stale_reason(rec, time.time(), 1200)
    # another PID namespace on the same kernel (a container, a lab node): not "this node", the lease decides
    assert lockutil.stale_reason(dict(rec, pidns="pid:[1]"), time.time(), 1200) is None


def test_lock_taken_before_a_reboot_is_stale(tmp_path: Path) -> None:
    rec = dict(holder("old"), node_boot_id="2f7c-before-the-reboot", refreshed_at=time.time())
    why = lockutil.stale_reason(rec, time.time(), 1200, this_boot="9a1e-now")
    assert why == "the node rebooted since it was taken (boot id 2f7c-before-the-reboot, now 9a1e-now)"
    assert lockutil.stale_reason(rec, time.time(), 1200, this_boot="2f7c-before-the-reboot") is None


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES, errno.EPERM])
def test_lock_that_cannot_be_written_refuses_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      err: int) -> None:
    def refuse(*_a: Any, **_k: Any) -> int:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(lockutil.os, "open", refuse)
    path = str(tmp_path / "ddpfix.lock")
    with pytest.raises(_Failed) as exc:
        lockmod.present(_Module(), path, holder("aaa"), 1200)
    kw = exc.value.args[0]
    assert kw["unlockable"] and not kw.get("locked") and "this node is refused, nothing written" in kw["msg"]
    assert os.strerror(err) in kw["msg"] and path in kw["msg"]
    # the read-only audit (ddpfix_node_facts: required=False) reads on without it
    result, failure = lockutil.present(path, holder("aaa"), 1200, required=False)
    assert failure is None and os.strerror(err) in result["unlocked"]


def test_lock_file_is_written_without_following_links(tmp_path: Path) -> None:
    path = tmp_path / "ddpfix.lock"
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / f"ddpfix.lock.{os.getpid()}.tmp").symlink_to(victim)  # planted at the temporary name
    lockmod.present(_Module(), str(path), holder("aaa"), 1200)
    assert victim.read_text() == "keep\n" and _record(str(path))["run_id"] == "aaa"


def test_unreadable_node_lock_counts_as_held_until_stale(tmp_path: Path) -> None:
    path = tmp_path / "ddpfix.lock"
    path.write_text("garbage")
    with pytest.raises(_Failed):
        lockmod.present(_Module(), str(path), holder("x"), 1200)
    old = time.time() - 1300
    os.utime(path, (old, old))
    got = lockmod.present(_Module(), str(path), holder("x"), 1200)["taken_over"]
    assert set(got) == {"age_seconds", "stale"} and got["age_seconds"] == pytest.approx(1300, abs=5)
    assert re.match(r"not refreshed for 1[23]\d\d s \(lease 1200 s\): its run is gone$", got["stale"]), got


def test_writable_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "hosts").write_text("")
    paths = [str(etc / "hosts"), str(etc / "ddpfix" / "ddp.env")]  # the env file's directory does not exist yet
    assert wr.unwritable(paths) == {}
    # a read-only /etc (the lab test does it for real with a read-only bind mount)
    real = os.statvfs

    def ro(p: str) -> Any:
        st = real(p)
        return os.statvfs_result((*st[:8], st.f_flag | os.ST_RDONLY, st.f_namemax))

    monkeypatch.setattr(wr.os, "statvfs", ro)
    bad = wr.unwritable(paths)
    assert bad[paths[0]] == f"{paths[0]}: read-only file system"
    assert bad[paths[1]].startswith(f"{etc}: read-only file system (the directory {etc}/ddpfix is missing")


# ---------------------------------------------------------------- run-dir pruning


def test_prune_never_removes_a_live_run_dir(_state: Path) -> None:
    base = _state / "runs"
    mine = new_run_dir("audit")  # held by this process
    other = base / "20000101T000000-other"
    other.mkdir(parents=True)
    (other / LIVE_LOCK).touch()
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(other / LIVE_LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        dead = base / "20000101T000001-dead"
        dead.mkdir()
        (dead / LIVE_LOCK).touch()
        old = time.time() - 3600
        for d in (mine, other, dead):
            os.utime(d, (old, old))
        prune_runs(base, keep=0)
        assert mine.is_dir() and other.is_dir() and not dead.exists()
    finally:
        p.kill()
        p.wait()
    prune_runs(base, keep=0)
    assert not other.exists()  # its process is gone
    release_run_dir(mine)
    prune_runs(base, keep=0)
    assert not mine.exists()


# ---------------------------------------------------------------- --pin-ifnames: physical NICs only


def ifaces(name: str, physical: set[str]) -> list[dict[str, Any]]:
    return ni.interface_facts(json.loads(recorded(name)), lambda n: n in physical)


def test_physical_nic_recorded_is_pinned_to_its_permanent_mac() -> None:
    # recorded on a VM: eth0 has /sys/class/net/eth0/device (virtio), ifb0 and lo do not
    got = ifaces("ip-d-addr-host.json", {"eth0"})
    eth0 = next(i for i in got if i["name"] == "eth0")
    assert eth0["physical"] and eth0["kind"] == "ether" and eth0["permaddr"] == "02:fc:00:00:00:01"
    assert pin_target(got, "eth0") == ("02:fc:00:00:00:01", "")
    assert next(i for i in got if i["name"] == "ifb0")["kind"] == "ifb"
    mac, why = pin_target(got, "ifb0")
    assert mac is None and "ifb interface, not a physical NIC" in why


@pytest.mark.parametrize(("ifname", "kind"), [("br0", "bridge"), ("veth0", "veth"), ("veth0p", "veth")])
def test_bridges_and_veths_recorded_are_skipped(ifname: str, kind: str) -> None:
    # recorded: a bridge br0 whose port veth0 gave it its MAC, and the veth peer
    got = ifaces("ip-d-addr-virtual.json", set())
    mac, why = pin_target(got, ifname)
    assert mac is None and f"it is a {kind} interface, not a physical NIC" in why


def _link(name: str, mac: str, kind: str | None = None, permaddr: str | None = None) -> dict[str, Any]:
    # the `ip -j -d addr show` shape (iproute2 prints "permaddr" only when it differs from "address")
    d: dict[str, Any] = {"ifname": name, "link_type": "ether", "address": mac, "addr_info": []}
    if kind:
        d["linkinfo"] = {"info_kind": kind}
    if permaddr:
        d["permaddr"] = permaddr
    return d


def test_bond_slave_pinned_by_permanent_mac_unless_the_bond_carries_it() -> None:
    data = [_link("bond0", "aa:00:00:00:00:01", "bond"),
            _link("ens1", "aa:00:00:00:00:01", permaddr="aa:00:00:00:00:01"),
            _link("ens2", "aa:00:00:00:00:01", permaddr="aa:00:00:00:00:02"),
            _link("bond0.100", "aa:00:00:00:00:01", "vlan")]
    got = ni.interface_facts(data, lambda n: n.startswith("ens"))
    assert pin_target(got, "ens2") == ("aa:00:00:00:00:02", "")
    mac, why = pin_target(got, "ens1")
    assert mac is None and "also on bond0, bond0.100, ens2" in why
    for virtual in ("bond0", "bond0.100"):
        assert pin_target(got, virtual)[0] is None


def test_old_facts_without_the_physical_flag_are_not_pinned() -> None:
    mac, why = pin_target([{"name": "eth0", "mac": "aa:00:00:00:00:01"}], "eth0")
    assert mac is None and "audit again" in why


def test_exit_5_from_a_node_lock_says_what_the_run_had_changed() -> None:
    hosts = {"node1": HostResult(name="node1"), "node2": HostResult(name="node2")}
    assert changed_before(hosts) == "this run had changed nothing before it stopped"
    hosts["node1"].tasks += [TaskResult(f"Fix {firewall_rules.PEER_PORTS_BLOCKED.id} | accept", "changed", {}),
                             TaskResult("Facts", "ok", {})]
    assert changed_before(hosts) == (
        f"this run changed before it stopped: node1: Fix {firewall_rules.PEER_PORTS_BLOCKED.id} | accept")
    assert changed_before(hosts, check=True).startswith("this run would have changed before it stopped")


# ---------------------------------------------------------------- graceful stop (Ctrl-C of the CLI)


def test_every_remediate_step_checks_the_stop_file_before_it_starts_and_the_lock_tasks_do_not() -> None:
    """Without a strategy plugin of its own: each play-level step of remediate's node plays starts only while
    DDPFIX_STOP_FILE does not exist (`__ddpfix_go`), on the include (a role that started runs to its end); the lock
    and unlock includes and meta tasks run regardless, so no node is left locked. Every play pins `linear`."""
    import yaml

    plays = yaml.safe_load((ROOT / "playbooks" / "remediate.yml").read_text())
    node_plays = [p for p in plays if "hosts" in p and "__ddpfix_plan" in (p.get("vars") or {})]
    assert len(node_plays) == 2
    for play in node_plays:
        assert play["strategy"] == "linear" and play["any_errors_fatal"] is False
        assert "DDPFIX_STOP_FILE" in play["vars"]["__ddpfix_go"] and "exists" in play["vars"]["__ddpfix_go"]
        steps = [t for task in play["tasks"] if "block" in task and "always" in task for t in task["block"]]
        # and the play-level tasks outside blocks (the cluster-wide files are one ddpfix_node_files task per node)
        # (a set_fact or ddpfix_play_values decides on the controller, it starts nothing on a node)
        steps += [t for t in play["tasks"]
                  if "block" not in t and not {"ansible.builtin.meta", "ansible.builtin.set_fact",
                                               "ddpfix.cluster.ddpfix_play_values"} & set(t)]
        assert steps
        for t in steps:
            when = t.get("when") or []
            when = [when] if isinstance(when, str) else when
            role = (t.get("ansible.builtin.include_role") or {})
            if "ansible.builtin.meta" in t or role.get("tasks_from") == "lock":
                assert "__ddpfix_go | bool" not in when, t["name"]
            else:
                assert "__ddpfix_go | bool" in when, t["name"]
    for name in ("audit.yml", "remediate.yml", "verify_torch.yml"):
        for play in yaml.safe_load((ROOT / "playbooks" / name).read_text()):
            assert play.get("strategy", "linear") in ("linear", "free"), (name, play.get("name"))


#: A ddpfix CLI command stand-in: it names itself (lock.command_owner) to the ansible-playbook stand-in above, which
#: it starts and lets end; at a line on stdin the command ends (its close) and the process lives on, until stdin
#: closes; with "die" as its first argument it never ends the command and the process just exits.
_CLI = """
import subprocess, sys
from ddpfix import lock
close = lock.command_owner()
playbook = subprocess.Popen([sys.executable, "-c", sys.argv[2], *sys.argv[3:]], text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
lines = [playbook.stdout.readline().strip() for _ in range(3)]
playbook.stdin.close()
playbook.wait(timeout=60)
print(" ".join(lines), flush=True)
sys.stdin.readline()
if sys.argv[1] != "die":
    close()
    print("closed", flush=True)
    sys.stdin.readline()
    close = lock.command_owner()  # a second command in the same process: its own lock (the file names this PID)
    playbook = subprocess.Popen([sys.executable, "-c", sys.argv[2], *sys.argv[3:]], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    lines = [playbook.stdout.readline().strip() for _ in range(3)]
    playbook.stdin.close()
    playbook.wait(timeout=60)
    print(" ".join(lines), flush=True)
    sys.stdin.read()
"""


@pytest.mark.parametrize("end", ["close", "die"])
def test_a_playbook_a_cli_command_started_keeps_the_lock_for_that_command_until_it_ends(end: str) -> None:
    """remediate's audit takes the lock in its play's first task (the CLI reads no inventory before it): the lock
    then stays with the command (its PID, named as the holder) after that ansible-playbook ended, for its apply and
    its re-audit, and goes when the command ends: its close (the process may live on: click's runner in another
    program), or its process's end. A DDPFIX_LOCK_OWNER that is not the playbook's parent is ignored."""
    env = {k: v for k, v in os.environ.items() if k not in (ddlock.HELD_ENV, ddlock.OWNER_ENV)}
    env["PYTHONPATH"] = str(Path(ddlock.__file__).resolve().parents[1])
    cli = subprocess.Popen([sys.executable, "-c", _CLI, end, _PLAYBOOK, "10.7.0.1", "10.7.0.2"], env=env, text=True,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert cli.stdout is not None and cli.stdin is not None
        assert cli.stdout.readline().strip() == "None None ready"  # the playbook took it and has ended since
        with pytest.raises(DdpfixError, match=rf"pid {cli.pid}\b") as exc:  # held for the CLI, named as the holder
            ddlock.controller_lock(["10.7.0.2", "10.7.0.1"])
        assert exc.value.code == ExitCode.LOCKED
        cli.stdin.write("end\n")
        cli.stdin.flush()
        if end == "close":
            assert cli.stdout.readline().strip() == "closed"
            _wait_free(["10.7.0.1", "10.7.0.2"], "the lock outlived the command", keep_holder=True)
            assert cli.poll() is None  # the CLI process still runs; the lock file still names it
            cli.stdin.write("again\n")  # the next command of that process takes it anew, though the file names it
            cli.stdin.flush()
            assert cli.stdout.readline().strip() == "None None ready"
            with pytest.raises(DdpfixError, match=rf"pid {cli.pid}\b"):
                ddlock.controller_lock(["10.7.0.2", "10.7.0.1"])
    finally:
        assert cli.stdin is not None
        cli.stdin.close()
        cli.wait(timeout=60)
    _wait_free(["10.7.0.1", "10.7.0.2"], "the lock outlived the CLI")  # the keeper sees the CLI's end
    # an owner that did not start the playbook (here: this test process, the playbook's grandparent) is not taken
    playbook = subprocess.Popen([sys.executable, "-c", _PLAYBOOK, "10.7.0.3"], text=True, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env={**env, ddlock.OWNER_ENV: f"{os.getppid()}:0"})
    try:
        assert playbook.stdout is not None
        assert [playbook.stdout.readline().strip() for _ in range(3)] == ["None", "None", "ready"]
        with pytest.raises(DdpfixError, match=rf"pid {playbook.pid}\b"):
            ddlock.controller_lock(["10.7.0.3"])
    finally:
        assert playbook.stdin is not None
        playbook.stdin.close()
        playbook.wait(timeout=60)
    _wait_free(["10.7.0.3"], "the lock outlived its ansible-playbook")


def test_a_commands_close_forgets_the_lock_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process that runs several commands (click's runner), one command's lock is not the next one's."""
    monkeypatch.delenv(ddlock.HELD_ENV, raising=False)
    close = ddlock.command_owner()
    ddlock.note_held(["10.6.0.1", "10.6.0.2"])
    assert os.environ[ddlock.HELD_ENV] == ddlock.cluster_key(["10.6.0.2", "10.6.0.1"])
    assert os.environ[ddlock.OWNER_ENV] == f"{os.getpid()}:{os.environ[ddlock.OWNER_ENV].split(':')[1]}"
    close()
    assert ddlock.HELD_ENV not in os.environ and ddlock.OWNER_ENV not in os.environ
    ddlock.note_held(["10.6.0.1"])  # outside a command: nothing is noted
    assert ddlock.HELD_ENV not in os.environ
