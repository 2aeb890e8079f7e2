"""Nodes on the interpreters of real distros (issue 35 item 3): five lab nodes whose ansible_python_interpreter is
Python 3.8 (Ubuntu 20.04), 3.9 (RHEL 9), 3.10 (Ubuntu 22.04), 3.12 (Ubuntu 24.04) and 3.13 (Debian 13), the pyenv
builds the lab makes visible in each node (`lab up --python`), with breakage on three of them: the iptables-worker2
rules on node2 (3.8) and hostname-loopback on node4 (3.9) and node5 (3.10). `audit` names each fault on its own
nodes, `remediate --apply` fixes them, the re-audit is clean, `verify --torch` passes (torch runs through
`ddp_python`, the lab nodes' interpreter (DDPFIX_LAB_PYTHON), on every node: apart from ansible_python_interpreter), a second apply
changes nothing.

Where the running ansible-core no longer runs modules on Python 3.8 (2.20 and later: its module_utils/basic.py
`_PY_MIN`), the audit must say so for node2 in one finding (reachability_rules.PYTHON_UNSUPPORTED, naming the node,
its Python and the ansible-core version) instead; node2 then gets the host's /usr/bin/python3 and the cycle goes on."""

from __future__ import annotations

from typing import Any

import pytest
from ansible.module_utils import basic as ansible_basic
from helpers import FAST_TORCH, add_inventory_vars, ddpfix_json, ids, need_node_torch, set_host_vars, sh_out

from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import reachability as reachability_rules

pytestmark = pytest.mark.lab

#: node -> the pyenv version its modules run on (node1 is the master)
PYTHONS = {"node1": "3.13", "node2": "3.8", "node3": "3.12", "node4": "3.9", "node5": "3.10"}
SCENARIO = "iptables-worker2,hostname-loopback"
#: the faults and the nodes they are on
EXPECTED = {firewall_rules.PEER_PORTS_BLOCKED.id: {"node2"}, hosts_rules.HOSTNAME_LOOPBACK.id: {"node4", "node5"}}


def hosts_of(doc: dict[str, Any], fid: str) -> set[str]:
    return {f["host"] for f in doc["findings"] if f["id"] == fid}


def dropped(version: str) -> bool:
    """Does the running ansible-core refuse modules on this node Python (its own `_PY_MIN`)?"""
    return tuple(int(x) for x in version.split(".")[:2]) < tuple(ansible_basic._PY_MIN)


@pytest.mark.torch
def test_nodes_on_python_3_8_to_3_13_audit_fix_verify(temp_lab: Any) -> None:
    need_node_torch()  # torch runs on the nodes (ddp_python), not in the controller's venv
    info = temp_lab(nodes=5, scenario=SCENARIO, wait_sync=False, pythons=PYTHONS)  # type: ignore[operator]
    add_inventory_vars(info, FAST_TORCH)
    inv = str(info.inventory)
    # each node runs its own pyenv build (read-only at its own path); torch stays on ddp_python
    for node, version in PYTHONS.items():
        interp = f"/root/.pyenv/versions/{version}"
        got = sh_out(info, node, f"{interp}*/bin/python{version} -c 'import sys; print(sys.version.split()[0])' && "
                                 f"for d in {interp}*; do touch $d/x; done 2>&1 || true")
        assert got.splitlines()[0].startswith(version + ".") and "Read-only file system" in got, (node, got)

    code, doc = ddpfix_json(inv, "audit")
    assert code == 1, doc["findings"]
    too_old = {n for n, v in PYTHONS.items() if dropped(v)}
    if too_old:  # this ansible-core dropped a node Python: one finding per such node, nothing read there
        assert hosts_of(doc, reachability_rules.PYTHON_UNSUPPORTED.id) == too_old, doc["findings"]
        for f in doc["findings"]:
            if f["id"] == reachability_rules.PYTHON_UNSUPPORTED.id:
                assert "\n" not in f["message"] and f"Python {PYTHONS[f['host']]}." in f["message"]
                assert f"ansible-core {reachability_rules.ansible_core_version()}" in f["message"], f
        assert not any(f["host"] in too_old for f in doc["findings"]
                       if f["id"] != reachability_rules.PYTHON_UNSUPPORTED.id), doc["findings"]
        for node in too_old:
            set_host_vars(info, node, {"ansible_python_interpreter": "/usr/bin/python3"})
        code, doc = ddpfix_json(inv, "audit")
        assert code == 1, doc["findings"]
    assert not hosts_of(doc, reachability_rules.PYTHON_UNSUPPORTED.id)
    for fid, nodes in EXPECTED.items():
        assert hosts_of(doc, fid) == nodes, (fid, doc["findings"])
    # nothing at warning or above on the nodes without a fault, other than what a peer sees of node2's firewall
    assert not {(f["id"], f["host"]) for f in doc["findings"] if f["host"] in ("node1", "node3")
                and f["severity"] != "info" and "node2" not in f"{f['message']} {f['evidence']}"}, doc["findings"]

    code, applied = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (applied["remaining_fixable"], applied["failed_hosts"], applied["refused"])
    assert {n for n, c in applied["changed"].items() if c} >= {"node2", "node4", "node5"}, applied["changed"]

    code, after = ddpfix_json(inv, "audit")
    assert code == 0 and not ids(after), after["findings"]
    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (v["checks"], v["torch"])
    assert len(v["torch"]) == 5 and all(r["ok"] and r["result"]["sum"] == 15.0 for r in v["torch"]), v["torch"]

    code, again = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and again["changed"] == {n.name: 0 for n in info.nodes}, again["changes"]
