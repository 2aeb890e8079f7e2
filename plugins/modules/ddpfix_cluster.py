#!/usr/bin/python
"""Documentation of the action plugin ddpfix_cluster (plugins/action/ddpfix_cluster.py); it runs on the controller."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_cluster
short_description: The cluster as ddpfix derives it from the inventory, validated, before any node is contacted
description:
  - "Runs on the controller (an action plugin; run it once, e.g. C(run_once: true)); it contacts no node. It imports
    the C(ddpfix) Python package, as M(ddpfix.cluster.ddpfix_analyze) does."
  - Derives the cluster from the inventory the play sees (group C(ddp_nodes), else every host; the C(ddp_*)
    variables, extra vars included) and validates it exactly as C(ddpfix) does. An invalid value fails the task
    with one line naming the variable and the value, and C(ddpfix_exit_code) (2, invalid input).
  - "Takes the ddpfix controller lock of the cluster (its sorted node addresses) for the C(ansible-playbook) that runs
    it, until that process exits: a second run on the same nodes, from the CLI or from C(ansible-playbook), fails
    this task (C(ddpfix_exit_code) 5, naming the holder) before any node is contacted. Not taken when the
    environment variable C(DDPFIX_CLUSTER_LOCK) names that cluster (the C(ddpfix) CLI holds it). When the C(ddpfix)
    CLI started the C(ansible-playbook) (C(DDPFIX_LOCK_OWNER): its PID and a pipe its command holds open), the lock
    is kept until that command ends, so
    its later runs (the apply and the re-audit of C(ddpfix remediate)) stay under it."
  - The audit play runs it first and hands the result to the facts role; the C(ddpfix) CLI builds its own view of
    the cluster from the returned C(inventory), so the inventory is read once per run, by C(ansible-playbook).
  - "With O(facts) (the facts role's settings), it also returns what the facts task of every node shares
    (C(facts_plan)): the audit play then needs no second controller-side task before the facts."
options:
  facts:
    description:
      - "The facts role's settings the facts task of every node shares: C(lock_path), C(lock_holder),
        C(lock_stale_minutes), C(nofile_path), C(profile), C(probe), C(peers), C(port), C(timeout), C(wait),
        C(hold), C(forks) (the role's C(ddpfix_facts_*) variables of those names, as the audit play passes them)."
    type: dict
    required: false
author: ddpfix
"""

EXAMPLES = r"""
- name: The cluster as ddpfix derives it
  ddpfix.cluster.ddpfix_cluster:
  register: cluster
  run_once: true
"""

RETURN = r"""
master:
  description: The master node (C(ddp_master), else the first node).
  type: str
  returned: success
master_port:
  description: C(ddp_master_port).
  type: int
  returned: success
cluster_cidr:
  description: C(ddp_cluster_cidr), or an empty string (the master's subnet, known once facts are read).
  type: str
  returned: success
env_path:
  description: The env file's path on the nodes.
  type: str
  returned: success
order:
  description: The nodes in rank order.
  type: list
  elements: str
  returned: success
addresses:
  description: "C({node: address}) peers dial (C(ansible_host), else the name)."
  type: dict
  returned: success
inventory:
  description: The group tree and the nodes' C(ddp_*) variables and C(ansible_host), in C(ansible-inventory --list)'s
    shape.
  type: dict
  returned: success
probe_from_facts:
  description: Whether the probes wait for the nodes' facts (a cluster network that some inventory address is not in).
  type: bool
  returned: success
facts_plan:
  description: "With O(facts): those settings, converted, with C(hosts) (the play's) and C(master_address): the input of
    filter C(ddpfix.cluster.ddpfix_facts_args) together with this result."
  type: dict
  returned: when O(facts) is given
ddpfix_exit_code:
  description: The exit code C(ddpfix) gives this error (2, invalid input).
  type: int
  returned: failure
"""
