"""The runner layer against real lab hosts: typed per-host results, unreachable hosts, private run dirs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpfix import lab
from ddpfix.ansible.run import run_playbook
from ddpfix.audit import FACTS_KEY, audit_extravars
from ddpfix.inventory.derive import load_cluster

pytestmark = pytest.mark.lab


def test_adhoc_run_reports_each_nodes_own_facts(temp_lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    info = temp_lab(nodes=4, scenario="clean", ifnames="eth0,ens5,enp7s0")
    cluster = load_cluster([str(info.inventory)])
    run = run_playbook("audit.yml", cluster.inventories, extravars=audit_extravars(cluster, False, 0, 1.0),
                       n_hosts=4, name="adhoc")
    assert run.status == "successful" and run.rc == 0 and run.unreachable == []
    assert run.run_dir.parent == tmp_path / "state" / "runs"
    assert not (tmp_path / "home" / ".ansible").exists()  # nothing written to the user's ~/.ansible
    for node in info.nodes:
        facts = run.hosts[node.name].fact(FACTS_KEY)[1]  # type: ignore[index]
        assert facts["hostname"] == node.hostname
        assert facts["cluster"]["ifname"] == node.ifname and facts["cluster"]["address"] == node.address
    assert [n.ifname for n in info.nodes] == ["eth0", "ens5", "enp7s0", "eth0"]
    assert run.stats["ok"] and run.changed() == 0


def test_unreachable_host_is_a_typed_result(temp_lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    info = temp_lab(nodes=3, scenario="clean")
    lab.stop_sshd(info.name, "node3")
    cluster = load_cluster([str(info.inventory)])
    run = run_playbook("audit.yml", cluster.inventories, extravars=audit_extravars(cluster, False, 0, 1.0), n_hosts=3)
    assert run.unreachable == ["node3"]
    assert run.hosts["node3"].unreachable and run.hosts["node3"].message
    assert run.hosts["node1"].ok and run.hosts["node1"].fact(FACTS_KEY)


def test_audit_playbook_reads_facts_under_check_mode_and_unknown_limit_is_input_error(
        clean_lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from ddpfix.cli import cli

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    cluster = load_cluster([str(clean_lab.inventory)])
    run = run_playbook("audit.yml", cluster.inventories, extravars=audit_extravars(cluster, True, 1, 1.0),
                       n_hosts=3, check=True)
    for node in clean_lab.nodes:  # detection really reads the system in check mode
        facts = run.hosts[node.name].fact(FACTS_KEY)[1]  # type: ignore[index]
        assert facts["hostname"] == node.hostname and facts["interfaces"]
    r = CliRunner().invoke(cli, ["-i", str(clean_lab.inventory), "--limit", "nosuchnode", "audit"])
    assert r.exit_code == 2 and "matches no host" in r.output
