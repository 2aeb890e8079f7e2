"""One run at a time: the controller-side lock per cluster, and the identity of this run.

The controller lock is an ``fcntl.flock`` on ``<state dir>/locks/cluster-<hash of the sorted node addresses>.lock``:
keyed on the cluster, not on the inventory's path, so an ad-hoc host list (``-i a,b,``, a new file per run), a
``--slurm`` allocation and an inventory file naming the same nodes exclude each other. It dies with the process (no
stale lock after a crash or ``kill -9``). The holder (PID, command line, start time, run id) is written into the file
so that a second run can name it. The audit play's first task, which derives the cluster before any node is
contacted (action ``ddpfix_cluster``, `hold_for_playbook`), takes it: for as long as that ansible-playbook runs
when it runs on its own, for the rest of the command when a ddpfix command started it (``DDPFIX_LOCK_OWNER``:
``audit``, ``remediate``, ``verify``). A command that reads the inventory itself first (``env``, ``explain``) takes
it once it has read the cluster. The CLI names the key it holds in ``DDPFIX_CLUSTER_LOCK`` for its own
ansible-playbook runs.

The node-side lock (``/run/ddpfix.lock``, role ``ddpfix_run``) carries the same run id (`RUN_ID`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpfix import paths
from ddpfix.errors import DdpfixError, ExitCode

#: This process's run id: the node locks, the probe listeners and the controller lock carry it.
RUN_ID = uuid.uuid4().hex[:12]
STARTED = time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_start(pid: int | str = "self") -> str:
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def _ppid_of(pid: int) -> int | None:
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


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
#: ansible-playbook runs (action ddpfix_cluster) do not try to take it again.
HELD_ENV = "DDPFIX_CLUSTER_LOCK"
#: Environment variable by which a ddpfix CLI command names itself to the ansible-playbook it starts: `PID:FD`, its
#: process and the read end of a pipe it keeps open until the command ends (`command_owner`). The lock that
#: playbook's first task takes (`hold_for_playbook`) is then kept until that command ends (or its process dies),
#: not only until the playbook ends, so the command's later runs (remediate's apply and re-audit, verify's
#: all-reduce) stay under the lock its first run took, without the CLI reading the inventory before that run.
OWNER_ENV = "DDPFIX_LOCK_OWNER"
#: The cluster key a command's first run took the lock of (`note_held`), for `command_owner`'s close.
_owned: list[str] = []


def command_owner() -> Callable[[], None]:
    """Start a command that lets its first ansible-playbook take the controller lock for it: sets OWNER_ENV (this
    process, a pipe held open) and returns the command's close, which lets the lock go (the keeper sees the pipe's
    end) and forgets it (HELD_ENV, OWNER_ENV): in the console script the command's end is the process's; a command
    run in another program's process (click's runner) ends before that process does."""
    r, w = os.pipe()  # close-on-exec (PEP 446): no program this process starts holds the pipe open
    os.environ[OWNER_ENV] = f"{os.getpid()}:{r}"

    def close() -> None:
        for fd in (w, r):
            with contextlib.suppress(OSError):
                os.close(fd)
        if os.environ.get(OWNER_ENV) == f"{os.getpid()}:{r}":
            del os.environ[OWNER_ENV]
        while _owned:
            if os.environ.get(HELD_ENV) == _owned.pop():
                del os.environ[HELD_ENV]

    return close


def note_held(addresses: Sequence[str]) -> None:
    """The command's first run took the lock of these nodes for the command (OWNER_ENV was set): its later runs
    hold it (HELD_ENV), until the command's close."""
    if os.environ.get(OWNER_ENV) and not os.environ.get(HELD_ENV):
        key = cluster_key(addresses)
        os.environ[HELD_ENV] = key
        _owned.append(key)
#: Words of the message of a controller lock held by another run.
HELD_TEXT = "holds the lock for this cluster"


def cluster_key(addresses: Iterable[str]) -> str:
    """The controller lock's key: the cluster's node addresses (ansible_host, else the name), sorted, lower case."""
    unique = sorted({str(a).strip().lower() for a in addresses})
    return hashlib.sha256("\0".join(unique).encode()).hexdigest()[:16]


#: How long a run that meets a held controller lock waits for its holder to write who it is (seconds).
HOLDER_WAIT_S = 1.0


def _holder_of(fd: int) -> dict[str, Any]:
    """The holder a lock file names ({} while it is empty or half written)."""
    try:
        got = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


@dataclass
class ControllerLock:
    path: Path
    fd: int | None = None
    what: str = "this cluster"

    def acquire(self, holder: dict[str, Any] | None = None) -> None:
        paths.private_dir(self.path.parent, "locks directory")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        # The holder writes who it is right after its flock (and empties the file right before it lets go): a run
        # that meets the lock in between reads nothing. It tries again for a moment, until it can name the holder
        # or the lock is free.
        deadline = time.monotonic() + HOLDER_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                other = _holder_of(fd)
                if not other and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                os.close(fd)
                raise DdpfixError(
                    f"another ddpfix run {HELD_TEXT} ({self.what}): {describe_holder(other)} "
                    f"[lock: {self.path}]; this run changed nothing", ExitCode.LOCKED) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder or holder_info()) + "\n").encode(), 0)
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


def cluster_addresses(view: Any) -> list[str] | None:
    """The node addresses of a cluster view ({addresses: {name: address}}), None when it has none."""
    addresses = view.get("addresses") if isinstance(view, dict) and not view.get("failed") else None
    if not isinstance(addresses, dict) or not addresses:
        return None
    return [str(a or n) for n, a in addresses.items()]


#: The keeper of a playbook's controller lock: a small process that holds the locked descriptor (inherited) until
#: ansible-playbook exits (its pidfd turns readable), or, for a CLI command (OWNER_ENV), until that process exits or
#: the command's pipe reaches its end, then exits, which drops the flock.
_KEEPER = "import select, sys; select.select([int(a) for a in sys.argv[1:]], [], [])"
_KEEPER_POLL = ("import os, sys, time\n"
                "while True:\n"
                "    try: os.kill(int(sys.argv[1]), 0)\n"
                "    except ProcessLookupError: break\n"
                "    except PermissionError: pass\n"
                "    time.sleep(1)\n")


def hold_for_playbook(addresses: Sequence[str], cli_holder: Mapping[str, Any] | None = None) -> str | None:
    """Called in an ansible-playbook worker (action ddpfix_cluster): take the controller lock of these nodes for the
    ansible-playbook process that forked this worker (the parent), until it exits. Nothing when the ddpfix CLI
    that started it holds the lock (``DDPFIX_CLUSTER_LOCK``) or when that ansible-playbook holds it already (an
    earlier play). Raises DdpfixError(LOCKED) naming the holder when another run has it (also written to the file
``DDPFIX_LOCKED_FILE`` names, for the ddpfix CLI). Returns a warning when no
    lock could be taken at all (no writable state directory: the node locks still apply).

    The flock is taken here and handed, with the descriptor, to a keeper process that waits for ansible-playbook to
    exit: the worker's own descriptor dies with the worker, the keeper's with ansible-playbook's end, crash or kill.
    When the ddpfix CLI started that ansible-playbook and names itself (``DDPFIX_LOCK_OWNER``, ``PID:FD``: its PID,
    checked to be the playbook's parent, and the read end of a pipe its command holds open), the keeper waits for
    the CLI's process or that command's end, whichever comes first, instead, and the lock file names the CLI
    (`cli_holder`: its `holder_info`, the play's ``ddpfix_run_holder``): the command's later runs stay under it."""

    key = cluster_key(addresses)
    if os.environ.get(HELD_ENV) == key:
        return None
    playbook = os.getppid()
    owner, _, pipe = os.environ.get(OWNER_ENV, "").partition(":")
    # the ddpfix CLI command that started this ansible-playbook (its parent, named by OWNER_ENV), else the playbook
    cli = int(owner) if owner.isdigit() and pipe.isdigit() and _ppid_of(playbook) == int(owner) else None
    holder_pid = cli or playbook
    started = _pid_start(holder_pid)
    path = paths.state_dir() / "locks" / f"cluster-{key}.lock"
    try:  # a locks directory that is not private (or cannot be made): the playbook's run goes on without it
        paths.private_dir(path.parent, "locks directory")
    except DdpfixError as exc:
        return f"ddpfix: controller lock not taken: {exc}; only the node locks keep runs apart"
    shown = ", ".join(sorted({str(a) for a in addresses})[:3]) + (", ..." if len(set(addresses)) > 3 else "")
    lock = ControllerLock(path, what=f"{len(set(addresses))} nodes: {shown}")
    me = {**holder_info(), "pid": holder_pid, "pid_start": started,
          "command": " ".join([os.path.basename(sys.argv[0]) or "ansible-playbook", *sys.argv[1:]])[:300]}
    if cli and isinstance(cli_holder, Mapping) and str(cli_holder.get("pid")) == str(cli):
        # the CLI's own words (its run id, command and start), as its ansible-playbook received them
        me.update({k: str(cli_holder[k])[:300] for k in ("run_id", "command", "started") if cli_holder.get(k)})
    try:
        lock.acquire(me)
    except OSError as exc:
        return f"ddpfix: controller lock not taken: {exc}; only the node locks keep runs apart"
    except DdpfixError as exc:
        try:
            holder = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        if isinstance(holder, dict) and holder.get("pid") == holder_pid and holder.get("pid_start") == started:
            return None  # held by this playbook's or this command's keeper (an earlier play, or an earlier run)
        msg = f"{exc} (no node was contacted)"
        report = os.environ.get("DDPFIX_LOCKED_FILE")  # the ddpfix CLI reads it: exit 5 with this line
        if report:
            with open(report, "w") as f:
                f.write(msg + "\n")
        raise DdpfixError(msg, ExitCode.LOCKED) from None
    assert lock.fd is not None
    watch: list[int] = []  # what the keeper waits for: the holder's end, and the CLI command's pipe closing
    try:
        watch.append(os.pidfd_open(holder_pid))
        if cli:
            with contextlib.suppress(OSError):  # the command's pipe, opened anew through the CLI's descriptor
                watch.append(os.open(f"/proc/{cli}/fd/{pipe}", os.O_RDONLY | os.O_CLOEXEC))
        code, args = _KEEPER, [str(fd) for fd in watch]
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): the keeper polls
        code, args = _KEEPER_POLL, [str(holder_pid)]
    try:
        subprocess.Popen([sys.executable, "-I", "-S", "-c", code, *args], pass_fds=(lock.fd, *watch),
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    finally:
        for fd in watch:
            os.close(fd)
        os.close(lock.fd)  # the keeper holds the lock now
    return None
