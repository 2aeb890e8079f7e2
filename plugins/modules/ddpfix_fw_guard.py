#!/usr/bin/python
"""Arm, cancel or run the automatic revert of ddpfix's firewall rule (like iptables-apply)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_fw_guard
short_description: Automatic revert of ddpfix's runtime firewall rule unless the change is confirmed in time
description:
  - C(armed) - starts a detached process on the node (double fork, new session, no systemd needed) that sleeps
    I(timeout) seconds and then removes exactly what this run added (iptables/nftables - the rules tagged with
    I(comment), this run's tag; firewalld - the I(cidr) source of I(zone) in firewalld's runtime; ufw - the rule
    allowing I(cidr)). Its PID is in I(pidfile). Rules of earlier runs (another tag, or C(ddpfix-cluster) alone,
    loaded from the persisted files) stay.
  - >-
    C(cancelled) - the change was confirmed: stops the armed process. Fails, saying so, when the revert already ran.
  - C(reverted) - removes ddpfix's rule now and stops the armed process.
options:
  state: {description: What to do., type: str, required: true, choices: [armed, cancelled, reverted]}
  backend: {description: Layer of the rule., type: str, required: true, choices: [firewalld, iptables, nftables, ufw]}
  cidr: {description: Cluster network., type: str, required: true}
  comment: {description: "Tag of the rules a revert removes: this run's (C(ddpfix-cluster:RUN)).", type: str,
            default: ddpfix-cluster}
  zone: {description: firewalld zone (when I(changes) is empty)., type: str, default: trusted}
  changes:
    description: firewalld - the changes this run made at runtime (see M(ddpfix.cluster.ddpfix_fw_firewalld)).
    type: list
    elements: dict
    default: []
  iptables: {description: iptables command of the variant that was changed., type: str, default: iptables}
  timeout: {description: Seconds until the revert runs., type: int, default: 90}
  pidfile: {description: PID file of the armed process., type: path, default: /run/ddpfix-firewall-revert.pid}
"""

RETURN = r"""
pid: {description: PID of the armed revert process., returned: state=armed, type: int}
removed: {description: What the revert removed., returned: state=reverted, type: list}
"""

import json
import os
import shutil
import signal
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fw import (
    fwd_argv,
    fwd_changes,
    iptables_tagged,
    is_ddpfix_comment,
    nft_tagged,
)

DONE_SUFFIX = ".reverted"


def _run(argv):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, err = p.communicate()
    return p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def revert(p):
    """Remove exactly the rules tagged with this run's comment (nothing of earlier runs). Returns the commands that
    removed something."""
    done = []
    backend, cidr, comment = p["backend"], p["cidr"], p["comment"]
    if backend == "nftables":
        rc, out, _ = _run(["nft", "-j", "list", "ruleset"])
        if rc == 0:
            for fam, table, chain, handle in nft_tagged(json.loads(out or "{}"), comment):
                argv = ["nft", "delete", "rule", fam, table, chain, "handle", str(handle)]
                if _run(argv)[0] == 0:
                    done.append(" ".join(argv))
    elif backend == "iptables":
        # the input accept's variant first, then the others: a planned egress accept may be in another variant's
        # OUTPUT than the input accept (only this run's tag is removed, wherever it is)
        for ipt in dict.fromkeys([p["iptables"], "iptables", "iptables-legacy"]):
            if ipt != p["iptables"] and not (shutil.which(ipt) and shutil.which(ipt + "-save")):
                continue
            rc, out, _ = _run([ipt + "-save", "-t", "filter"])
            if rc != 0:
                continue
            for chain in ("INPUT", "OUTPUT"):  # OUTPUT: the egress accepts
                for args in iptables_tagged(out, comment, chain):
                    argv = [ipt, "-D", chain, *args]
                    if _run(argv)[0] == 0:
                        done.append(" ".join(argv))
    elif backend == "firewalld":
        for change in fwd_changes(p["changes"], cidr, p["zone"]):
            argv = fwd_argv(change, "remove", False)
            if _run(argv)[0] == 0:
                done.append(" ".join(argv))
    elif backend == "ufw":
        argv = ["ufw", "delete", "allow", "from", cidr]
        if _run(argv)[0] == 0:
            done.append(" ".join(argv))
    return done


def _starttime(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _armed(pidfile):
    """(pid, alive) of the recorded revert process."""
    try:
        with open(pidfile) as f:
            pid_s, start = f.read().split()[:2]
        pid = int(pid_s)
    except (OSError, ValueError):
        return None, False
    return pid, _starttime(pid) == start


def arm(module, p):
    pidfile = p["pidfile"]
    pid, alive = _armed(pidfile)
    if alive:
        module.fail_json(msg=f"a firewall revert is already armed on this node (PID {pid} in {pidfile}): another "
                             "ddpfix run is changing the firewall")
    for path in (pidfile, pidfile + DONE_SUFFIX):
        if os.path.exists(path):
            os.unlink(path)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # intermediate: new session, fork the revert process, exit
        try:
            os.close(r)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            os.chdir("/")
            os.environ["PATH"] = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin:/usr/bin:/bin"
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            me = os.getpid()
            with open(pidfile + ".tmp", "w") as f:
                f.write(f"{me} {_starttime(me)}\n")
            os.rename(pidfile + ".tmp", pidfile)
            os.write(w, str(me).encode())
            os.close(w)
            os.closerange(3, 4096)
            time.sleep(p["timeout"])
            done = revert(p)
            with open(pidfile + DONE_SUFFIX, "w") as f:
                what = "; ".join(done) or "nothing left to remove"
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} reverted after {p['timeout']}s: {what}\n")
            os.unlink(pidfile)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    got = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        got += chunk
    os.close(r)
    if not got:
        module.fail_json(msg="could not start the automatic firewall revert on the node")
    module.exit_json(changed=True, pid=int(got), pidfile=pidfile, timeout=p["timeout"])


def stop(pidfile):
    pid, alive = _armed(pidfile)
    if alive:
        os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            if _starttime(pid) is None:
                break
            time.sleep(0.05)
    if pid is not None and os.path.exists(pidfile):
        os.unlink(pidfile)
    return alive


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=["armed", "cancelled", "reverted"]),
            backend=dict(type="str", required=True, choices=["firewalld", "iptables", "nftables", "ufw"]),
            cidr=dict(type="str", required=True),
            comment=dict(type="str", default="ddpfix-cluster"),
            zone=dict(type="str", default="trusted"),
            changes=dict(type="list", elements="dict", default=[]),
            iptables=dict(type="str", default="iptables"),
            timeout=dict(type="int", default=90),
            pidfile=dict(type="path", default="/run/ddpfix-firewall-revert.pid"),
        ),
        supports_check_mode=False,
    )
    p = module.params
    if not is_ddpfix_comment(p["comment"]):
        module.fail_json(msg=f"comment must be ddpfix-cluster or a run's tag (ddpfix-cluster:RUN), "
                             f"got {p['comment']!r}")
    if p["backend"] == "firewalld":
        try:
            fwd_changes(p["changes"], p["cidr"], p["zone"])
        except ValueError as exc:
            module.fail_json(msg=f"{exc}; nothing changed")
    if p["state"] == "armed":
        if p["timeout"] < 5:
            module.fail_json(msg=f"ddpfix_firewall_revert_timeout must be at least 5 seconds, got {p['timeout']}")
        arm(module, p)
    if p["state"] == "cancelled":
        was_armed = stop(p["pidfile"])
        done = p["pidfile"] + DONE_SUFFIX
        if not was_armed and os.path.exists(done):
            with open(done) as f:
                msg = f.read().strip()
            module.fail_json(msg=f"the change was confirmed too late: the automatic revert already ran "
                                 f"(reverted: {msg})")
        module.exit_json(changed=was_armed)
    stop(p["pidfile"])
    removed = revert(p)
    module.exit_json(changed=bool(removed), removed=removed)


if __name__ == "__main__":
    main()
