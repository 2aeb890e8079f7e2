"""Lab fault injection (test tree only, never shipped): cut SSH to one lab node right after ddpfix's runtime
firewall change there, the way a mistaken rule would.

Enabled by the lab test through the environment of the run (ANSIBLE_CALLBACK_PLUGINS=<this directory>,
ANSIBLE_CALLBACKS_ENABLED=ddpfix_test_break_ssh, DDPFIX_TEST_BREAK_SSH=<lab>:<node>). When the role's
ddpfix_fw_rule task reports a change on that node (not in check mode), this callback, on the controller and before
the play's next task starts, inserts a drop of TCP port 22 tagged with ddpfix's comment into every chain that got
ddpfix's rule: the role's fresh-connection check then fails, and its armed revert must remove both rules by itself.
"""

import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: ddpfix_test_break_ssh
type: aggregate
short_description: lab fault injection - drop SSH after ddpfix's firewall change on one lab node
description: See the module docstring (tests/lab only).
requirements: [ddpfix.lab]
"""

COMMENT = "ddpfix-cluster"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddpfix_test_break_ssh"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        lab_name, _, node = os.environ.get("DDPFIX_TEST_BREAK_SSH", "").partition(":")
        self._lab, self._node, self._done = lab_name, node, False

    def v2_runner_on_ok(self, result):
        task = result._task
        action = str(getattr(task, "resolved_action", None) or task.action)
        res = result._result
        if (self._done or not self._lab or result._host.get_name() != self._node
                or not action.endswith("ddpfix_fw_rule") or not res.get("changed") or task.check_mode is True):
            return
        from ddpfix import lab

        if res.get("chains"):  # nftables: every chain that got ddpfix's rule
            cmds = [["nft", "insert", "rule", *chain.split(), "tcp", "dport", "22", "drop", "comment", f'"{COMMENT}"']
                    for chain in res["chains"]]
        else:
            cmds = [[res.get("iptables") or "iptables", "-I", "INPUT", "1", "-p", "tcp", "--dport", "22", "-m",
                     "comment", "--comment", COMMENT, "-j", "DROP"]]
        for argv in cmds:
            lab.node_exec(self._lab, self._node, argv)
        self._done = True
