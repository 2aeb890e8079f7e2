# Runs as PID 1 of a lab node's PID namespace: `python3 -I -c <this file> <json>`.
# It is executed by /usr/bin/python3 with the standard library only, and is never imported.
#
# Before this runs, the launcher has put the process into the node's network namespace and into
# new mount/UTS/IPC/PID namespaces, with CAP_SYS_TIME removed from the bounding set.
# This script gives the node its own /etc, /run, /root, /var/log, ... (bind mounts from the lab
# state dir), a /sys and /proc of its own namespaces, its hostname, then reports readiness and
# reaps orphans until it is killed (killing it kills every process of the node).
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from typing import Any

cfg = json.loads(sys.argv[1])
# Opened now: the path is hidden once /run is replaced.
ready_dir = os.open(os.path.dirname(cfg["ready"]), os.O_RDONLY | os.O_DIRECTORY)
ready_name = os.path.basename(cfg["ready"])
ready = os.fdopen(os.open(ready_name + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=ready_dir), "w")


def run(*argv: str) -> None:
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError("{}: {}".format(" ".join(argv), res.stderr.strip()))


def report(doc: "dict[str, Any]") -> None:
    ready.write(json.dumps(doc))
    ready.flush()
    ready.close()
    os.rename(ready_name + ".tmp", ready_name, src_dir_fd=ready_dir, dst_dir_fd=ready_dir)
    os.close(ready_dir)


try:
    # /proc is still the host's procfs here, so these are host-namespace ids.
    host_pid = int(os.readlink("/proc/self"))
    with open(f"/proc/{host_pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    info = {"pid": host_pid, "ppid": int(fields[1]), "start": int(fields[19])}

    for src, dst, *opts in cfg["binds"]:
        run("mount", "--bind", src, dst)
        if "ro" in opts:
            run("mount", "-o", "remount,bind,ro", dst)
    # an explicit size (a limit, nothing is reserved), so that the audit's /dev/shm size check does not depend on this
    # machine's RAM (tmpfs defaults to half of it); the shm-small scenario remounts it smaller
    run("mount", "-t", "tmpfs", "-o", "nosuid,nodev,mode=1777,size=4g", "tmpfs", "/dev/shm")
    run("umount", "-l", "/sys")
    run("mount", "-t", "sysfs", "-o", "nosuid,nodev,noexec", "sysfs", "/sys")
    # Drop this namespace's copies of the host's netns files and of other labs' state dirs:
    # they would otherwise keep those namespaces/tmpfs alive after their owner removed them.
    own = cfg["lab_dir"].rstrip("/")
    mps = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if mp == "/run/netns" or (
                mp.startswith(os.path.dirname(own) + "/") and not (mp == own or mp.startswith(own + "/"))
            ):
                mps.append(mp)
    for mp in sorted(set(mps), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run("mount", "--bind", cfg["run"], "/run")
    run("umount", "-l", "/proc")
    run("mount", "-t", "proc", "-o", "nosuid,nodev,noexec", "proc", "/proc")
    socket.sethostname(cfg["hostname"])
    ctypes.CDLL(None).prctl(15, b"ddpfix-node", 0, 0, 0)  # PR_SET_NAME: not "init", not "*sh"
except Exception as exc:  # noqa: BLE001 - any failure is reported, then the node dies (the launcher tears it down)
    report({"error": str(exc)})
    sys.exit(1)


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


signal.signal(signal.SIGCHLD, _reap)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
signal.signal(signal.SIGINT, lambda *_: os._exit(0))
report(info)
os.chdir("/")
while True:
    signal.pause()
