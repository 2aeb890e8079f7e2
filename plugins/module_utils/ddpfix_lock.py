"""The ddpfix node lock (one run at a time per node): shared by ddpfix_run_lock and ddpfix_node_facts.

The lock file (JSON) names its holder: the controller run (run_id, its PID, PID start time, boot id and host name,
command, start), and on this node the boot id, the PID and start time of the module process that took it, when it
was taken and when it was last refreshed. Every lock-taking call of the same run refreshes it (the lock tasks at
the start of each ddpfix play, the audit's facts task, the probe collection). It is stale only when its holder is
gone:

- the node rebooted since it was taken (its boot id differs): the run's work on this node ended with that boot;
- the holder runs on this node (its boot id and PID namespace are this node's: ddpfix with a local connection): its
  PID no longer runs with the recorded start time;
- the holder is a remote controller: its lease ran out, it was not refreshed for the lease's length (a run that is
  alive refreshes it at each play and each facts task).

A lock without those fields (written by hand, or an older ddpfix) is judged by its file's age against the lease.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import fcntl
import json
import os
import time

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: The longest a run waits for another run's rolling prober that holds the lock (a prober lives 120 s at most).
PROBER_WAIT_MAX = 125.0


def boot_id():
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace():
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def proc_start(pid):
    """Field 22 (starttime) of /proc/PID/stat, or None when PID does not run."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError, TypeError):
        return None


def describe(h):
    return "run {} (pid {} on {}, started {}: {})".format(
        h.get("run_id", "?"), h.get("pid", "?"), h.get("controller", "?"), h.get("started", "?"), h.get("command", "?"))


def read_lock(path):
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}, os.stat(path).st_mtime
    except (OSError, ValueError):
        try:
            return {}, os.stat(path).st_mtime
        except OSError:
            return None, None


def write_lock(path, holder):
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(holder, f)
        f.write("\n")
    os.rename(tmp, path)


def stale_reason(current, mtime, lease_s, now=None, this_boot=None):
    """Why the lock `current` (its file's `mtime`) no longer has a live holder, or None while it has one."""
    now = time.time() if now is None else now
    this_boot = boot_id() if this_boot is None else this_boot
    node_boot = current.get("node_boot_id")
    if node_boot and this_boot and node_boot != this_boot:
        return f"the node rebooted since it was taken (boot id {node_boot}, now {this_boot})"
    if (this_boot and current.get("boot_id") == this_boot and current.get("pid")
            and current.get("pidns") and current.get("pidns") == pid_namespace()):
        # the holder runs on this node (same boot, same PID namespace: a container or lab node sharing the kernel
        # is not "this node"): alive exactly while its PID runs with the same start time
        if current.get("pid_start") and proc_start(current["pid"]) == str(current["pid_start"]):
            return None
        if not current.get("pid_start") and proc_start(current["pid"]) is not None:
            return None
        return f"its holder, pid {current['pid']} on this node, is gone"
    try:
        refreshed = float(current.get("refreshed_at") or mtime or 0)
    except (TypeError, ValueError):
        refreshed = float(mtime or 0)
    try:
        lease = float(current.get("lease_s") or lease_s)
    except (TypeError, ValueError):
        lease = float(lease_s)
    age = now - refreshed
    if age < lease:
        return None
    return f"not refreshed for {int(age)} s (lease {int(lease)} s): its run is gone"


def present(path, holder, stale_s, required=True):
    """Take (or, for the same run, refresh) the lock for `holder`. Returns (result, failure): failure is None or a
    dict for fail_json (msg, holder, lock, locked=True when another live run holds it; unlockable=True when the
    lock cannot be written here and `required`: a node the run will write to is refused)."""
    try:
        waited_until = time.time() + PROBER_WAIT_MAX
        while True:
            result, failure = _present(path, holder, stale_s)
            until = (failure or {}).get("prober_until")
            # another run's lock lent to its rolling prober (that run is done with this node): wait for it to end
            # (its deadline, and the few seconds a prober takes to end at it)
            if until is None or time.time() >= min(float(until) + 5, waited_until):
                if failure:
                    failure.pop("prober_until", None)
                if result and result.get("taken_over"):
                    _wait_prober_gone(result["taken_over"])
                return result, failure
            time.sleep(0.2)
    except OSError as exc:
        if getattr(exc, "errno", None) not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        reason = f"node lock {path} cannot be taken: {exc.strerror} (uid {os.getuid()})"
        if required:
            return None, dict(msg=f"{reason}: this node is refused, nothing written (a run that changes a node holds "
                                  "its lock: run with become/root, or make the lock's directory writable)",
                              lock=path, unlockable=True)
        # a read-only look (the audit) goes on without it; the controller's lock keeps ddpfix runs apart
        return dict(holder=holder, taken_over=None, unlocked=reason), None


def _present(path, holder, stale_s):
    # serialises read-decide-write on this node: a flock on the lock's directory (no extra file left behind)
    guard = os.open(os.path.dirname(path) or "/", os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        current, mtime = read_lock(path)
        taken_over = None
        now = time.time()
        taken_at = now
        if current is not None and current.get("run_id") != holder["run_id"]:
            why = stale_reason(current, mtime, stale_s, now)
            lent = prober_alive(current) if why is None else None
            if why is None and lent is None and is_lent(current):
                why = "it was lent to a rolling prober of its run that is gone (the run was done with this node)"
            if why is None:
                return None, dict(
                    msg=f"ddpfix node lock {path} is held by {describe(current)}; wait for it to finish (it is taken "
                        f"over once its holder is gone: its PID on this node, a reboot, or {int(stale_s) // 60} "
                        f"minutes without a refresh by a remote run; or remove {path} once you know that run is "
                        "gone)",
                    holder=current, lock=path, locked=True, **({} if lent is None else {"prober_until": lent}))
            taken_over = dict(current, age_seconds=int(now - (mtime or 0)), stale=why)
        kept = {}
        if current and taken_over is None:
            taken_at = current.get("taken_at") or now  # the same run: a refresh
            # its probers lent earlier (other inventory names of this node: the same run) are still running;
            # the lock is held by this task now (not only lent) and stays when they end
            probers = live_probers(current)
            if probers:
                kept = dict(probers=probers, lent=False)
        me = os.getpid()
        write_lock(path, dict(holder, node_boot_id=boot_id(), node_pid=me, node_pid_start=proc_start(me),
                              taken_at=taken_at, refreshed_at=now, lease_s=int(stale_s), **kept))
        return dict(holder=holder, taken_over=taken_over, refreshed=bool(current) and taken_over is None), None
    finally:
        os.close(guard)


def absent(path, holder):
    current, _ = read_lock(path)
    if current is not None and current.get("run_id") == holder["run_id"]:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return True
    return False


def lend(path, run_id, pid, pid_start, until):
    """Hand the lock of run `run_id` to a rolling prober (`pid`, started `pid_start`) that outlives the facts task:
    the lock records it (beside the run's other probers still running on this node: one machine under several
    inventory names), the last of them releases it when it ends (`give_back`), and another run that meets it waits
    for them (`present` waits) rather than being refused. Returns whether the lock named the run."""
    guard = os.open(os.path.dirname(path) or "/", os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        current, _ = read_lock(path)
        if not current or current.get("run_id") != run_id:
            return False
        probers = [p for p in live_probers(current) if p[0] != int(pid)] + [[int(pid), pid_start, float(until)]]
        # prober_pid/_start/_until: the latest prober, as a ddpfix before the list read it
        write_lock(path, dict(current, probers=probers, lent=True, prober_pid=int(pid), prober_start=pid_start,
                              prober_until=float(until)))
        return True
    finally:
        os.close(guard)


def give_back(path, run_id, pid):
    """The rolling prober `pid` ends: it leaves the lock's probers; the lock is removed when it still names run
    `run_id`, is only lent (a later task of the same run that refreshed it took it back: it stays) and no other
    prober of the run still runs. Returns whether the lock was removed."""
    guard = os.open(os.path.dirname(path) or "/", os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        current, _ = read_lock(path)
        if not current or current.get("run_id") != run_id:
            return False
        mine = [p for p in _probers(current) if p[0] == int(pid)]
        if not mine:
            return False
        others = [p for p in live_probers(current) if p[0] != int(pid)]
        if not others and is_lent(current):
            with contextlib.suppress(OSError):
                os.unlink(path)
            return True
        latest = others[-1] if others else [None, None, None]
        write_lock(path, dict(current, probers=others, prober_pid=latest[0], prober_start=latest[1],
                              prober_until=latest[2]))
        return False
    finally:
        os.close(guard)


def is_lent(current):
    """Whether the lock was handed to rolling probers and no task of its run took it back since."""
    return bool(current.get("lent", bool(current.get("prober_pid"))))


def _probers(current):
    """[pid, start, until] of each prober the lock was lent to (a lock before the list: its one prober_pid)."""
    raw = current.get("probers")
    if not isinstance(raw, list):
        raw = [[current.get("prober_pid"), current.get("prober_start"), current.get("prober_until")]]
    out = []
    for p in raw[:64]:
        if isinstance(p, list) and len(p) == 3 and isinstance(p[0], int) and not isinstance(p[0], bool) and p[0] > 0:
            out.append(p)
    return out


def _prober_runs(pid, start):
    """Whether `pid` runs with start time `start` and is not a zombie (an ended prober has closed its listeners)."""
    if proc_start(pid) != str(start):
        return False
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError, ValueError, TypeError):
        return False


def live_probers(current, this_boot=None):
    """The lock's probers that still run on this node."""
    this_boot = boot_id() if this_boot is None else this_boot
    if current.get("node_boot_id") and current.get("node_boot_id") != this_boot:
        return []
    return [p for p in _probers(current) if _prober_runs(p[0], p[1])]


def _wait_prober_gone(old, wait_s=3.0):
    """A lock taken over from a run whose holder is gone but whose rolling prober still ran: that prober sees the
    lock is no longer its run's within half a second and ends (its listeners close); wait for it, so that this run
    does not read its listeners as the node's own (the master port in use)."""
    until = time.time() + wait_s
    while live_probers(old) and time.time() < until:
        time.sleep(0.05)


def prober_alive(current, this_boot=None):
    """Whether the lock `current` was lent to rolling probers of which one still runs on this node, until when
    (epoch seconds: the latest of theirs), or None when it was not lent or its probers are gone."""
    if not is_lent(current):
        return None
    until = None
    for _, _, u in live_probers(current, this_boot):
        try:
            until = max(float(u or 0), until or 0.0)
        except (TypeError, ValueError):
            until = max(0.0, until or 0.0)
    return until
