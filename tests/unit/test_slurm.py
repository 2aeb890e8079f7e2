"""Inventory from a Slurm allocation: hostlist expansion and the contract's format (no Slurm daemon needed)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from ddpfix.app import DdpfixError
from ddpfix.cli import cli
from ddpfix.inventory import cluster_from_inventory_data
from ddpfix.slurm import expand_hostlist, inventory_from_allocation, inventory_yaml


@pytest.mark.parametrize("expr,want", [
    ("node1", ["node1"]),
    ("gpu-[01-04,07],login[1-2]", ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07", "login1", "login2"]),
    ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("x1,x1,x2", ["x1", "x2"]),
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
])
def test_hostlist_expansion(expr: str, want: list[str]) -> None:
    assert expand_hostlist(expr, use_scontrol=False) == want


@pytest.mark.parametrize("expr", ["", "gpu-[01-", "bad name[1-2]", "n[1-2];rm"])
def test_bad_hostlists_are_refused(expr: str) -> None:
    with pytest.raises(DdpfixError) as err:
        expand_hostlist(expr, use_scontrol=False)
    assert err.value.code == 2 and "SLURM_JOB_NODELIST" in str(err.value)


def _as_inventory_list(data: dict) -> dict:
    """What `ansible-inventory --list` returns for the written YAML (group vars folded into hostvars)."""
    g = data["ddp_nodes"]
    hostvars = {h: {**g["vars"], **(v or {})} for h, v in g["hosts"].items()}
    return {"ddp_nodes": {"hosts": list(g["hosts"])}, "_meta": {"hostvars": hostvars}}


def test_inventory_master_ranks_and_nproc() -> None:
    env = {"SLURM_JOB_NODELIST": "gpu-[03-04],gpu-01", "SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS_PER_NODE": "1"}
    data = inventory_from_allocation(env, group_vars={"ddp_cluster_cidr": "10.0.0.0/24"})
    cluster = cluster_from_inventory_data(_as_inventory_list(data))
    assert cluster.master == "gpu-03"
    assert [(n.name, n.rank) for n in cluster.nodes] == [("gpu-03", 0), ("gpu-04", 1), ("gpu-01", 2)]
    assert cluster.nproc_per_node == 8 and cluster.world_size == 24 and cluster.cluster_cidr == "10.0.0.0/24"


def test_ntasks_per_node_when_no_gpus() -> None:
    data = inventory_from_allocation({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "4(x2)"})
    assert data["ddp_nodes"]["vars"]["ddp_nproc_per_node"] == 4
    with pytest.raises(DdpfixError):
        inventory_from_allocation({"SLURM_JOB_NODELIST": "n1", "SLURM_GPUS_ON_NODE": "zero"})


def test_gpus_on_node_zero_falls_back_to_tasks_per_node() -> None:
    env = {"SLURM_JOB_NODELIST": "cpu[1-2]", "SLURM_GPUS_ON_NODE": "0", "SLURM_NTASKS_PER_NODE": "16"}
    assert inventory_from_allocation(env)["ddp_nodes"]["vars"]["ddp_nproc_per_node"] == 16
    assert "ddp_nproc_per_node" not in inventory_from_allocation({**env, "SLURM_NTASKS_PER_NODE": ""})["ddp_nodes"]["vars"]


@pytest.mark.parametrize("key", ["SLURM_NNODES", "SLURM_JOB_NUM_NODES"])
def test_a_node_count_that_disagrees_with_the_nodelist_is_refused(key: str) -> None:
    with pytest.raises(DdpfixError) as err:
        inventory_from_allocation({"SLURM_JOB_NODELIST": "n[1-3]", key: "4"})
    assert err.value.code == 2 and f"{key}='4'" in str(err.value) and "expands to 3 nodes" in str(err.value)
    assert len(inventory_from_allocation({"SLURM_JOB_NODELIST": "n[1-3]", key: "3"})["ddp_nodes"]["hosts"]) == 3
    # an explicit --nodelist is the user's choice: the allocation's count is not compared
    assert len(inventory_from_allocation({key: "4"}, "n[1-2]")["ddp_nodes"]["hosts"]) == 2


def test_cli_writes_parsable_yaml(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[01-02]")
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: python-hostlist expands
    out = tmp_path / "hosts.yml"
    r = CliRunner().invoke(cli, ["inventory", "slurm", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert list(doc["ddp_nodes"]["hosts"]) == ["gpu-01", "gpu-02"] and doc["ddp_nodes"]["vars"]["ddp_master"] == "gpu-01"
    r = CliRunner().invoke(cli, ["inventory", "slurm", "--nodelist", "gpu-[01-"])
    assert r.exit_code == 2 and "not a valid hostlist" in r.output


def test_yaml_header_names_the_source() -> None:
    text = inventory_yaml(inventory_from_allocation({}, "a1"), "--nodelist a1")
    assert text.startswith("# Written by `ddpfix inventory slurm` from --nodelist a1.")
