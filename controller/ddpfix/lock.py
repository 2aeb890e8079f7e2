"""One run at a time: the controller-side lock per inventory, and the identity of this run.

The controller lock is an ``fcntl.flock`` on ``<state dir>/locks/<hash of the resolved inventory paths>.lock``:
it dies with the process (no stale lock after a crash or ``kill -9``). The holder (PID, command line, start
time, run id) is written into the file so that a second run can name it.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpfix import paths
from ddpfix.app import DdpfixError, ExitCode

#: This process's run id: the node locks, the probe listeners and the controller lock carry it.
RUN_ID = uuid.uuid4().hex[:12]
STARTED = time.strftime("%Y-%m-%dT%H:%M:%S%z")


def holder_info() -> dict[str, Any]:
    """Who we are, as written into the controller lock file and the node lock files."""
    return {
        "run_id": RUN_ID,
        "pid": os.getpid(),
        "controller": socket.gethostname(),
        "command": " ".join(["ddpfix", *sys.argv[1:]])[:300],
        "started": STARTED,
    }


def describe_holder(h: dict[str, Any]) -> str:
    """One line naming a lock holder: PID, command and start time."""
    where = f" on {h['controller']}" if h.get("controller") else ""
    return (f"pid {h.get('pid', '?')}{where}, started {h.get('started', '?')}: "
            f"{h.get('command') or '?'} (run {h.get('run_id', '?')})")


def inventory_key(inventories: Sequence[str]) -> str:
    resolved = sorted(str(Path(i).resolve()) for i in inventories)
    return hashlib.sha256("\0".join(resolved).encode()).hexdigest()[:16]


@dataclass
class ControllerLock:
    path: Path
    fd: int | None = None

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
                f"another ddpfix run holds the lock for this inventory: {describe_holder(holder)} "
                f"[lock: {self.path}]", ExitCode.LOCKED) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder_info()) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def controller_lock(inventories: Sequence[str]) -> ControllerLock:
    """Take the per-inventory lock (raises DdpfixError(LOCKED) naming the holder when another run has it)."""
    lock = ControllerLock(paths.state_dir() / "locks" / f"{inventory_key(inventories)}.lock")
    lock.acquire()
    return lock
