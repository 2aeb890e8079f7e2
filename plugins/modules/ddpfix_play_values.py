#!/usr/bin/python
"""Documentation of the action plugin ddpfix_play_values (plugins/action/ddpfix_play_values.py); it runs on the
controller."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_play_values
short_description: Values every host of a play shares, templated once, set on no host's facts
description:
  - "Runs on the controller (an action plugin; run it with C(run_once: true) and C(register)); it contacts no node.
    It returns its C(data) as it received it (templated once, on the first host), and the registered result is every
    host's."
  - "The safe form of a C(run_once) C(ansible.builtin.set_fact): on ansible-core 2.21 every host of a C(run_once)
    set_fact gets the same object as its cacheable facts when it has none cached yet, so the next module that returns
    facts on one host writes them for all such hosts (ansible/ansible#87148). This action sets no facts."
options:
  data:
    description: The values, a mapping (templated once).
    type: dict
    required: true
author: ddpfix
"""

EXAMPLES = r"""
- name: What every node's task shares, decided once for the play
  ddpfix.cluster.ddpfix_play_values:
    data:
      master: "{{ ddp_master }}"
  register: shared
  run_once: true
"""

RETURN = r"""
data:
  description: The C(data) option as the task received it.
  type: dict
  returned: success
"""
