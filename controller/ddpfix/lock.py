"""One run at a time: the controller-side lock per cluster, and the identity of this run.

The controller lock is an ``fcntl.flock`` on ``<state dir>/locks/cluster-<hash of the sorted node addresses>.lock``:
keyed on the cluster, not on the inventory's path, so an ad-hoc host list (``-i a,b,``, a new file per run), a
``--slurm`` allocation and an inventory file naming the same nodes exclude each other. It dies with the process (no
stale lock after a crash or ``kill -9``). The holder (PID, command line, start time, run id) is written into the file
so that a second run can name it. The CLI takes it once it has read the cluster; the audit, whose ansible-playbook
reads the inventory, takes it in that process (strategy ``ddpfix_linear``) as soon as the play's first task has
derived the cluster, before any node is contacted. The CLI names the key it holds in ``DDPFIX_CLUSTER_LOCK`` for its
own ansible-playbook runs.

The node-side lock (``/run/ddpfix.lock``, role ``ddpfix_run``) carries the same run id (`RUN_ID`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpfix import paths
from ddpfix.app import DdpfixError, ExitCode

#: This process's run id: the node locks, the probe listeners and the controller lock carry it.
RUN_ID = uuid.uuid4().hex[:12]
STARTED = time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_start() -> str:
    stat = _read("/proc/self/stat")
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


#: This process's start time (/proc/self/stat field 22), boot id and PID namespace: with its PID, they identify
#: it on its machine (a node lock whose holder runs on that node is stale as soon as this process is gone).
PID_START = _pid_start()
BOOT_ID = _read("/proc/sys/kernel/random/boot_id")
PIDNS = _pidns()


def holder_info() -> dict[str, Any]:
    """Who we are, as written into the controller lock file and the node lock files."""
    return {
        "run_id": RUN_ID,
        "pid": os.getpid(),
        "pid_start": PID_START,
        "boot_id": BOOT_ID,
        "pidns": PIDNS,
        "controller": socket.gethostname(),
        "command": " ".join(["ddpfix", *sys.argv[1:]])[:300],
        "started": STARTED,
    }


def describe_holder(h: dict[str, Any]) -> str:
    """One line naming a lock holder: PID, command and start time."""
    where = f" on {h['controller']}" if h.get("controller") else ""
    return (f"pid {h.get('pid', '?')}{where}, started {h.get('started', '?')}: "
            f"{h.get('command') or '?'} (run {h.get('run_id', '?')})")


#: Environment variable naming the cluster key whose controller lock this process (the CLI) holds: its own
#: ansible-playbook runs (strategy ddpfix_linear) do not try to take it again.
HELD_ENV = "DDPFIX_CLUSTER_LOCK"
#: Words of the message of a controller lock held by another run.
HELD_TEXT = "holds the lock for this cluster"


def cluster_key(addresses: Iterable[str]) -> str:
    """The controller lock's key: the cluster's node addresses (ansible_host, else the name), sorted, lower case."""
    unique = sorted({str(a).strip().lower() for a in addresses})
    return hashlib.sha256("\0".join(unique).encode()).hexdigest()[:16]


@dataclass
class ControllerLock:
    path: Path
    fd: int | None = None
    what: str = "this cluster"

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
            except (OSError, ValueError):
                holder = {}
            os.close(fd)
            raise DdpfixError(
                f"another ddpfix run {HELD_TEXT} ({self.what}): {describe_holder(holder)} "
                f"[lock: {self.path}]; this run changed nothing", ExitCode.LOCKED) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder_info()) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            if os.environ.get(HELD_ENV) == self.path.stem.removeprefix("cluster-"):
                del os.environ[HELD_ENV]
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def controller_lock(addresses: Sequence[str]) -> ControllerLock:
    """Take the lock of the cluster of these node addresses (raises DdpfixError(LOCKED) naming the holder when
    another run has it)."""
    key = cluster_key(addresses)
    shown = ", ".join(sorted({str(a) for a in addresses})[:3]) + (", ..." if len(set(addresses)) > 3 else "")
    lock = ControllerLock(paths.state_dir() / "locks" / f"cluster-{key}.lock",
                          what=f"{len(set(addresses))} nodes: {shown}")
    lock.acquire()
    os.environ[HELD_ENV] = key  # this process's ansible-playbook runs: the lock is ours already
    return lock
