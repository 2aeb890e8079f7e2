"""ddpfix on clusters reached the way real sites reach them: through a bastion (ProxyJump), as a non-root user with
passwordless sudo and `ansible_become`, on a non-default SSH port; and the user's ansible.cfg honoured from the
directory ddpfix runs in and from next to the inventory.

Each SSH setup is combined with a fault: audit (every node reachable, the fault found), remediate dry run
(nothing changed on any node), `remediate --apply` (the firewall fix re-checks SSH over the node's own connection
settings), a clean re-audit, and `verify --torch` (testinfra and torchrun over the same settings).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import FAST_TORCH, add_inventory_vars, ddpfix_json, handmade_env, ids, need_node_torch, snapshot

from ddpfix import lab
from ddpfix.lab.scenarios.sites import SSH_SETUPS
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import reachability as reachability_rules

pytestmark = pytest.mark.lab

# Short torch timeouts (as tests/lab/test_remediate_lab.py).


def names_only(info: Any) -> None:
    """The inventory names the nodes only; their ssh_config (next to it, with the bastion) maps names to addresses."""
    doc = yaml.safe_load(info.inventory.read_text())
    hosts = doc["all"]["children"]["ddp_nodes"]["hosts"]
    doc["all"]["children"]["ddp_nodes"]["hosts"] = dict.fromkeys(hosts)
    info.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))

CASES = [
    # (scenarios, the fault's finding ids). ssh-port shares the nonroot-become lab (it was a case of its own,
    # `[ssh-port]`, with the same fault and the same cycle): SSH as ddpuser with sudo on port 2222.
    # The bastion site names its nodes in its ssh_config only (no ansible_host), and node2 cannot resolve the
    # others' names: the master's address then comes from the nodes' facts, and an unresolvable master name is a
    # finding that remediate fixes, not an invalid fact that blocks it.
    ("bastion,iptables-worker2,peer-unresolvable", {firewall_rules.PEER_PORTS_BLOCKED.id, hosts_rules.PEER_UNRESOLVABLE.id}),
    ("nonroot-become,ssh-port,hostname-loopback,iptables-worker2",
     {hosts_rules.HOSTNAME_LOOPBACK.id, firewall_rules.PEER_PORTS_BLOCKED.id}),
]


def setups(scenario: str) -> list[str]:
    return [s for s in scenario.split(",") if s in SSH_SETUPS]


def ssh_ok(info: Any, node: str, *opts: str) -> bool:
    argv = ["ssh", "-F", str(info.ssh_config), "-o", "ConnectTimeout=3", *opts, node, "true"]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def check_setup(info: Any, setup: str) -> None:
    """The scenario really is what it claims (else ddpfix passing through it proves nothing)."""
    assert all(ssh_ok(info, n.name) for n in info.nodes)
    if setup == "bastion":
        assert info.bastion == "node1"
        assert ssh_ok(info, "node1", "-o", "ProxyJump=none")
        assert not ssh_ok(info, "node2", "-o", "ProxyJump=none")  # direct SSH is dropped
        assert (info.inventory.parent / "ansible.cfg").is_file()
    elif setup == "nonroot-become":
        assert not ssh_ok(info, "node1", "-o", "User=root")  # root login refused
        res = subprocess.run([*info.ssh_argv("node2", "sudo", "-n", "id", "-u")], capture_output=True, text=True,
                             timeout=30)
        assert res.stdout.strip() == "0", res.stderr
        inv = yaml.safe_load(info.inventory.read_text())["all"]["children"]["ddp_nodes"]["vars"]
        assert inv["ansible_user"] == "ddpuser" and inv["ansible_become"] is True
    elif setup == "ssh-port":
        assert info.ssh_port == 2222
        assert not lab.ssh_banner(info.nodes[0].address, 22) and lab.ssh_banner(info.nodes[0].address, 2222)


@pytest.mark.torch
@pytest.mark.parametrize(("scenario", "fault"), CASES, ids=["+".join(setups(c)) for c, _ in CASES])
def test_ssh_setup_audit_remediate_verify(temp_lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          scenario: str, fault: set[str]) -> None:
    need_node_torch()
    info = temp_lab(nodes=3, scenario=scenario, wait_sync=False)
    for setup in setups(scenario):
        check_setup(info, setup)
    add_inventory_vars(info, FAST_TORCH)
    if "bastion" in setups(scenario):
        names_only(info)
    handmade_env(info)
    monkeypatch.chdir(tmp_path)  # not the inventory's directory: its ansible.cfg must be found anyway
    inv = str(info.inventory)

    code, before = ddpfix_json(inv, "audit")
    assert before["summary"]["reachable"] == 3 and not before["summary"]["unreachable"], before["hosts"]
    assert code == 1 and fault <= ids(before), before["findings"]

    etc = snapshot(info)
    code, dry = ddpfix_json(inv, "remediate")
    assert code == 1 and dry["changes"], dry
    assert snapshot(info) == etc  # the dry run changed nothing

    code, applied = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (applied["remaining_fixable"], applied["failed_hosts"], applied["refused"])

    code, after = ddpfix_json(inv, "audit")
    assert code == 0 and after["summary"]["reachable"] == 3, after["findings"]

    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (v["checks"], v["torch"])
    assert all(r["ok"] and r["result"]["sum"] == 6.0 for r in v["torch"]), v["torch"]
    if scenario.startswith("bastion"):
        assert not ssh_ok(info, "node2", "-o", "ProxyJump=none")  # the firewall fix did not open a way round


@pytest.fixture(scope="module")
def bare_lab(lab_factory: Any) -> Any:
    """A non-root, sudo, port-2222 lab whose inventory says nothing about user, port or become."""
    info = lab_factory(nodes=2, scenario="nonroot-become,ssh-port", wait_sync=False)
    return info


def bare_inventory(info: Any, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(info.inventory.read_text())
    v = doc["all"]["children"]["ddp_nodes"]["vars"]
    for k in ("ansible_user", "ansible_port", "ansible_become"):
        v.pop(k)
    path = where / "hosts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


USER_CFG = "[defaults]\nremote_user = ddpuser\nremote_port = 2222\n[privilege_escalation]\nbecome = True\n"


def test_ansible_cfg_in_the_working_directory_is_honoured(bare_lab: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    inv = bare_inventory(bare_lab, tmp_path / "inv")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, doc = ddpfix_json(str(inv), "audit")  # no ansible.cfg anywhere: root on port 22 is refused
    assert doc["summary"]["unreachable"] == 2, doc["hosts"]
    (work / "ansible.cfg").write_text(USER_CFG)
    code, doc = ddpfix_json(str(inv), "audit")
    assert doc["summary"]["reachable"] == 2 and not doc["summary"]["unreachable"], doc["hosts"]
    assert code in (0, 1) and reachability_rules.UNREACHABLE.id not in ids(doc, "info")
    code, v = ddpfix_json(str(inv), "verify")  # testinfra reads the same ansible.cfg
    hostname = [c for c in v["checks"] if c["check"] == "hostname not on loopback"]
    assert len(hostname) == 2 and all(c["ok"] for c in hostname), v["checks"]


def test_ansible_cfg_next_to_the_inventory_is_honoured(bare_lab: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    inv = bare_inventory(bare_lab, tmp_path / "inv2")
    (inv.parent / "ansible.cfg").write_text(USER_CFG)
    monkeypatch.chdir(tmp_path)
    _code, doc = ddpfix_json(str(inv.parent), "audit")  # -i DIR
    assert doc["summary"]["reachable"] == 2 and not doc["summary"]["unreachable"], doc["hosts"]
    # ANSIBLE_CONFIG beats the file next to the inventory, as it beats every other
    other = tmp_path / "other.cfg"
    other.write_text("[defaults]\nremote_user = nobody-here\nremote_port = 2222\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(other))
    _code, doc = ddpfix_json(str(inv), "audit")
    assert doc["summary"]["unreachable"] == 2, doc["hosts"]


def test_nonroot_nobecome_scenario_reads_as_the_user(temp_lab: Any) -> None:
    info = temp_lab(nodes=2, scenario="nonroot-nobecome", wait_sync=False)
    res = subprocess.run(info.ssh_argv("node1", "id", "-un"), capture_output=True, text=True, timeout=30)
    assert res.stdout.strip() == "ddpuser"
    assert subprocess.run(info.ssh_argv("node1", "sudo", "-n", "true"), capture_output=True, timeout=30).returncode != 0
    inv = yaml.safe_load(info.inventory.read_text())["all"]["children"]["ddp_nodes"]["vars"]
    assert inv["ansible_user"] == "ddpuser" and "ansible_become" not in inv


def test_lab_down_removes_the_bastion_files(temp_lab: Any) -> None:
    info = temp_lab(nodes=2, scenario="bastion", wait_sync=False)
    d = info.inventory.parent
    assert {p.name for p in d.iterdir()} >= {"hosts.yml", "ansible.cfg", "ssh_config"}
    lab.down(info.name)
    assert not d.exists() or not any(d.iterdir()), list(d.iterdir())
    shutil.rmtree(d, ignore_errors=True)
