#!/usr/bin/python
"""All the files remediation writes on one node in one call, under the node lock: hosts block, env file, cluster
file, and the limits drop-ins the controller rendered (then systemd's daemon-reload when a unit's drop-in changed)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_node_files
short_description: Write a node's planned files (hosts block, env file, cluster file, drop-ins) in one call, locked
description:
  - >-
    Takes (or, for the same run, refreshes) the ddpfix node lock (as C(ddpfix_run_lock state=present)), computes the
    new content of every file given (I(hosts): the C(ddpfix_hosts_file) block; I(env): the C(ddpfix_env_file) block;
    I(cluster_file) and each of I(files): a whole file), fails before writing any of them when one is refused or
    cannot be written (the pre-flight of C(ddpfix_run_lock state=writable)), then writes the changed ones, each backed
    up and atomically (a temporary file and a rename; a bind-mounted file is rewritten in place), runs
    C(systemctl daemon-reload) when a changed file of I(files) is a systemd unit's drop-in (I(reload); only where
    systemd runs), and releases the lock, also when it fails.
  - The env file's content (I(body)) is not logged in the node's journal and is returned redacted; its diff shows
    secret-looking values as C(***), as C(ddpfix_env_file) does.
  - Supports check mode (nothing is written; the lock is taken and released) and diff mode.
options:
  lock_path: {description: The node lock., type: path, default: /run/ddpfix.lock}
  lock_holder: {description: "The run (run_id required, pid, controller, command, started).", type: dict,
                required: true}
  lock_stale_minutes: {description: The lease of a remote holder (minutes)., type: int, default: 20}
  hosts:
    description: "The hosts block: C({path, entries}) as C(ddpfix_hosts_file) takes them; null: not written."
    type: dict
  env_path: {description: "The env file (as C(ddpfix_env_file)'s I(path)); null: not written.", type: path}
  body:
    description: "The env file's block (as C(ddpfix_env_file)'s I(body)): not logged, returned redacted."
    type: str
  adopt: {description: Add the block to an existing env file that ddpfix did not write., type: bool, default: false}
  env_mode: {description: Mode of a new env file., type: str, default: '0600'}
  cluster_file:
    description: >-
      A whole file: C({path, content, mode}) (the cluster file for C(ddpfix check --local)); null: not written.
    type: dict
  files:
    description: >-
      Whole files rendered on the controller (the limits drop-ins): each C({key, what, path, content, mode, reload}):
      C(key) the group the file belongs to, C(what) how remediate's report names its change, C(reload) true for a
      systemd unit's drop-in (systemd re-reads its units when one changed). Missing directories above a new file are
      created (0755).
    type: list
    elements: dict
    default: []
  backup: {description: Keep a timestamped backup of each file before changing it., type: bool, default: true}
  backup_keep: {description: How many backups of each file to keep., type: int, default: 5}
"""

EXAMPLES = r"""
- ddpfix_node_files:
    lock_holder: {run_id: 3f2a9c}
    env_path: /etc/ddpfix/ddp.env
    body: "MASTER_ADDR=192.168.77.11\nNODE_RANK=0\n"
    cluster_file: {path: /etc/ddpfix/cluster.json, content: "{}\n"}
"""

RETURN = r"""
files:
  description: "Per file (hosts, env, cluster_file, then I(files)), in that order: C(what), C(changed), C(diff)
    and the file's own module result (target, backup_file, ...)."
  returned: always
  type: list
daemon_reloaded: {description: Whether systemd re-read its units (a unit drop-in changed)., returned: always,
                  type: bool}
held: {description: Whether this run still holds the node lock (always false after the call)., returned: always,
       type: bool}
"""

import os

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_files import (
    WHAT,
    env_change,
    env_write,
    hosts_change,
    hosts_write,
    whole_change,
    whole_write,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import absent, present
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nolog import ContentModule
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_writable import unwritable


def changes(module, p):
    """[(key, change)] of the files given, computed (nothing written)."""
    out = []
    if p["hosts"] is not None:
        h = p["hosts"]
        out.append(("hosts", hosts_change(module, str(h.get("path") or "/etc/hosts"), list(h.get("entries") or []))))
    if p["env_path"] is not None:
        out.append(("env", env_change(module, p["env_path"], body=p["body"] or "", adopt=p["adopt"],
                                      mode=p["env_mode"])))
    if p["cluster_file"] is not None:
        c = p["cluster_file"]
        content = str(c.get("content") or "")
        if content and not content.endswith("\n"):
            content += "\n"  # a text file ends with a newline (the play passes the JSON without one)
        out.append(("cluster_file", whole_change(module, str(c.get("path") or ""), content,
                                                 str(c.get("mode") or "0644"))))
    for f in p["files"]:
        c = whole_change(module, str(f.get("path") or ""), str(f.get("content") or ""), str(f.get("mode") or "0644"),
                         make_dirs=True)
        c["what"], c["key"], c["reload"] = str(f.get("what") or ""), str(f.get("key") or "file"), bool(f.get("reload"))
        out.append(("file", c))
    return out


def daemon_reload(module):
    """systemd re-reads its units (a launcher unit's drop-in changed): True, or False where systemd does not run."""
    if not os.path.isdir(SYSTEMD_RUNNING):
        return False
    rc, out, err = module.run_command([module.get_bin_path("systemctl", required=True), "daemon-reload"])
    if rc != 0:
        module.fail_json(msg=f"the drop-ins were written, but systemctl daemon-reload failed: {(err or out).strip()}",
                         held=False)
    return True


WRITE = {"hosts": hosts_write, "env": env_write, "cluster_file": whole_write, "file": whole_write}
#: systemd runs here (sd_booted(3)): only then does a changed unit drop-in need a daemon-reload
SYSTEMD_RUNNING = "/run/systemd/system"


def main():
    module = ContentModule(  # the env block (body): not in the journal, returned redacted
        argument_spec=dict(
            lock_path=dict(type="path", default="/run/ddpfix.lock"),
            lock_holder=dict(type="dict", required=True),
            lock_stale_minutes=dict(type="int", default=20),
            hosts=dict(type="dict"),
            env_path=dict(type="path"),
            body=dict(type="str"),  # env content: no_log in the journal, redacted in the invocation (ContentModule)
            adopt=dict(type="bool", default=False),
            env_mode=dict(type="str", default="0600"),
            cluster_file=dict(type="dict"),
            files=dict(type="list", elements="dict", default=[]),
            backup=dict(type="bool", default=True),
            backup_keep=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    holder = p["lock_holder"] or {}
    if not holder.get("run_id"):
        module.fail_json(msg="lock_holder.run_id is required", held=False)
    if p["backup_keep"] < 1:
        module.fail_json(msg="backup_keep must be at least 1, got {}".format(p["backup_keep"]), held=False)
    lock, failure = present(p["lock_path"], holder, max(0, p["lock_stale_minutes"]) * 60, True)
    if failure:
        module.fail_json(held=False, **failure)
    try:  # the lock is released however this ends (fail_json and exit_json exit through here)
        todo = changes(module, p)
        bad = unwritable([c["target"] for _, c in todo if c["changed"]], [])
        if bad:
            module.fail_json(msg="cannot write: " + "; ".join(f"{k} ({v})" for k, v in sorted(bad.items()))
                             + "; nothing was written on this node", unwritable=bad, held=False)
        files = []
        for key, c in todo:
            if c["changed"] and not module.check_mode:
                WRITE[key](module, c, p["backup"], p["backup_keep"])
            path = c["result"].get("path") or c["target"]
            what = c["what"] if key == "file" else WHAT[key].format(path=path)
            files.append(dict(c["result"], what=what, key=c["key"] if key == "file" else key))
        reloaded = not module.check_mode and any(c.get("reload") and c["changed"] for _, c in todo) and daemon_reload(
            module)
        result = dict(changed=any(f["changed"] for f in files), files=files, lock=lock, held=False,
                      daemon_reloaded=bool(reloaded),
                      diff=[f["diff"] for f in files if f["changed"] and "diff" in f])
        notes = [f["ddpfix_note"] for f in files if f.get("ddpfix_note")]
        if notes:
            result["ddpfix_note"] = "; ".join(notes)
    finally:
        absent(p["lock_path"], holder)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
