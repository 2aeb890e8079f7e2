"""The documented command forms on real lab hosts: options after the subcommand, an ad-hoc host list
(`-i addr1,addr2,addr3,`) and DDPFIX_INVENTORY, through the real CLI (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ddpfix_proc

pytestmark = pytest.mark.lab


def _hosts(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert res.returncode == 0, res.stderr[-3000:]
    return sorted(json.loads(res.stdout)["hosts"])


def test_options_before_and_after_the_subcommand(clean_lab, tmp_path: Path) -> None:
    inv = str(clean_lab.inventory)
    names = sorted(n.name for n in clean_lab.nodes)
    assert _hosts(ddpfix_proc("audit", "-i", inv, "--no-probe", "--format", "json", state_dir=tmp_path)) == names
    assert _hosts(ddpfix_proc("-i", inv, "audit", "--no-probe", "--format", "json", state_dir=tmp_path)) == names
    # given after the subcommand, -i replaces the one before it and the environment's
    res = ddpfix_proc("-i", str(tmp_path / "missing.yml"), "audit", "-i", inv, "--forks", "2", "--no-probe",
                 "--format", "json", state_dir=tmp_path, env={"DDPFIX_INVENTORY": str(tmp_path / "nope.yml")})
    assert _hosts(res) == names


def test_ad_hoc_host_list_and_ddpfix_inventory(clean_lab, tmp_path: Path) -> None:
    """`-i 192.0.2.11,192.0.2.12,192.0.2.13,`: SSH settings from Ansible's environment, as ad-hoc users do."""
    addrs = [n.address for n in clean_lab.nodes]
    ssh_env = {
        "ANSIBLE_REMOTE_USER": "root",
        "ANSIBLE_PRIVATE_KEY_FILE": str(Path(clean_lab.ssh_config).parent / "id_ed25519"),
        "ANSIBLE_SSH_COMMON_ARGS": f"-o UserKnownHostsFile={clean_lab.known_hosts} -o StrictHostKeyChecking=yes "
                                   "-o IdentitiesOnly=yes",
    }
    res = ddpfix_proc("audit", "-i", ",".join(addrs) + ",", "--format", "json", "--fail-on", "error",
                 state_dir=tmp_path, env=ssh_env)
    assert _hosts(res) == sorted(addrs)
    doc = json.loads(res.stdout)
    assert doc["cluster"]["master"] == addrs[0] and doc["cluster"]["world_size"] == len(addrs)
    assert all(h["reachable"] for h in doc["hosts"].values())
    written = list((tmp_path / "runs").glob("*-adhoc-inventory/hosts.yml"))
    assert len(written) == 1 and "ddp_nodes:" in written[0].read_text()
    # the same list from the environment, without the trailing comma (not every part is a path)
    res = ddpfix_proc("audit", "--no-probe", "--format", "json", "--fail-on", "error", state_dir=tmp_path,
                 env={**ssh_env, "DDPFIX_INVENTORY": ",".join(addrs)})
    assert _hosts(res) == sorted(addrs)


def _ini_without_ddp_nodes(yaml_inventory: Path, dest: Path) -> None:
    """The lab's inventory as a user's INI file whose group is `gpu` (no group `ddp_nodes`: every host is a node)."""
    group = yaml.safe_load(yaml_inventory.read_text())["all"]["children"]["ddp_nodes"]
    lines = ["[gpu]"] + [f"{h} ansible_host={v['ansible_host']}" for h, v in group["hosts"].items()] + ["", "[gpu:vars]"]
    lines += [f"{k}={v}" for k, v in group["vars"].items()]
    dest.write_text("\n".join(lines) + "\n")


def test_no_i_audits_the_inventory_named_in_the_users_ansible_cfg(clean_lab, tmp_path: Path) -> None:
    """`ddpfix audit` with no -i, in a directory whose ansible.cfg names the inventory (a relative path, from that
    file's directory, as Ansible reads it): the hosts Ansible would use, and stderr says where they came from. The
    inventory is the user's INI file without a group `ddp_nodes`: every host is a node, and the plays run on them."""
    work = tmp_path / "work"
    (work / "inv").mkdir(parents=True)
    _ini_without_ddp_nodes(Path(clean_lab.inventory), work / "inv" / "hosts.ini")
    (work / "ansible.cfg").write_text("[defaults]\ninventory = inv/hosts.ini\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DDPFIX_", "ANSIBLE_"))}
    full.update({"DDPFIX_STATE_DIR": str(tmp_path / "state"), "NO_COLOR": "1"})
    res = subprocess.run([sys.executable, "-c", "from ddpfix.cli import main; main()", "audit", "--no-probe",
                          "--format", "json"], check=False, capture_output=True, text=True, timeout=300, env=full,
                         cwd=work)
    assert _hosts(res) == sorted(n.name for n in clean_lab.nodes)
    assert all(h["reachable"] for h in json.loads(res.stdout)["hosts"].values()), res.stdout[-3000:]
    assert f"(from inventory in {work / 'ansible.cfg'})" in res.stderr
