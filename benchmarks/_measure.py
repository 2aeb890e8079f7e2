#!/usr/bin/env python3
"""Run one command and measure it: `python _measure.py RESULT.json STDOUT STDERR -- argv...`.

This process makes itself a child subreaper, so processes the command leaves behind (the daemonised
ssh ControlPersist masters) are re-parented to it instead of to PID 1. After the command exits it
stops those leftovers (SIGTERM, they belong to this run: its own control-path directory) and reaps
them, so their CPU time (the SSH encryption of the whole run) is counted too.

Reported (JSON):
  wall_s           monotonic time from spawn to exit of the command (leftovers' teardown not included)
  cpu_user_s/cpu_sys_s  user/system CPU of the command's whole process tree: os.wait4 of the command (its
                   waited descendants: ansible-playbook, forks, ssh clients) + the reaped leftovers
  maxrss_mb        ru_maxrss: the peak RSS of the largest single process of the tree (not a sum)
  tree_rss_peak_mb sum of the RSS of every process of the tree, sampled every 0.2 s (upper bound: shared
                   pages of forked workers count once per process)
  machine_cpu_s    busy CPU time of the whole machine during the run (/proc/stat; includes the lab nodes'
                   sshd/python and anybody else's load)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _busy() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    out_json, out, err = sys.argv[1:4]
    assert sys.argv[4] == "--"
    argv = sys.argv[5:]
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    me = os.getpid()
    peak = {"rss": 0, "procs": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            pids = [p for p in _tree(me) if p != me]
            peak["rss"] = max(peak["rss"], sum(_rss(p) for p in pids))
            peak["procs"] = max(peak["procs"], len(pids))
            stop.wait(0.2)

    busy0 = _busy()
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    with open(out, "wb") as so, open(err, "wb") as se:
        p = subprocess.Popen(argv, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    busy1 = _busy()
    stop.set()
    th.join()
    rc = os.waitstatus_to_exitcode(status)
    # leftovers (ControlPersist masters) are now our children: stop and reap them
    left = _children(me)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    ut, st, mx = ru.ru_utime, ru.ru_stime, ru.ru_maxrss
    lut = lst = 0.0
    deadline = time.monotonic() + 10
    while True:
        try:
            pid, _, r = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                for q in _children(me):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(q, signal.SIGKILL)
                deadline = time.monotonic() + 10
            time.sleep(0.02)
            continue
        lut += r.ru_utime
        lst += r.ru_stime
        mx = max(mx, r.ru_maxrss)
    res = {
        "argv": argv, "rc": rc, "wall_s": round(wall, 3),
        "cpu_user_s": round(ut + lut, 3), "cpu_sys_s": round(st + lst, 3), "cpu_s": round(ut + st + lut + lst, 3),
        "leftover_procs": len(left), "leftover_cpu_s": round(lut + lst, 3),
        "maxrss_mb": round(mx / 1024, 1), "tree_rss_peak_mb": round(peak["rss"] / 2**20, 1),
        "tree_procs_peak": peak["procs"],
        "machine_cpu_s": round(busy1 - busy0, 2), "load1_before": round(load0, 2),
    }
    with open(out_json, "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
