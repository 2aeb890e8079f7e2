"""The ddpfix node lock (one run at a time per node): shared by ddpfix_run_lock and ddpfix_node_facts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import fcntl
import json
import os
import time


def describe(h):
    return "run {} (pid {} on {}, started {}: {})".format(
        h.get("run_id", "?"), h.get("pid", "?"), h.get("controller", "?"), h.get("started", "?"), h.get("command", "?"))


def read_lock(path):
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}, os.stat(path).st_mtime
    except (OSError, ValueError):
        try:
            return {}, os.stat(path).st_mtime
        except OSError:
            return None, None


def write_lock(path, holder):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(holder, f)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)


def present(path, holder, stale_s):
    """Take the lock for `holder`. Returns (result, failure): failure is None or a dict for fail_json (msg, holder,
    lock, locked=True) when another live run holds it."""
    try:
        return _present(path, holder, stale_s)
    except OSError as exc:
        if getattr(exc, "errno", None) not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        # An SSH user who may not write /run (no root, no become) can change nothing on this node either: the run
        # goes on without the node lock (the controller's lock still keeps runs from one controller apart).
        return dict(holder=holder, taken_over=None,
                    unlocked=f"node lock {path} not taken: {exc.strerror} (uid {os.getuid()})"), None


def _present(path, holder, stale_s):
    # serialises read-decide-write on this node: a flock on the lock's directory (no extra file left behind)
    guard = os.open(os.path.dirname(path) or "/", os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        current, mtime = read_lock(path)
        taken_over = None
        if current is not None and current.get("run_id") != holder["run_id"]:
            age = time.time() - (mtime or 0)
            if age < stale_s:
                return None, dict(
                    msg=f"ddpfix node lock {path} is held by {describe(current)}; wait for it to finish (a lock of a "
                        f"run that died is taken over after {stale_s // 60} minutes, or remove {path} once you know "
                        "that run is gone)",
                    holder=current, lock=path, locked=True)
            taken_over = dict(current, age_seconds=int(age))
        write_lock(path, dict(holder, node_pid=os.getpid(), taken_at=time.time()))
        return dict(holder=holder, taken_over=taken_over), None
    finally:
        os.close(guard)


def absent(path, holder):
    current, _ = read_lock(path)
    if current is not None and current.get("run_id") == holder["run_id"]:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return True
    return False
