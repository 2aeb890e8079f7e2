"""Fleet shapes the single-network lab does not have (issue 21): a management network for SSH and a separate data
network as the cluster CIDR, with per-node data NIC names and a node with two data addresses.

One lab (`multi-homed,iptables-worker2,isolated-nic`): the audit finds the real faults (node2's firewall, on the
data network; node3's env file naming iso0, a cluster-network interface on a link to nowhere, which the interface
reach probe shows reaching no peer while node3's data NIC reaches them all) and nothing false (no probe of a
management address, no management route, no name "mismatch"); with node2's firewall fixed alone (`--only`),
`verify --torch` still fails, on iso0 alone (the peers cannot dial the address node3's rank advertises);
`remediate --apply` fixes the rest with env files naming each node's data NIC (node3's with a
`# GLOO_SOCKET_IFNAME:` line saying why); the audit is clean (also with forks below the node count, where the
probers run detached), torch passes over the data network, and a second apply changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import FAST_TORCH, add_inventory_vars, ddpfix_json, handmade_env, ids, need_node_torch
from test_lab_scenarios import check_isolated_nic

from ddpfix import lab
from ddpfix.lab.scenarios.sites import DATA_IFNAMES, ISO_IFNAME, data_address, data_network
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import netif as netif_rules
from ddpfix.rules import probes as probes_rules

pytestmark = pytest.mark.lab

#: Findings a management/data split must never produce (the probes and routes are about the data network).
FALSE_ON_MULTI_HOMED = {probes_rules.MASTER_PORT_UNREACHABLE.id, net_rules.VIA_GATEWAY.id, hosts_rules.PEER_MISMATCH.id,
                        hosts_rules.PEER_UNRESOLVABLE.id}


def env_of(info: Any, node: str) -> dict[str, str]:
    text = lab.node_exec(info.name, node, ["cat", "/etc/ddpfix/ddp.env"]).stdout
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.startswith("#"))


@pytest.mark.torch
def test_management_and_data_network_fixed_end_to_end(temp_lab: Any) -> None:
    need_node_torch()
    info = temp_lab(nodes=3, scenario="multi-homed,iptables-worker2,isolated-nic", wait_sync=False)
    add_inventory_vars(info, FAST_TORCH)
    inv = str(info.inventory)
    handmade_env(info)  # env files as people write them: MASTER_ADDR the master's SSH address, no interfaces
    # ... but node3's operator named its socket interface: iso0, which holds a data-network address
    pinned = "".join(f"{k}={ISO_IFNAME}\n" for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"))
    lab.node_exec(info.name, "node3", ["sh", "-c", "cat >> /etc/ddpfix/ddp.env"], input=pinned)
    check_isolated_nic(info)  # a connect from iso0's address (or bound to iso0) reaches no peer: no ARP quirk

    code, before = ddpfix_json(inv, "audit")
    found = {(f["id"], f["host"]) for f in before["findings"]}
    assert code == 1 and (firewall_rules.PEER_PORTS_BLOCKED.id, "node2") in found, before["findings"]
    assert not {i for i, _ in found} & FALSE_ON_MULTI_HOMED, before["findings"]
    # names resolve to management addresses: said once, for the cluster, as information
    (names,) = [f for f in before["findings"] if f["id"] == hosts_rules.PEER_NAME_OTHER_NETWORK.id]
    assert names["host"] is None and names["severity"] == "info", names
    assert f"node1 -> {info.nodes[0].address} on node2 (node1's eth0" in names["evidence"], names
    (iso,) = [f for f in before["findings"] if f["id"] == netif_rules.CANNOT_REACH_PEERS.id and f["host"] == "node3"]
    assert iso["message"].startswith(f"{ISO_IFNAME} (GLOO_SOCKET_IFNAME={ISO_IFNAME}"), iso
    assert f"{DATA_IFNAMES[2]} {data_address(info.subnet, 3)}: reached node1, node2" in iso["evidence"], iso
    assert f"{ISO_IFNAME} " in iso["evidence"] and "reached none; failed node1" in iso["evidence"], iso
    assert iso["fixable"] and f"GLOO_SOCKET_IFNAME={DATA_IFNAMES[2]}" in iso["fix"], iso

    # node2's firewall fixed alone first (the env files stay as they are): torch then fails because of node3's iso0
    # alone. Its rank advertises iso0's address, which no peer can reach: node1's and node2's Gloo full mesh times
    # out dialling it ("No route to host"), node3 waits until the launcher's hard limit.
    code, fw = ddpfix_json(inv, "remediate", "--apply", "--only", firewall_rules.PEER_PORTS_BLOCKED.id)
    assert code == 1 and fw["changed"]["node2"] > 0 and fw["changed"]["node3"] == 0, fw["changes"]  # env: open
    code, v = ddpfix_json(inv, "verify", "--torch", "--no-checks")
    iso_addr = str(data_network(info.subnet).network_address + 203)  # sites.isolated_address for node3
    failed = {r["host"]: r for r in v["torch"] if not r["ok"]}
    assert code == 1 and {"node1", "node2"} <= failed.keys(), v["torch"]
    assert all(f"remote=[{iso_addr}]" in failed[n]["error"] for n in ("node1", "node2")), v["torch"]

    code, applied = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (applied["remaining_fixable"], applied["failed_hosts"], applied["refused"])
    master_data = str(data_address(info.subnet, 1))
    for i, node in enumerate(info.nodes, 1):
        env = env_of(info, node.name)
        ifname = DATA_IFNAMES[i - 1]
        assert env["MASTER_ADDR"] == master_data, env
        assert env["GLOO_SOCKET_IFNAME"] == ifname and env["NCCL_SOCKET_IFNAME"] == f"={ifname}", env
    text = lab.node_exec(info.name, "node3", ["cat", "/etc/ddpfix/ddp.env"]).stdout
    why = f"# GLOO_SOCKET_IFNAME: {DATA_IFNAMES[2]} reached every probed peer (node1, node2);"
    assert why in text and f"{ISO_IFNAME} did not reach node1, node2" in text, text

    code, after = ddpfix_json(inv, "audit", "--forks", "1")  # probers detached: the second task collects them
    assert code == 0 and not ids(after), after["findings"]

    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (v["checks"], v["torch"])
    assert all(r["ok"] and r["result"]["sum"] == 6.0 for r in v["torch"]), v["torch"]

    code, again = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and again["changed"] == {n.name: 0 for n in info.nodes}, again["changes"]

