#!/usr/bin/python
"""firewalld: the cluster network as a zone source, or ddpfix's rich rule in a zone or policy (runtime or
permanent), as the controller's plan names them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_fw_firewalld
short_description: Make firewalld let the cluster network in (and out) where the plan says
description:
  - Each change of I(changes) is a dict with C(zone) or C(policy) (a firewalld name, 1-17 letters, digits, C(_),
    C(-)) and C(source) (the cluster network I(cidr), as a source of the zone) or C(rich_rule) (one of ddpfix's two
    rules - C(rule family="ipv4" source address="CIDR" accept) in a zone, C(rule family="ipv4" destination
    address="CIDR" accept) in a policy from HOST). Nothing else is accepted. An empty list - I(cidr) as a source
    of I(zone).
  - Each change is queried first (C(firewall-cmd --query-...)) and added only when missing; I(state=absent) removes
    them. firewall-cmd is run with an argument list, never through a shell.
  - Check mode and I(plan_only) - only the queries; C(pending) lists what is missing.
options:
  changes: {description: The plan's changes., type: list, elements: dict, default: []}
  cidr: {description: The cluster network., type: str, required: true}
  zone: {description: Zone of the default change (an empty I(changes))., type: str, default: trusted}
  permanent: {description: Change the permanent configuration (else the runtime one)., type: bool, default: false}
  state: {description: Add or remove., type: str, default: present, choices: [present, absent]}
  plan_only: {description: Only report what is missing., type: bool, default: false}
author: ddpfix
"""

EXAMPLES = r"""
- name: The cluster network in the zone that already holds it
  ddpfix.cluster.ddpfix_fw_firewalld:
    cidr: 192.168.83.0/24
    changes:
      - {zone: internal, rich_rule: 'rule family="ipv4" source address="192.168.83.0/24" accept'}
    permanent: true
"""

RETURN = r"""
pending: {description: The changes that were missing (before this run's change)., type: list, returned: always}
commands: {description: The firewall-cmd commands run to change something., type: list, returned: always}
"""

import subprocess

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fw import fwd_argv, fwd_changes


def _run(argv):
    p = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            changes=dict(type="list", elements="dict", default=[]),
            cidr=dict(type="str", required=True),
            zone=dict(type="str", default="trusted"),
            permanent=dict(type="bool", default=False),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            plan_only=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        changes = fwd_changes(p["changes"], p["cidr"], p["zone"])
    except ValueError as exc:
        module.fail_json(msg=f"{exc}; nothing changed")
    want = p["state"] == "present"
    pending, commands, errors = [], [], []
    for c in changes:
        rc, out, err = _run(fwd_argv(c, "query", p["permanent"]))
        if rc not in (0, 1):
            module.fail_json(msg="{} failed (rc {}): {}".format(" ".join(fwd_argv(c, "query", p["permanent"])), rc,
                                                               (err or out).strip()[:300]))
        if (rc == 0) != want:
            pending.append(c)
    if not (module.check_mode or p["plan_only"]):
        for c in pending:
            argv = fwd_argv(c, "add" if want else "remove", p["permanent"])
            rc, out, err = _run(argv)
            commands.append(" ".join(argv))
            if rc != 0:
                errors.append("{} (rc {}): {}".format(" ".join(argv), rc, (err or out).strip()[:300]))
    layer = "permanent" if p["permanent"] else "runtime"
    diff = {"before": "", "after": "".join(
        "firewalld {} {} {} {}: {}\n".format(layer, c[0], c[1], "+" if want else "-", c[3]) for c in pending)}
    result = dict(changed=bool(pending) and not p["plan_only"], pending=[
        {c[0]: c[1], ("source" if c[2] == "source" else "rich_rule"): c[3]} for c in pending], commands=commands,
        diff=diff)
    if errors:
        module.fail_json(msg="; ".join(errors), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
