#!/usr/bin/python
"""Collect and stop a detached probe (the second, short audit round, used only when not every node runs at once)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_probe
short_description: Collect the result of a detached ddpfix prober and stop it (read-only)
description:
  - C(ddpfix_node_facts) with C(probe.detach) leaves a forked prober (listener and dialer) running on the node, so
    that peers that run later (forks below the number of nodes) still find its listener. This module waits up to
    I(wait) seconds for the prober to finish, stops it (SIGTERM; it writes what it has), returns its result and
    releases the node lock that C(ddpfix_node_facts) kept for it. Only that prober is signalled (by its PID and start
    time). Runs the same in check mode.
options:
  pid: {description: The prober's PID (facts C(ddpfix_node.probe.pid))., type: int, required: true}
  start:
    description: The prober's start time (field 22 of /proc/PID/stat; facts C(ddpfix_node.probe.start)).
    type: str
    required: true
  result_path:
    description:
      - Where the prober writes its result (facts C(ddpfix_node.probe.result_path)), in its private directory
        (C(ddpfix-probe-*), mode 0700, owned by this user); any other path is refused. The file and the directory
        are removed after the result is read.
    type: path
    required: true
  wait: {description: Seconds to wait for the prober to finish by itself., type: float, default: 5.0}
  lock_path: {description: The node lock to release., type: path, default: /run/ddpfix.lock}
  lock_holder: {description: This run (run_id); empty - no lock to release., type: dict, default: {}}
"""

EXAMPLES = r"""
- ddpfix.cluster.ddpfix_probe:
    pid: "{{ ansible_facts.ddpfix_node.probe.pid }}"
    start: "{{ ansible_facts.ddpfix_node.probe.start }}"
    result_path: "{{ ansible_facts.ddpfix_node.probe.result_path }}"
"""

RETURN = r"""
probe:
  description:
    - "The prober's result: connects (list of {name, address, port, kind, ok, error, attempts, first_try, last_try}),
      inbound, expected_inbound, up_at, down_at, and on a node with more than one candidate interface reach
      ({ifname: {address, speed, device, reached, failed}}, see C(ddpfix_node_facts)); or {error}."
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import absent as release_lock
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_probe import collect_detached


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pid=dict(type="int", required=True),
            start=dict(type="str", required=True),
            result_path=dict(type="path", required=True),
            wait=dict(type="float", default=5.0),
            lock_path=dict(type="path", default="/run/ddpfix.lock"),
            lock_holder=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        result, error = collect_detached(p["pid"], p["start"], p["result_path"], max(0.0, p["wait"]))
    finally:
        if (p["lock_holder"] or {}).get("run_id"):
            release_lock(p["lock_path"], p["lock_holder"])
    module.exit_json(changed=False, probe=result if result is not None else {"error": error})


if __name__ == "__main__":
    main()
