#!/usr/bin/python
"""Documentation of the action plugin ddpfix_analyze (plugins/action/ddpfix_analyze.py); it runs on the controller."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_analyze
short_description: Find the cluster's findings from the nodes' facts; write the ddpfix report or plan the fixes
description:
  - "Runs on the controller (an action plugin; run it once, e.g. C(run_once: true)). It imports the C(ddpfix) Python
    package, which must be installed in the Python that runs Ansible (in AWX/AAP: in the execution environment); in a
    checkout of the repository the package is taken from C(controller/) next to the collection."
  - The cluster (master, ranks, cluster network, env file path) is the one the audit play's first task
    (C(ddpfix_cluster), registered as C(ddpfix_audit_cluster)) derived this run; without it (the analysis of a fact
    cache) it is derived from the inventory exactly as C(ddpfix) derives it (group C(ddp_nodes), C(ddp_*) variables;
    extra vars such as a survey's C(ddp_cluster_cidr) count).
  - The run is sequenced by C(ddpfix.pipeline), the module C(ddpfix audit) and C(ddpfix remediate) run, so both give
    the same findings, plan and refusals.
  - Each node's facts are C(hostvars[node].ansible_facts.ddpfix_node), returned by the C(ddpfix_facts) role.
    The probe result is inside those facts (C(ddpfix_node.probe)), in the facts task's result or, when the
    probers ran detached (forks below the number of nodes), folded there by the role's second task.
  - The checks, the report (C(ddpfix.report/v1), the document C(ddpfix audit --format json) writes) and the plan
    (what C(ddpfix remediate) passes C(remediate.yml)) are the C(ddpfix) package's own.
options:
  mode:
    description:
      - C(audit) reports the findings (and fails when one reaches I(fail_on)).
      - C(plan) returns the per-node fixes as C(vars) (C(ddpfix_plan), C(ddpfix_hosts), C(ddpfix_cidr), ...) for the
        plays of C(remediate.yml); it fails, and nothing is changed, where C(ddpfix remediate) refuses (values a node
        returned that ddpfix will not write, an unknown, IPv6 or unacknowledged broad cluster network).
    type: str
    choices: [audit, plan]
    default: audit
  facts_from:
    description:
      - C(run) reads the facts of this run's facts play. A node counts as read only when its facts task returned
        facts in this run (the registered C(ddpfix_facts_result)); facts a fact cache still holds from an earlier run
        never stand in for it. A node the facts play did not match is left out under C(--limit), else reported as
        not run (as C(ddpfix audit) does).
      - C(cache) reads every node's facts from the fact cache (the sliced pattern, facts gathered by earlier runs);
        a node without cached facts is reported as not read.
    type: str
    choices: [run, cache]
    default: run
  report:
    description: Write the C(ddpfix.report/v1) JSON document to this file on the controller (atomically). Empty, none.
    type: path
    default: ''
  fail_on:
    description: >-
      Fail when a finding of this severity or worse is reported (C(none) never fails); C(ddpfix audit --fail-on).
    type: str
    choices: [error, warning, info, none]
    default: warning
  skip:
    description: >-
      Accepted findings (C(ID) or C(ID@HOST), a list or comma-separated), besides the inventory's
      C(ddp_skip_findings).
    type: raw
    default: ''
  probe:
    description: Whether the facts play probed the network (the report then carries the connectivity matrix).
    type: bool
    default: true
  max_skew:
    description: Clock difference between nodes above which the clock-skew finding is reported, seconds.
    type: float
    default: 1.0
  apply:
    description: >-
      (plan) The fixes will be made (not a check run); a broad cluster network then needs its acknowledgement.
    type: bool
    default: false
  only:
    description:
      - (plan) Finding ids to fix (a list or comma-separated); empty, every fixable finding.
      - An unknown id or a detect-only one (nothing to fix) fails the task before anything is read, as
        C(ddpfix remediate --only) exits 2 (the same check, C(ddpfix.pipeline.parse_only)).
    type: raw
    default: ''
  allow_partial:
    description: (plan) Write env files even when some nodes were not read.
    type: bool
    default: false
  pin_ifnames:
    description: (plan) Also pin each node's cluster NIC name to its MAC with a systemd .link file.
    type: bool
    default: false
author: ddpfix maintainers
"""

EXAMPLES = r"""
- name: Findings of the cluster, as ddpfix audit reports them
  ddpfix.cluster.ddpfix_analyze:
    report: /var/tmp/ddpfix-report.json
    fail_on: warning
  run_once: true
"""

RETURN = r"""
findings:
  description: The findings (id, severity, host, message, evidence, fix...), as in the report.
  returned: always
  type: list
summary:
  description: "The report's summary: hosts, reachable, findings per severity, not evaluated."
  returned: mode=audit
  type: dict
report: {description: The report file written., returned: when I(report) is set, type: str}
vars: {description: The remediation plan (the variables of remediate.yml's fix plays)., returned: mode=plan, type: dict}
todo: {description: The nodes with something to fix., returned: mode=plan, type: list}
refused: {description: Fixes refused (as ddpfix remediate refuses them), in words., returned: mode=plan, type: list}
"""
