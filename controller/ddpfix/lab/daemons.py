"""The processes of the lab's nodes: PID 1 of each node (`_nodeinit.py`, under the `_supervisor.py` launcher), running
commands inside a node, sshd and chronyd, and the `Runtime` that scenario tasks use while `up` runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddpfix.errors import ExitCode
from ddpfix.lab.model import (
    NODE_PATH,
    NODE_TMPDIR,
    LabError,
    LabPlan,
    NodePlan,
    state_dir,
)
from ddpfix.lab.plan import hosts_text
from ddpfix.lab.system import (
    _STATE_LOCK,
    SSH_PORT,
    LabState,
    _descendants,
    _host_pid,
    _node_state,
    _proc_start,
    _require_state,
    _run,
    _save_state,
    _wait,
    _write,
    pid_alive,
    ssh_banner,
)

_PKG = Path(__file__).resolve().parent


DROP_SYS_TIME = ["setpriv", "--bounding-set", "-sys_time", "--"]


class Runtime:
    """What scenario tasks may use while `up` runs: exec in a node, write its files, record PIDs."""

    def __init__(self, plan: LabPlan, sdir: Path, state: LabState) -> None:
        self.plan = plan
        self.sdir = sdir
        self.state = state

    def node_dir(self, node: NodePlan) -> Path:
        return self.sdir / "nodes" / node.name

    def init_pid(self, node: NodePlan) -> int:
        return int(self.state["nodes"][node.name]["pids"]["init"]["pid"])

    def exec(self, node: NodePlan, argv: Sequence[str], *, input: str | None = None, check: bool = True,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return _node_exec(self.init_pid(node), argv, input=input, check=check, timeout=timeout)

    def write_etc(self, node: NodePlan, rel: str, text: str, mode: int = 0o644) -> None:
        _write(self.node_dir(node) / "etc" / rel, text, mode)

    def write_run(self, node: NodePlan, rel: str, text: str, mode: int = 0o644) -> None:
        _write(self.node_dir(node) / "run" / rel, text, mode)

    def read_run(self, node: NodePlan, rel: str) -> str | None:
        try:
            text = (self.node_dir(node) / "run" / rel).read_text()
        except FileNotFoundError:
            return None
        return text or None

    def hosts_text(self, node: NodePlan) -> str:
        return hosts_text(node)

    def record_pidfile(self, node: NodePlan, key: str, pidfile: str, timeout: float = 10) -> None:
        rel = pidfile.removeprefix("/run/")
        with contextlib.suppress(LabError):
            _wait(lambda: bool((self.read_run(node, rel) or "").strip()), timeout, pidfile)
        text = self.read_run(node, rel)
        if not text:
            raise LabError(f"{node.name}: no pid file {pidfile} for {key}", ExitCode.RUN_FAILED)
        self.record_nspid(node, key, int(text.split()[0]))

    def record_nspid(self, node: NodePlan, key: str, nspid: int) -> None:
        hp = _host_pid(self.init_pid(node), nspid)
        start = _proc_start(hp) if hp else None
        if hp is None or start is None:
            raise LabError(f"{node.name}: {key} (pid {nspid} in the node) is not running", ExitCode.RUN_FAILED)
        with _STATE_LOCK:
            self.state["nodes"][node.name]["pids"][key] = {"pid": hp, "start": start, "nspid": nspid}
            _save_state(self.sdir, self.state)

    def wait_for(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        _wait(pred, timeout, what)


def _node_env() -> dict[str, str]:
    return {"PATH": NODE_PATH, "HOME": "/root", "TMPDIR": NODE_TMPDIR, "LANG": "C.UTF-8", "TERM": "dumb"}


def _node_argv(init_pid: int, argv: Sequence[str]) -> list[str]:
    # Never run a "node" command in the host's namespaces (e.g. if a PID were reused).
    for ns in ("pid", "net", "mnt", "uts"):
        try:
            theirs = os.readlink(f"/proc/{init_pid}/ns/{ns}")
        except OSError:
            raise LabError(f"lab node process {init_pid} is gone", ExitCode.RUN_FAILED) from None
        if theirs == os.readlink(f"/proc/self/ns/{ns}"):
            raise LabError(f"process {init_pid} is not a lab node (shares the {ns} namespace with ddpfix)",
                           ExitCode.RUN_FAILED)
    return ["nsenter", "-t", str(init_pid), "-a", "--", *DROP_SYS_TIME, "env", "-i",
            *(f"{k}={v}" for k, v in _node_env().items()), *argv]


def _node_exec(init_pid: int, argv: Sequence[str], *, input: str | None = None, check: bool = True,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return _run(_node_argv(init_pid, argv), input=input, check=check, timeout=timeout)


def _python_binds(d: Path, n: NodePlan) -> list[list[str]]:
    """A node's pyenv build, read-only at its own path under the node's private /root: first onto the node's copy
    (still reachable before /root is replaced), then, once it is, from there to the same path."""
    if not n.python_home:
        return []
    inside = str(d / "root" / Path(n.python_home).relative_to("/root"))
    return [[n.python_home, inside, "ro"], [inside, n.python_home, "ro"]]


def _start_nodes(rt: Runtime) -> None:
    sdir, plan = rt.sdir, rt.plan
    launches = []
    for n in plan.nodes:
        d = rt.node_dir(n)
        cfg = {
            "ready": str(d / "ready.json"),
            "lab_dir": str(sdir),
            "run": str(d / "run"),
            "hostname": n.hostname,
            "binds": [*_python_binds(d, n)[:1],
                      [str(d / "etc"), "/etc"], [str(d / "root"), "/root"], [str(d / "home"), "/home"],
                      [str(d / "log"), "/var/log"],
                      [str(d / "chrony"), "/var/lib/chrony"], [str(d / "machine-id"), "/var/lib/dbus/machine-id"],
                      *_python_binds(d, n)[1:]],
        }
        argv = [
            "nsenter",
            f"--net=/run/netns/{n.netns}",
            "--",
            "unshare",
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            "--propagation",
            "private",
            "--",
            *DROP_SYS_TIME,
            "/usr/bin/python3",
            "-I",
            "-c",
            (_PKG / "_nodeinit.py").read_text(),
            json.dumps(cfg),
        ]
        launches.append([argv, str(sdir / "logs" / f"{n.name}.log")])
    launch_file = sdir / "launches.json"
    launch_file.write_text(json.dumps(launches))
    with open(sdir / "logs" / "supervisor.log", "ab") as sup_log:  # the child keeps its own copy of the descriptor
        sup = subprocess.Popen(
            [*DROP_SYS_TIME, "/usr/bin/python3", "-I", "-c", (_PKG / "_supervisor.py").read_text(), str(launch_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sup_log,
            start_new_session=True,
            close_fds=True,
        )
    start = None
    _wait(lambda: _proc_start(sup.pid) is not None or sup.poll() is not None, 2, "the lab supervisor")
    start = _proc_start(sup.pid)
    rt.state["supervisor"] = {"pid": sup.pid, "start": start} if start is not None else None
    _save_state(sdir, rt.state)

    def ready(n: NodePlan) -> bool:
        p = rt.node_dir(n) / "ready.json"
        if not p.exists():
            return False
        doc = json.loads(p.read_text())
        if "error" in doc:
            raise LabError(f"{n.name}: node setup failed: {doc['error']}", ExitCode.RUN_FAILED)
        if n.name not in rt.state["nodes"] or "init" not in rt.state["nodes"][n.name]["pids"]:
            rt.state["nodes"][n.name]["pids"]["init"] = {"pid": doc["pid"], "start": doc["start"]}
            rt.state["nodes"][n.name]["pids"]["launcher"] = {"pid": doc["ppid"], "start": _proc_start(doc["ppid"])}
            _save_state(sdir, rt.state)
        return True

    def all_ready() -> bool:
        if sup.poll() is not None and not all((rt.node_dir(n) / "ready.json").exists() for n in plan.nodes):
            raise LabError(f"the node launcher exited early: {_log_tail(sdir)}", ExitCode.RUN_FAILED)
        return all(ready(n) for n in plan.nodes)

    _wait(all_ready, 15, "the nodes to start")


def _log_tail(sdir: Path) -> str:
    tails = []
    for log in sorted((sdir / "logs").glob("*.log")):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        if lines:
            tails.append(f"{log.stem}: {lines[-1]}")
    return "; ".join(tails) or "no log output"


def _start_sshd(rt: Runtime, n: NodePlan) -> None:
    rt.exec(n, ["/usr/sbin/sshd"])
    rt.record_pidfile(n, "sshd", "/run/sshd.pid")


def _start_chrony(rt: Runtime, n: NodePlan) -> None:
    rt.exec(n, ["/etc/init.d/chrony", "start"])
    rt.wait_for(lambda: rt.read_run(n, "chrony/chronyd.pid") is not None, 10, f"chronyd on {n.name}")
    rt.record_pidfile(n, "chronyd", "/run/chrony/chronyd.pid")


def chrony_tracking(name: str, node: str) -> dict[str, str] | None:
    """`chronyc -c tracking` of a node as a dict (None when chronyd does not answer)."""
    res = node_exec(name, node, ["chronyc", "-c", "tracking"], check=False, timeout=10)
    if res.returncode != 0 or not res.stdout.strip():
        return None
    keys = [
        "ref_id",
        "ref_name",
        "stratum",
        "ref_time",
        "system_time",
        "last_offset",
        "rms_offset",
        "frequency",
        "residual_freq",
        "skew",
        "root_delay",
        "root_dispersion",
        "update_interval",
        "leap_status",
    ]
    return dict(zip(keys, res.stdout.strip().split(","), strict=False))


def wait_synchronised(name: str, timeout: float = 30.0) -> None:
    """Wait until every node running chronyd reports leap status Normal (synchronised)."""
    state = _require_state(name)
    running = [n for n, s in state["nodes"].items() if pid_alive(s["pids"].get("chronyd"))]

    def synced(n: str) -> bool:
        t = chrony_tracking(name, n)
        return t is not None and t.get("leap_status") == "Normal" and t.get("ref_id") not in ("00000000", "")

    pending = list(running)

    def check() -> bool:
        pending[:] = [n for n in pending if not synced(n)]
        return not pending

    try:
        _wait(check, timeout, "chrony to synchronise", interval=0.25)
    except LabError:
        raise LabError(
            f"chrony not synchronised after {timeout:g} s on {', '.join(pending)}", ExitCode.RUN_FAILED
        ) from None


def node_exec(
    name: str, node: str, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run argv inside a node (all its namespaces, CAP_SYS_TIME dropped, clean env with TMPDIR).

    Returns the CompletedProcess (text); raises LabError when `check` and the exit status is not 0."""
    state = _require_state(name)
    rec = _node_state(state, node)["pids"].get("init")
    if not pid_alive(rec):
        raise LabError(f"{node} of lab {name!r} is not running", ExitCode.RUN_FAILED)
    return _node_exec(rec["pid"], argv, input=input, check=check, timeout=timeout)


def node_popen(name: str, node: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start argv inside a node without waiting (e.g. a long-running torchrun); kwargs go to Popen."""
    state = _require_state(name)
    rec = _node_state(state, node)["pids"].get("init")
    if not pid_alive(rec):
        raise LabError(f"{node} of lab {name!r} is not running", ExitCode.RUN_FAILED)
    return subprocess.Popen(_node_argv(rec["pid"], argv), **kwargs)


def stop_sshd(name: str, node: str) -> None:
    """Make a node unreachable over SSH: kill its sshd listener and every session it spawned."""
    state = _require_state(name)
    rec = _node_state(state, node)["pids"].get("sshd")
    if pid_alive(rec):
        victims = [rec["pid"], *_descendants(rec["pid"])]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait(lambda: not pid_alive(rec), 5, f"sshd on {node} to stop")
    port = state.get("ssh_port", SSH_PORT)
    _wait(lambda: not _sshd_answers(state, node, timeout=0.3), 5, f"port {port} on {node} to close")


def start_sshd(name: str, node: str) -> None:
    """Start a node's sshd again (after stop_sshd) and wait until it answers."""
    state = _require_state(name)
    ns = _node_state(state, node)
    if pid_alive(ns["pids"].get("sshd")):
        return
    init_pid = ns["pids"]["init"]["pid"]
    with contextlib.suppress(FileNotFoundError):
        (state_dir(name) / "nodes" / node / "run" / "sshd.pid").unlink()
    _node_exec(init_pid, ["/usr/sbin/sshd"])
    pidfile = state_dir(name) / "nodes" / node / "run" / "sshd.pid"
    # sshd creates the file before it writes its pid: wait for the pid, as record_pidfile does
    _wait(lambda: pidfile.is_file() and bool(pidfile.read_text().strip()), 5, f"sshd pid file on {node}")
    nspid = int(pidfile.read_text().split()[0])
    hp = _host_pid(init_pid, nspid)
    if hp is None:
        raise LabError(f"sshd on {node} did not stay up", ExitCode.RUN_FAILED)
    ns["pids"]["sshd"] = {"pid": hp, "start": _proc_start(hp), "nspid": nspid}
    _save_state(state_dir(name), state)
    _wait(lambda: _sshd_answers(state, node), 5, f"sshd on {node}")


def _sshd_answers(state: LabState, node: str, timeout: float = 0.5) -> bool:
    """Does the node's sshd answer on the lab's SSH port - from the controller, or from the bastion for the nodes
    the controller may not reach directly?"""
    addr, port, bastion = state["nodes"][node]["address"], state.get("ssh_port", SSH_PORT), state.get("bastion")
    if not bastion or bastion == node:
        return ssh_banner(addr, port, timeout)
    res = _run(
        [
            "ip",
            "netns",
            "exec",
            state["nodes"][bastion]["netns"],
            "nc",
            "-z",
            "-w",
            str(max(1, round(timeout))),
            addr,
            str(port),
        ],
        check=False,
        timeout=10,
    )
    return res.returncode == 0
