"""Fleet shapes the single-network lab does not have (issue 21): a management network for SSH and a separate data
network as the cluster CIDR, with per-node data NIC names and a node with two data addresses.

One lab (`multi-homed,iptables-worker2`): the audit finds the real fault (node2's firewall, on the data network)
and nothing false (no probe of a management address, no management route, no name "mismatch"); `verify --torch`
fails; `remediate --apply` fixes it with env files naming the data network; the audit is clean (also with forks
below the node count, where the probers run detached), torch passes over the data network, and a second apply
changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_remediate_lab import FAST_TORCH, add_inventory_vars, ddpfix_json, handmade_env, ids

from ddpfix import lab
from ddpfix.lab.scenarios import DATA_IFNAMES, data_address

pytestmark = pytest.mark.lab

#: Findings a management/data split must never produce (the probes and routes are about the data network).
FALSE_ON_MULTI_HOMED = {"probe.master-port-unreachable", "route.via-gateway", "hosts.peer-mismatch",
                        "hosts.peer-unresolvable"}


def env_of(info: Any, node: str) -> dict[str, str]:
    text = lab.node_exec(info.name, node, ["cat", "/etc/ddpfix/ddp.env"]).stdout
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.startswith("#"))


@pytest.mark.torch
def test_management_and_data_network_fixed_end_to_end(temp_lab: Any) -> None:
    pytest.importorskip("torch")
    info = temp_lab(nodes=3, scenario="multi-homed,iptables-worker2", wait_sync=False)
    add_inventory_vars(info, FAST_TORCH)
    inv = str(info.inventory)
    handmade_env(info)  # env files as people write them: MASTER_ADDR the master's SSH address, no interfaces

    code, before = ddpfix_json(inv, "audit")
    found = {(f["id"], f["host"]) for f in before["findings"]}
    assert code == 1 and ("firewall.peer-ports-blocked", "node2") in found, before["findings"]
    assert not {i for i, _ in found} & FALSE_ON_MULTI_HOMED, before["findings"]
    # names resolve to management addresses: said once, for the cluster, as information
    (names,) = [f for f in before["findings"] if f["id"] == "hosts.peer-name-other-network"]
    assert names["host"] is None and names["severity"] == "info", names
    assert f"node1 -> {info.nodes[0].address} on node2 (node1's eth0" in names["evidence"], names

    code, v = ddpfix_json(inv, "verify", "--torch", "--no-checks")
    assert code == 1 and not all(r["ok"] for r in v["torch"]), v["torch"]

    code, applied = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (applied["remaining_fixable"], applied["failed_hosts"], applied["refused"])
    master_data = str(data_address(info.subnet, 1))
    for i, node in enumerate(info.nodes, 1):
        env = env_of(info, node.name)
        ifname = DATA_IFNAMES[i - 1]
        assert env["MASTER_ADDR"] == master_data, env
        assert env["GLOO_SOCKET_IFNAME"] == ifname and env["NCCL_SOCKET_IFNAME"] == f"={ifname}", env

    code, after = ddpfix_json(inv, "audit", "--forks", "1")  # probers detached: the second task collects them
    assert code == 0 and not ids(after), after["findings"]

    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (v["checks"], v["torch"])
    assert all(r["ok"] and r["result"]["sum"] == 6.0 for r in v["torch"]), v["torch"]

    code, again = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and again["changed"] == {n.name: 0 for n in info.nodes}, again["changes"]

