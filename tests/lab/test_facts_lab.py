"""Facts that could not be read are reported, never passed (issue 8, item 4), on real lab hosts.

The SSH user of one node is not root (no sudo, no become): it cannot run `iptables-save` or `nft`. The audit must
report `reachability_rules.INCOMPLETE` on that node naming the firewall layers and the tools' own errors, and list the firewall
checks as not evaluated there, although the node's firewall really blocks peers (as root the same audit reports
`firewall_rules.PEER_PORTS_BLOCKED`).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import set_host_vars

from ddpfix import lab
from ddpfix.cli import cli
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import reachability as reachability_rules

pytestmark = pytest.mark.lab

USER, UID = "ddpuser", 4242


def audit(inv: str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["-i", inv, "audit", *args], catch_exceptions=False)
    assert r.stdout, (r.exit_code, r.stderr)
    return r.exit_code, r.stdout


def add_ssh_user(info: Any, node: str) -> None:
    """A non-root login on `node` with the lab's key: lines in the node's private /etc, home under its private /run."""
    pub = info.private_key.with_name(info.private_key.name + ".pub").read_text()
    home = f"/run/{USER}"
    script = (
        f"echo '{USER}:x:{UID}:{UID}:ddpfix lab non-root user:{home}:/bin/sh' >> /etc/passwd && "
        f"echo '{USER}:x:{UID}:' >> /etc/group && "
        f"echo '{USER}:*:20000:0:99999:7:::' >> /etc/shadow && "
        f"mkdir -p {home}/.ssh && cat > {home}/.ssh/authorized_keys && "
        f"chmod 700 {home} {home}/.ssh && chmod 600 {home}/.ssh/authorized_keys && chown -R {UID}:{UID} {home}"
    )
    lab.node_exec(info.name, node, ["sh", "-c", script], input=pub)
    out = subprocess.run(["ssh", "-F", str(info.ssh_config), "-l", USER, node, "id -u"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == str(UID), out.stderr


def test_unreadable_firewall_is_reported_as_incomplete_not_clean(temp_lab: Any) -> None:
    info = temp_lab(nodes=3, scenario="iptables-worker")  # node3 rejects TCP to its ephemeral range
    inv = str(info.inventory)
    code, out = audit(inv, "--format", "json")
    root = json.loads(out)
    assert code == 1 and (firewall_rules.PEER_PORTS_BLOCKED.id, "node3") in {(f["id"], f["host"]) for f in root["findings"]}
    assert root["hosts"]["node3"]["not_evaluated"] == [] and root["hosts"]["node3"]["facts"]["unread"] == []

    add_ssh_user(info, "node3")
    set_host_vars(info, "node3", {"ansible_user": USER})
    code, out = audit(inv, "--format", "json")
    doc = json.loads(out)
    assert code == 1, doc["findings"]
    on3 = {f["id"]: f for f in doc["findings"] if f["host"] == "node3"}
    inc = on3[reachability_rules.INCOMPLETE.id]
    assert inc["severity"] == "warning" and not inc["fixable"]
    assert "Permission denied (you must be root)" in inc["evidence"], inc
    assert "Operation not permitted (you must be root)" in inc["evidence"], inc
    assert not any(i.startswith("firewall.") for i in on3), on3
    h3 = doc["hosts"]["node3"]
    assert {"iptables", "nft"} <= {u["source"] for u in h3["facts"]["unread"]}
    blind = {x["id"]: x["reason"] for x in h3["not_evaluated"]}
    assert {firewall_rules.PEER_PORTS_BLOCKED.id, firewall_rules.WORLD_OPEN.id} <= set(blind), blind
    assert "you must be root" in blind[firewall_rules.PEER_PORTS_BLOCKED.id]
    # the other nodes are read completely; the active probe still sees node3's block
    assert doc["hosts"]["node1"]["not_evaluated"] == [] and doc["hosts"]["node2"]["not_evaluated"] == []
    assert any(f["id"] == probes_rules.PEER_UNREACHABLE.id for f in doc["findings"]), doc["findings"]
    assert doc["summary"]["not_evaluated"] == len(blind)

    code, table = audit(inv)
    assert code == 1 and "NOT EVALUATED" in table and firewall_rules.PEER_PORTS_BLOCKED.id in table
