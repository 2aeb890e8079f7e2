#!/usr/bin/python
"""The ddpfix node lock (one run at a time per node) and the remediation write pre-flight."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_run_lock
short_description: Take or release the ddpfix node lock; check that files can be written
description:
  - >-
    C(state=present) creates I(path) (a JSON file naming the holder run: its run id, PID, PID start time, boot id,
    PID namespace and host; and this node's boot id, the time it was taken and last refreshed) unless another run
    holds it. The same run taking it again refreshes it (each ddpfix play and each audit facts task does). Another
    run's lock is taken over only when its holder is gone, and the result says why (C(taken_over.stale)): the node
    rebooted since; or the holder runs on this node (same boot id and PID namespace) and its PID no longer runs with
    that start time; or the holder is remote and did not refresh it for I(stale_minutes) (its lease). The lock
    lives in /run (tmpfs): a reboot clears it.
  - >-
    Where the lock cannot be written (read-only /run, no permission) the call fails (C(unlockable)) unless
    I(required) is false: a node the run will write to is refused, never changed without its lock.
  - C(state=absent) removes I(path) when this run holds it (never another run's lock).
  - >-
    C(state=writable) fails when one of I(paths) cannot be written: a read-only file system (a read-only bind mount
    too), an immutable (C(chattr +i)) or append-only (C(chattr +a)) file or directory, no permission, a file system
    without room for the new file and its backup (blocks or inodes), a missing directory that cannot be created (its
    nearest existing parent fails these checks or is not a directory), a dangling symlink. It checks the file
    itself and its directory (ddpfix writes atomically: a temporary file, then a rename), or the nearest existing
    parent when the file does not exist yet. Changes nothing.
options:
  state: {description: present, absent or writable., type: str, choices: [present, absent, writable], default: present}
  path: {description: The lock file., type: path, default: /run/ddpfix.lock}
  holder:
    description: "The run: run_id (required for present/absent), pid, controller, command, started."
    type: dict
    default: {}
  stale_minutes:
    description: The lease of a remote holder, minutes; its lock not refreshed for this long is taken over.
    type: int
    default: 20
  required:
    description: Fail (the node is refused) when the lock cannot be written; false - go on without it (read-only).
    type: bool
    default: true
  paths:
    description: >-
      Files to check (state=writable; with state=present, checked under the lock in the same call: the remediation
      pre-flight).
    type: list
    elements: path
    default: []
  release:
    description: >-
      state=present: release the lock again at the end of the call (a node whose pre-flight is all this play does
      under its lock: lock, pre-flight and unlock in one call). The result's C(held) says whether the run still holds
      it.
    type: bool
    default: false
  if_present:
    description:
      - >-
        Groups of files checked like I(paths) only when the group's first file exists (state=writable), for files
        written only where they exist (firewall persistence). An entry is a path (a group of one), a list of paths,
        or a mapping whose values are the paths in order (an nftables layout, C({config, include})).
    type: list
    elements: raw
    default: []
"""

EXAMPLES = r"""
- ddpfix_run_lock:
    holder:
      run_id: 3f2a9c
      pid: 4242
      controller: ops1
      command: ddpfix audit -i inv
      started: "2026-01-01T10:00:00+0000"
"""

RETURN = r"""
holder: {description: The lock's holder after the call (state=present), returned: always, type: dict}
taken_over:
  description: The stale holder that was replaced (with C(stale), why it was stale), or null.
  returned: state=present
  type: dict
refreshed: {description: This run held the lock already (its lease was renewed)., returned: state=present, type: bool}
held: {description: This run holds the lock after the call (state=present)., returned: state=present, type: bool}
unwritable: {description: "path -> reason (state=writable)", returned: state=writable, type: dict}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import absent
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import present as take
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_writable import unwritable


def present(module, path, holder, stale_s, required=True):
    """Take the lock (module_utils ddpfix_lock, shared with ddpfix_node_facts); fail when another live run holds it
    or, when `required`, when it cannot be written here."""
    result, failure = take(path, holder, stale_s, required)
    if failure:
        module.fail_json(**failure)
    return result


def groups(item):
    """An if_present entry as a list of paths: a path alone, a list, or a mapping's values in order."""
    if isinstance(item, dict):
        return [str(v) for v in item.values() if v]
    if isinstance(item, (list, tuple)):
        return [str(v) for v in item if v]
    return [str(item)] if item else []


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent", "writable"], default="present"),
            path=dict(type="path", default="/run/ddpfix.lock"),
            holder=dict(type="dict", default={}),
            stale_minutes=dict(type="int", default=20),
            required=dict(type="bool", default=True),
            paths=dict(type="list", elements="path", default=[]),
            if_present=dict(type="list", elements="raw", default=[]),
            release=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["state"] == "writable":
        bad = unwritable(p["paths"], [groups(g) for g in p["if_present"]])
        if bad:
            module.fail_json(msg="cannot write: " + "; ".join(f"{k} ({v})" for k, v in sorted(bad.items()))
                             + "; nothing was changed on any node", unwritable=bad)
        module.exit_json(changed=False, unwritable={})
    holder = p["holder"] or {}
    if not holder.get("run_id"):
        module.fail_json(msg="holder.run_id is required")
    if p["state"] == "absent":
        module.exit_json(changed=False, released=absent(p["path"], holder))
    result = present(module, p["path"], holder, max(0, p["stale_minutes"]) * 60, p["required"])
    # the pre-flight under the lock, in the same call: paths/if_present checked as state=writable does
    bad = unwritable(p["paths"], [groups(g) for g in p["if_present"]]) if p["paths"] or p["if_present"] else {}
    if p["release"]:
        result["released"] = absent(p["path"], holder)
    result["held"] = not p["release"]
    if bad:
        module.fail_json(msg="cannot write: " + "; ".join(f"{k} ({v})" for k, v in sorted(bad.items()))
                         + "; nothing was changed on any node", unwritable=bad, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
