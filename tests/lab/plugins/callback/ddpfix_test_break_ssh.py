"""Lab fault injection (test tree only, never shipped): cut SSH to one lab node right after ddpfix's runtime
firewall change there, the way a mistaken rule would.

Enabled by the lab test through the environment of the run (ANSIBLE_CALLBACK_PLUGINS=<this directory>,
ANSIBLE_CALLBACKS_ENABLED=ddpfix_test_break_ssh, DDPFIX_TEST_BREAK_SSH=<lab>:<node>). The role's change, its
confirmation and the cancel are one task (action ddpfix_fw_change), so no callback event falls between them: this
plugin, loaded in ansible-playbook's main process before any worker forks, wraps the ssh connection's `reset()`
(which the action calls right after the change, to confirm through a new connection). When the node's connection is
reset while a revert is armed there and rules accepting the lab's subnet tagged with a run's tag (ddpfix-cluster:RUN)
exist, it inserts a drop of TCP port 22 carrying that same tag into every chain that holds such a rule, once: the new
connection then fails, and the node's armed revert must remove both rules (this run's, nothing else) by itself.
"""

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: ddpfix_test_break_ssh
type: aggregate
short_description: lab fault injection - drop SSH after ddpfix's firewall change on one lab node
description: See the module docstring (tests/lab only).
requirements: [ddpfix.lab]
"""

PREFIX = "ddpfix-cluster:"
PIDFILE = "/run/ddpfix-firewall-revert.pid"


def _sh(lab_name, node, cmd):
    from ddpfix import lab

    return lab.node_exec(lab_name, node, ["sh", "-c", cmd], check=False)


def cut_ssh(lab_name, node, subnet):
    """Insert the tagged SSH drop next to this run's rules on the node (once; nothing when no revert is armed)."""
    if _sh(lab_name, node, f"test -e {PIDFILE}").returncode != 0:
        return
    cmds = []
    nft = _sh(lab_name, node, "nft -j list ruleset 2>/dev/null")
    rules = [it["rule"] for it in json.loads(nft.stdout or "{}").get("nftables", []) if "rule" in it]
    if any(str(r.get("comment", "")).startswith(PREFIX) and "'drop'" in repr(r.get("expr")) for r in rules):
        return  # cut already
    addr, plen = subnet.split("/")
    this_run = f"{{'addr': '{addr}', 'len': {plen}}}"  # ip saddr SUBNET, as nft -j shows it
    for r in rules:
        if not (str(r.get("comment", "")).startswith(PREFIX) and this_run in repr(r.get("expr"))):
            continue
        chain = [r["family"], r["table"], r["chain"]]
        cmds.append(["nft", "insert", "rule", *chain, "tcp", "dport", "22", "drop", "comment", f'"{r["comment"]}"'])
    for ipt in ("iptables", "iptables-legacy"):
        saved = _sh(lab_name, node, f"{ipt}-save -t filter 2>/dev/null").stdout
        if f'--comment "{PREFIX}' in saved and "--dport 22" in saved and "-j DROP" in saved:
            return  # cut already
        for line in saved.splitlines():
            if line.startswith(f"-A INPUT -s {subnet} ") and f'--comment "{PREFIX}' in line and "-j ACCEPT" in line:
                tag = line.split('--comment "', 1)[1].split('"', 1)[0]
                cmds.append([ipt, "-I", "INPUT", "1", "-p", "tcp", "--dport", "22", "-m", "comment", "--comment",
                             tag, "-j", "DROP"])
    from ddpfix import lab

    for argv in cmds:
        lab.node_exec(lab_name, node, argv)


def wrap_reset(lab_name, node, address, subnet):
    from ansible.plugins.connection import ssh

    original = ssh.Connection.reset
    if getattr(original, "_ddpfix_test_wrapped", False):
        return

    def reset(self):
        if (self.get_option("host") or self._play_context.remote_addr) == address:
            cut_ssh(lab_name, node, subnet)
        return original(self)

    reset._ddpfix_test_wrapped = True
    ssh.Connection.reset = reset


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddpfix_test_break_ssh"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        lab_name, _, node = os.environ.get("DDPFIX_TEST_BREAK_SSH", "").partition(":")
        if lab_name:
            from ddpfix import lab

            info = lab.info(lab_name)
            wrap_reset(lab_name, node, next(n.address for n in info.nodes if n.name == node), info.subnet)
