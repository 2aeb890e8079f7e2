"""Small helpers of the lab: subprocesses, files, processes and their start times, waiting, namespaces and
mounts of a lab, and its state file (`lab.json`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpfix.errors import ExitCode
from ddpfix.lab.model import STATE_ROOT, LabError, state_dir, validate_name

#: The lab's state file (`lab.json`): plan, PIDs with their start times, what was written where.
LabState = dict[str, Any]
SSH_PORT = 22


def _run(argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float = 60,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(list(argv), input=input, text=True, capture_output=True, timeout=timeout, env=env)
    except FileNotFoundError as exc:
        raise LabError(f"{argv[0]}: not found", ExitCode.PREREQUISITE) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(argv[:6])}: timed out after {timeout:g} s", ExitCode.RUN_FAILED) from exc
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise LabError(
            f"{' '.join(argv[:6])} failed (rc {res.returncode}): {msg[-1] if msg else ''}", ExitCode.RUN_FAILED
        )
    return res


def _ip_batch(lines: list[str], netns: str | None = None) -> None:
    if not lines:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    _run(argv, input="\n".join(lines) + "\n")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


def _proc_start(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def pid_alive(rec: Mapping[str, int] | None) -> bool:
    """Is the recorded process (`{"pid", "start"}`) still the same, running process?"""
    return rec is not None and bool(rec) and _proc_start(rec["pid"]) == rec["start"]


def _kill(rec: Mapping[str, int] | None, sig: int = signal.SIGKILL) -> None:
    if rec is not None and pid_alive(rec):
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec["pid"], sig)


def _host_pid(init_pid: int, nspid: int) -> int | None:
    """Host PID of the process that is `nspid` in the PID namespace of `init_pid`."""
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return None
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
            if os.readlink(f"{entry.path}/ns/pid") != ns:
                continue
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                if int(line.split()[-1]) == nspid:
                    return int(entry.name)
                break
    return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(x) for x in Path(task.path, "children").read_text().split()]
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in _children(p):
            out.append(c)
            todo.append(c)
    return out


def _wait(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:g} s waiting for {what}", ExitCode.RUN_FAILED)
        time.sleep(interval)
        interval = min(interval * 1.5, 0.25)


def ssh_banner(address: str, port: int = SSH_PORT, timeout: float = 0.5) -> bool:
    """True when an SSH server answers with its banner at address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = STATE_ROOT / f".{name}.lock"
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _netns_list() -> set[str]:
    try:
        return {p.name for p in Path("/run/netns").iterdir()}
    except FileNotFoundError:
        return set()


def _lab_netns(name: str) -> set[str]:
    """Namespaces of lab `name` that exist now (by derived name)."""
    prefix = f"ddpfix-{name}-"
    return {
        ns
        for ns in _netns_list()
        if ns.startswith(prefix)
        and (ns[len(prefix) :] == "sw" or (ns[len(prefix) :].startswith("node") and ns[len(prefix) + 4 :].isdigit()))
    }


def _link_exists(ifname: str) -> bool:
    return Path("/sys/class/net", ifname).exists()


def lab_mounts(name: str) -> list[str]:
    """Mount points in this mount namespace that belong to lab `name` (state dir, netns files)."""
    sd = str(state_dir(name))
    own_ns = {f"/run/netns/{ns}" for ns in _lab_netns(name)} | {f"/run/netns/ddpfix-{name}-sw"}
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if mp == sd or mp.startswith((sd + "/", f"/run/netns/ddpfix-{name}-node")) or mp in own_ns:
                out.append(mp)
    return out


_STATE_LOCK = threading.RLock()


def _save_state(sdir: Path, state: LabState) -> None:
    with _STATE_LOCK:  # `up` records PIDs from several threads
        tmp = sdir / f"lab.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(state, indent=2, default=str))
        tmp.replace(sdir / "lab.json")


def _load_state(name: str) -> LabState | None:
    try:
        state: LabState = json.loads((state_dir(name) / "lab.json").read_text())
        return state
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _require_state(name: str) -> LabState:
    validate_name(name)
    state = _load_state(name)
    if state is None:
        raise LabError(f"lab {name!r} does not exist (run 'ddpfix lab up --name {name}')", ExitCode.INVALID_INPUT)
    return state


def _node_state(state: LabState, node: str) -> dict[str, Any]:
    try:
        node_state: dict[str, Any] = state["nodes"][node]
        return node_state
    except KeyError:
        raise LabError(f"lab {state['name']!r} has no node {node!r}", ExitCode.INVALID_INPUT) from None
