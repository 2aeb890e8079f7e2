"""`ddpfix check --local` on recorded facts: the cluster file round trip, the audit's checks on one node, NHC output."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import Sim

from ddpfix import clusterfile, local
from ddpfix.cli import cli


def _cluster_file(sim: Sim, tmp_path: Path) -> Path:
    sim.write_planned_env_files()
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(clusterfile.build(sim.context()), indent=2))
    return path


def _local_findings(sim: Sim, path: Path, me: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    cluster, doc = clusterfile.load(str(path))
    answers = sim.probe(me)["resolve"]  # what getaddrinfo answered on that node
    monkeypatch.setattr(local.node_facts_module(), "resolve", lambda name: list(answers.get(name) or []))
    ctx = local.local_context(cluster, doc, me, copy.deepcopy(sim.node(me)))
    return local.run_local(ctx, me)


def test_cluster_file_round_trip(sim: Sim, tmp_path: Path) -> None:
    path = _cluster_file(sim, tmp_path)
    cluster, doc = clusterfile.load(str(path))
    want = sim.cluster()
    assert [(n.name, n.rank) for n in cluster.nodes] == [(n.name, n.rank) for n in want.nodes]
    assert (cluster.master, cluster.master_port, cluster.cluster_cidr) == (want.master, want.master_port, "192.168.77.0/24")
    assert [n["address"] for n in doc["nodes"]] == ["192.168.77.11", "192.168.77.12", "192.168.77.13"]
    assert doc["hosts_block"].startswith("sha256:") and doc["schema"] == clusterfile.SCHEMA


@pytest.mark.parametrize("me", ["node1", "node2", "node3"])
def test_healthy_node_passes(sim: Sim, tmp_path: Path, me: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    assert local.failures(_local_findings(sim, path, me, monkeypatch)) == []


def test_hostname_loopback_fails_with_the_audits_id(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    ids = [f.id for f in local.failures(_local_findings(sim, path, "node2", monkeypatch))]
    assert ids == ["hosts.hostname-loopback"]


def test_peer_resolution_and_env_drift_fail(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    sim.probe("node3")["resolve"]["node1"] = ["10.9.9.9"]
    sim.write_planned_env_files(node3={"PET_NODE_RANK": "1"})
    ids = {f.id for f in local.failures(_local_findings(sim, path, "node3", monkeypatch))}
    assert ids == {"hosts.peer-mismatch", "env.inconsistent"}


def test_missing_env_file_fails(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    sim.node("node1")["env_file"] = {"path": "/etc/ddpfix/ddp.env", "exists": False, "readable": False, "values": {},
                                     "managed": {}, "owner": None, "outside_keys": []}
    ids = [f.id for f in local.failures(_local_findings(sim, path, "node1", monkeypatch))]
    assert ids == ["env.missing"]


def test_skip_findings_from_the_inventory_are_accepted(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim.set_var(None, ddp_skip_findings=["hosts.hostname-loopback@node2"])
    path = _cluster_file(sim, tmp_path)
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    assert local.failures(_local_findings(sim, path, "node2", monkeypatch)) == []


def test_bad_cluster_file_is_one_nhc_line_exit_2(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["check", "--local", "--cluster-file", str(tmp_path / "none.json")])
    assert r.exit_code == 2 and r.output.startswith("ERROR: ddpfix: cluster-file: ") and r.output.count("\n") == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": clusterfile.SCHEMA, "nodes": [{"name": "a", "rank": "x"}]}))
    r = CliRunner().invoke(cli, ["check", "--local", "--cluster-file", str(bad)])
    assert r.exit_code == 2 and "nodes[0]" in r.output
    r = CliRunner().invoke(cli, ["check"])
    assert r.exit_code == 2


def test_node_facts_collector_loads_without_ansible_module_utils() -> None:
    mod = local.node_facts_module()
    assert callable(mod.collect) and callable(mod.resolve)
    import sys

    assert "ansible.module_utils.ddpfix_envfile" not in sys.modules  # the shims were only there while loading
