"""Issue 8 items 5 and 6 on real lab hosts: partial runs (--limit, a node down) and refused inputs.

Every refusal: exit 2, one line naming the variable (or host and fact) and the value, and every node's /etc and
rule sets unchanged (`snapshot`). The CLI is invoked as documented (`ddpfix -i INV ... remediate --apply`).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ddpfix, ddpfix_json, snapshot
from test_lab_scenarios import check_hostname_claim

from ddpfix import lab
from ddpfix.rules import env as env_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import reachability as reachability_rules

pytestmark = pytest.mark.lab


def _inventory_with(info: Any, tmp: Path, groupvars: dict[str, Any], hostvars: dict[str, Any] | None = None) -> str:
    doc = yaml.safe_load(info.inventory.read_text())
    g = doc["all"]["children"]["ddp_nodes"]
    g["vars"].update(groupvars)
    for k, v in (hostvars or {}).items():
        g["hosts"]["node1"][k] = v
    path = tmp / "hosts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def fw_lab(lab_factory):
    """2 nodes, a worker's iptables rejects the cluster: remediate --apply would change a rule set."""
    return lab_factory(nodes=2, scenario="iptables-worker")


# (group vars, host vars of node1, text the one-line error must contain)
BAD_INPUTS = [
    ({"ddp_cluster_cidr": "{net}.5/24"}, {}, "has host bits set: did you mean {net}.0/24?"),
    ({"ddp_cluster_cidr": "0.0.0.0/0"}, {}, "'0.0.0.0/0'"),
    ({"ddp_cluster_cidr": "fd00:77::/64"}, {}, "'fd00:77::/64' is IPv6"),
    ({"ddp_cluster_cidr": "192.0.0.0/8"}, {}, "ddp_cluster_cidr '192.0.0.0/8' is not a private network"),
    ({"ddp_cluster_cidr": "192.168.0.0/15"}, {}, "'192.168.0.0/15' is not a private network"),
    ({"ddp_env_path": "/tmp/ddp.env"}, {}, "ddp_env_path '/tmp/ddp.env'"),
    ({"ddp_env_path": "ddp.env"}, {}, "ddp_env_path 'ddp.env'"),
    ({"ddp_env_path": "/etc/ddpfix/"}, {}, "ddp_env_path '/etc/ddpfix/'"),
    ({"ddp_env_path": "/etc/ddp;reboot.env"}, {}, "ddp_env_path '/etc/ddp;reboot.env'"),
    ({"ddp_ntp_servers": ["pool.ntp.org iburst"]}, {}, "'pool.ntp.org iburst'"),
    ({"ddp_ntp_servers": ["ntp1\nallow all"]}, {}, "'ntp1\\nallow all'"),
    ({}, {"ddp_socket_ifname": "eth0;reboot"}, "ddp_socket_ifname of node1 'eth0;reboot'"),
    ({}, {"ddp_python": "python3 -c x"}, "ddp_python of node1 'python3 -c x'"),
    ({"ddp_master_port": 70000}, {}, "ddp_master_port must be between 1 and 65535, got 70000"),
    ({"ddp_nproc_per_node": "many"}, {}, "ddp_nproc_per_node must be an integer, got 'many'"),
    ({"ddp_ntp_local_master": "sometimes"}, {}, "ddp_ntp_local_master must be a boolean, got 'sometimes'"),
    ({"ddp_cluster_cidr_ack_broad": "perhaps"}, {}, "'perhaps'"),
]


@pytest.mark.parametrize(("gv", "hv", "message"), BAD_INPUTS, ids=[m[:40] for _, _, m in BAD_INPUTS])
def test_bad_input_exit_2_names_value_changes_nothing(fw_lab, tmp_path: Path, gv: dict, hv: dict, message: str) -> None:
    net = str(ipaddress.ip_network(fw_lab.subnet).network_address).rsplit(".", 1)[0]
    gv = {k: (v.replace("{net}", net) if isinstance(v, str) else v) for k, v in gv.items()}
    inv = _inventory_with(fw_lab, tmp_path, gv, hv)
    before = snapshot(fw_lab)
    code, out, err = ddpfix(inv, "remediate", "--apply")
    assert code == 2, (code, out[-1500:], err[-1500:])
    line = [ln for ln in err.splitlines() if ln.startswith("ddpfix: error:")]
    assert len(line) == 1 and message.replace("{net}", net) in line[0], err
    assert snapshot(fw_lab) == before


def test_broad_cidr_with_ack_is_applied(fw_lab, tmp_path: Path) -> None:
    """The acknowledgement lets the same run through (dry run only: nothing changes)."""
    inv = _inventory_with(fw_lab, tmp_path, {"ddp_cluster_cidr": "192.168.0.0/15", "ddp_cluster_cidr_ack_broad": True})
    code, _out, err = ddpfix(inv, "remediate")
    assert code == 1 and "ddpfix: error" not in err, (code, err[-1500:])


def _set_hostname(info: Any, node: str, hostname: str) -> None:
    """sethostname(2) directly: the kernel takes any bytes (the `hostname` tool would refuse some)."""
    lab.node_exec(info.name, node, ["python3", "-c", "import socket, sys; socket.sethostname(sys.argv[1])", hostname])


@pytest.mark.parametrize("hostname", ["evil {{ lookup('pipe', 'id') }}", "evil\n10.9.9.9 node1", "localhost"])
def test_hostile_hostname_fact_reaches_no_node(temp_lab, hostname: str) -> None:
    info = temp_lab(nodes=3, scenario="hostname-loopback")  # a hosts fix is due on node2 and node3
    _set_hostname(info, "node2", hostname)
    inv = str(info.inventory)
    code, doc = ddpfix_json(inv, "audit")
    bad = [f for f in doc["findings"] if f["id"] == reachability_rules.INVALID.id]
    assert code == 1 and bad and bad[0]["host"] == "node2" and bad[0]["severity"] == "error", doc["findings"]
    before = snapshot(info)
    code, _out, err = ddpfix(inv, "remediate", "--apply")
    assert code == 2, (code, err[-2000:])
    assert f"node2 returned hostname {hostname!r}" in err and len(err.strip().splitlines()) == 1, err
    assert snapshot(info) == before
    code, _out, err = ddpfix(inv, "env", "--apply")  # env files neither
    assert code == 2 and "node2 returned hostname" in err, err
    assert snapshot(info) == before


def test_a_node_claiming_a_name_gets_it_written_nowhere(temp_lab) -> None:
    """Issue 36 item 1: node3 calls itself pypi.org (on 127.0.1.1), node1 maps node2's name wrongly (a hosts fix is
    due on every node) and no node has an env file (remediate writes it and the cluster file). After `remediate
    --apply` (exit 0: the claim is not ddpfix's to fix) no node's /etc/hosts block or cluster file names pypi.org,
    every operator line for a name ddpfix does not manage is as it was, and the re-audit names the claim."""
    from ddpfix.lab.scenarios.hosts import CLAIMED_NAME

    info = temp_lab(nodes=3, scenario="hostname-claim,peer-mismatch")
    check_hostname_claim(info)  # the scenario's own check (test_lab_scenarios.CHECKED_ELSEWHERE)
    managed = {n.name for n in info.nodes}
    before = {n.name: lab.node_exec(info.name, n.name, ["cat", "/etc/hosts"]).stdout for n in info.nodes}
    code, doc = ddpfix_json(str(info.inventory), "remediate", "--apply")
    assert code == 0, (code, doc["remaining_fixable"], doc["failed_hosts"], doc["refused"])
    claims = [f for f in doc["findings"] if f["id"] == hosts_rules.NAME_UNVOUCHED.id]
    assert [f["host"] for f in claims] == ["node3"] and f"hostname {CLAIMED_NAME}" in claims[0]["message"], claims
    assert not [f for f in doc["findings"] if f["id"] == hosts_rules.HOSTNAME_LOOPBACK.id], doc["findings"]
    for node in info.nodes:
        block = _block(info, node.name)
        assert len(block) == 3 and CLAIMED_NAME not in " ".join(block), (node.name, block)
        cluster = lab.node_exec(info.name, node.name, ["cat", "/etc/ddpfix/cluster.json"]).stdout
        assert '"schema"' in cluster and CLAIMED_NAME not in cluster, (node.name, cluster)
        after = lab.node_exec(info.name, node.name, ["cat", "/etc/hosts"]).stdout.splitlines()
        kept = [ln for ln in before[node.name].splitlines() if ln.strip() and not set(ln.split()[1:]) & managed]
        assert [ln for ln in after if ln in kept] == kept, (node.name, kept, after)
        assert any(CLAIMED_NAME in ln for ln in kept), kept  # the operator's lines for pypi.org: still there


def test_env_limit_writes_only_limited_nodes_with_whole_cluster_values(temp_lab) -> None:
    info = temp_lab(nodes=4, scenario="clean")
    inv = str(info.inventory)
    before = snapshot(info)
    code, out, err = ddpfix(inv, "--limit", "node2,node4", "env", "--apply")
    assert code == 0, (out[-1500:], err[-1500:])
    master = info.nodes[0].address
    for node, rank in (("node2", 1), ("node4", 3)):
        text = lab.node_exec(info.name, node, ["cat", "/etc/ddpfix/ddp.env"]).stdout
        for want in ("NNODES=4", "PET_NNODES=4", f"NODE_RANK={rank}", f"PET_NODE_RANK={rank}", f"MASTER_ADDR={master}"):
            assert re.search(rf"^{want}$", text, re.M), (node, want, text)
    after = snapshot(info)
    for node in ("node1", "node3"):
        assert after[node] == before[node], node
        assert lab.node_exec(info.name, node, ["test", "-e", "/etc/ddpfix/ddp.env"], check=False).returncode != 0
    # the audit under the same limit is consistent: no env_rules.INCONSISTENT from the limit
    code, doc = ddpfix_json(inv, "--limit", "node2,node4", "audit")
    assert not [f for f in doc["findings"] if f["id"] in (env_rules.INCONSISTENT.id, reachability_rules.UNREACHABLE.id)], doc["findings"]


def _block(info: Any, node: str) -> list[str]:
    text = lab.node_exec(info.name, node, ["cat", "/etc/hosts"]).stdout
    lines = text.split("# BEGIN ddpfix managed block", 1)[1].split("# END ddpfix managed block", 1)[0].splitlines()
    return [" ".join(ln.split()) for ln in lines if ln.strip() and not ln.startswith("#")]


def test_hosts_fix_keeps_down_and_limited_out_nodes(temp_lab) -> None:
    """node1 maps node2 wrongly; node3's sshd is down, node4 is outside --limit: both keep their lines."""
    info = temp_lab(nodes=4, scenario="peer-mismatch")
    lab.stop_sshd(info.name, "node3")
    inv = str(info.inventory)
    code, out, err = ddpfix(inv, "--limit", "node1,node2,node3", "remediate", "--apply", "--only", hosts_rules.PEER_MISMATCH.id)
    assert code in (0, 1) and "ddpfix: error" not in err, (code, out[-1500:], err[-1500:])
    addr = {n.name: str(n.address) for n in info.nodes}
    for node in ("node1", "node2"):
        block = _block(info, node)
        for peer in ("node1", "node2", "node3", "node4"):
            assert any(ln.startswith(addr[peer] + " ") and peer in ln.split()[1:] for ln in block), (node, peer, block)
    # without --limit the run plans the same block (node3 still down): nothing left to change for the hosts fix
    code, doc = ddpfix_json(inv, "remediate", "--only", hosts_rules.PEER_MISMATCH.id)
    assert not [c for c in doc["changes"] if "hosts" in c["task"].lower()], doc["changes"]


def test_block_written_under_limit_is_reported_until_written_everywhere(temp_lab) -> None:
    """remediate --limit writes the hosts block on the limited nodes only; the whole cluster's audit then reports
    hosts_rules.BLOCK_DIFFERS (what verify checks), and remediate --apply without --limit writes the same block
    everywhere."""
    info = temp_lab(nodes=3, scenario="hostname-loopback")  # node2 and node3 map their hostname to 127.0.1.1
    inv = str(info.inventory)
    code, out, err = ddpfix(inv, "--limit", "node3", "remediate", "--apply")
    assert code in (0, 1) and "ddpfix: error" not in err, (code, out[-1500:], err[-1500:])
    assert _block(info, "node3")
    for node in ("node1", "node2"):
        assert "# BEGIN ddpfix managed block" not in lab.node_exec(info.name, node, ["cat", "/etc/hosts"]).stdout
    code, doc = ddpfix_json(inv, "audit")
    (diff,) = [f for f in doc["findings"] if f["id"] == hosts_rules.BLOCK_DIFFERS.id]
    assert diff["host"] is None and "node3 against node1, node2" in diff["message"], diff
    assert "node1, node2: no managed block" in diff["evidence"] and diff["fixable"], diff
    code, out, err = ddpfix(inv, "remediate", "--apply")
    assert code == 0 and "ddpfix: error" not in err, (code, out[-1500:], err[-1500:])
    code, doc = ddpfix_json(inv, "audit")
    assert not [f for f in doc["findings"] if f["id"].startswith("hosts.")], doc["findings"]
    blocks = {node: _block(info, node) for node in ("node1", "node2", "node3")}
    assert blocks["node1"] == blocks["node2"] == blocks["node3"] and len(blocks["node1"]) == 3, blocks
