"""The smoke test of an ansible-core version (issue 23 item 1: versions claimed = versions tested): on 3 lab nodes
with one fault (iptables rules on node2 that block the peers' ephemeral ports), `audit` finds it, `remediate --apply`
fixes it (the guarded firewall change, the env files, the cluster lock and the node locks) and `verify --torch`
passes (the end-state checks and a real all-reduce).

It runs where ansible-core is not the main venv's: scripts/test-oldest.sh sets DDPFIX_VERSION_SMOKE=1 and runs it
with .venv-oldest (the oldest claimed ansible-core). The main suite covers the same commands on its own
ansible-core in test_remediate_lab.py, so there it is skipped (no lab time added to the main suite)."""

from __future__ import annotations

import os

import ansible.release
import pytest
from helpers import FAST_TORCH, add_inventory_vars, ddpfix_json, ids

from ddpfix.rules import firewall as firewall_rules

pytestmark = pytest.mark.lab

if os.environ.get("DDPFIX_VERSION_SMOKE") != "1":
    pytest.skip("the version smoke test runs in scripts/test-oldest.sh (DDPFIX_VERSION_SMOKE=1)",
                allow_module_level=True)


def test_audit_remediate_verify_torch_on_this_ansible_core(temp_lab: object) -> None:
    info = temp_lab(nodes=3, scenario="iptables-worker2")  # type: ignore[operator]
    add_inventory_vars(info, FAST_TORCH)
    inv = str(info.inventory)
    version = ansible.release.__version__
    code, doc = ddpfix_json(inv, "audit")
    assert code == 1 and firewall_rules.PEER_PORTS_BLOCKED.id in ids(doc), (version, doc["findings"])
    code, doc = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and sum(doc["changed"].values()) > 0, (version, doc.get("failed_hosts"), doc.get("refused"))
    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (version, v["checks"], v["torch"])
    assert all(r["ok"] and r["result"]["sum"] == 6.0 for r in v["torch"]), (version, v["torch"])
