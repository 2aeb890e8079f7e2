#!/usr/bin/python
"""Documentation of the action plugin ddpfix_fw_change (plugins/action/ddpfix_fw_change.py); it runs on the
controller and runs the node-side modules it names."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_fw_change
short_description: One node's guarded runtime firewall change - arm the revert, change, confirm by a new connection
description:
  - An action plugin. For the node it runs on, in this one task - arms the node's automatic revert
    (M(ddpfix.cluster.ddpfix_fw_guard), I(timeout) seconds), makes the runtime change (M(ddpfix.cluster.ddpfix_fw_rule)
    for C(iptables)/C(nftables), M(ddpfix.cluster.ddpfix_fw_firewalld) at runtime, M(community.general.ufw)), drops
    the SSH connection (ControlPersist master included) and cancels the revert through a NEW connection from the
    controller, retried until I(confirm_timeout) seconds after the change.
  - The span from a node's arm to its cancel is that node's alone (a few seconds), whatever the number of nodes,
    C(forks), C(serial) or the strategy - a sequence of tasks could not bound it (the linear strategy runs each task
    on every host, in batches of C(forks), before the next task starts).
  - When no new connection gets through (SSH really lost), the task fails and the node removes this run's change by
    itself when I(timeout) runs out. When the change module fails, this run's rules are removed at once.
  - The rules carry this run's tag C(ddpfix-cluster:RUN_ID); a revert removes only rules with that tag, so rules
    confirmed by earlier runs (or loaded at boot from the persisted files, tagged C(ddpfix-cluster)) stay.
  - Check mode - runs only the change module in check mode (its diff); nothing is armed.
options:
  backend: {description: Layer to change., type: str, required: true, choices: [firewalld, ufw, iptables, nftables]}
  cidr: {description: Cluster network (the only source given access)., type: str, required: true}
  zone: {description: firewalld zone that gets I(cidr) as a source (when I(firewalld_changes) is empty)., type: str,
         default: trusted}
  firewalld_changes:
    description: firewalld - the changes of the plan (M(ddpfix.cluster.ddpfix_fw_firewalld)'s I(changes)), made at
      runtime; the revert removes exactly them.
    type: list
    elements: dict
    default: []
  iptables_variant:
    description: iptables flavour for M(ddpfix.cluster.ddpfix_fw_rule).
    type: str
    default: auto
    choices: [auto, legacy, nft]
  egress:
    description: nftables/iptables - the planned egress accepts (M(ddpfix.cluster.ddpfix_fw_rule)'s I(egress)).
    type: list
    elements: dict
    default: []
  ingress: {description: Whether the cluster is let in too (M(ddpfix.cluster.ddpfix_fw_rule)'s I(ingress))., type: bool,
            default: true}
  nft_chains:
    description: nftables - the planned input base chains (M(ddpfix.cluster.ddpfix_fw_rule)'s I(nft_chains)).
    type: list
    elements: dict
    default: []
  iptables: {description: iptables command of the variant the revert removes the rule with., type: str,
             default: iptables}
  timeout: {description: Seconds from the arm until the node reverts by itself (at least 5)., type: int,
            required: true}
  confirm_timeout:
    description: Seconds after the change within which a new connection must confirm it (0 - half of I(timeout), at
      least 5).
    type: int
    default: 0
  run_id:
    description: The run's id, part of the rules' tag (1-40 letters, digits, C(.), C(_), C(-)); empty - a random one
      for this node and change.
    type: str
    default: ""
author: ddpfix
"""

EXAMPLES = r"""
- name: Accept the cluster network, reverted by the node unless a new connection confirms it
  ddpfix.cluster.ddpfix_fw_change:
    backend: nftables
    cidr: 192.168.77.0/24
    timeout: 90
    run_id: 3f2a9c
"""

RETURN = r"""
run_tag: {description: The tag of the rules this run added (C(ddpfix-cluster:RUN_ID))., type: str, returned: always}
confirmed_after_s:
  description: Seconds from the change until a new connection cancelled the revert.
  type: float
  returned: when changed and confirmed
revert_timeout: {description: I(timeout)., type: int, returned: when changed and confirmed}
diff: {description: The change module's diff., type: dict, returned: when the change module returns one}
"""
