"""Inventory from a Slurm allocation: hostlist expansion and the contract's format (no Slurm daemon needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddpfix.cli import cli
from ddpfix.errors import DdpfixError
from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.inventory.slurm import expand_hostlist, inventory_from_allocation, inventory_yaml


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


# --- Slurm's hostname grammar, heterogeneous jobs, a job step's per-job values (env --slurm --export) ---

from ddpfix.inventory.contract import parse_port_range  # noqa: E402
from ddpfix.inventory.slurm import (  # noqa: E402
    DEFAULT_PORT_RANGE,
    allocation_nodes,
    export_lines,
    job_env,
    job_port,
    parse_het_groups,
)


@pytest.mark.parametrize("expr,want", [
    ("gpu_01", ["gpu_01"]),
    ("node-[001-004,007]", ["node-001", "node-002", "node-003", "node-004", "node-007"]),
    ("a[1-2]-ib", ["a1-ib", "a2-ib"]),
    ("r[1-2]n[3-4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
    ("gpu_[09-10].cluster", ["gpu_09.cluster", "gpu_10.cluster"]),
])
def test_slurm_hostname_grammar(expr: str, want: list[str]) -> None:
    assert expand_hostlist(expr, use_scontrol=False) == want


@pytest.mark.parametrize("expr", ["gpu 01", "n$(id)", "-n1", "n1-", "a'b", "n[1-2]{x}"])
def test_invalid_node_names_name_the_variable(expr: str) -> None:
    with pytest.raises(DdpfixError) as err:
        expand_hostlist(expr, use_scontrol=False, var="SLURM_STEP_NODELIST")
    assert err.value.code == 2 and str(err.value).startswith(f"SLURM_STEP_NODELIST {expr!r}")
    assert "\n" not in str(err.value)


HET = {"SLURM_HET_SIZE": "3", "SLURM_JOB_NODELIST": "login1", "SLURM_JOB_NODELIST_HET_GROUP_0": "login1",
       "SLURM_JOB_NODELIST_HET_GROUP_1": "gpu-[01-02]", "SLURM_JOB_NODELIST_HET_GROUP_2": "gpu-[03-04]",
       "SLURM_JOB_NUM_NODES_HET_GROUP_1": "2"}


def test_het_job_without_het_group_is_refused_with_a_hint() -> None:
    with pytest.raises(DdpfixError) as err:
        allocation_nodes(HET)
    assert err.value.code == 2 and "SLURM_HET_SIZE=3" in str(err.value) and "--het-group" in str(err.value)


def test_het_groups_select_components_in_order() -> None:
    assert allocation_nodes(HET, het_groups=(2, 1)) == ["gpu-03", "gpu-04", "gpu-01", "gpu-02"]
    assert list(inventory_from_allocation(HET, het_groups=(1,))["ddp_nodes"]["hosts"]) == ["gpu-01", "gpu-02"]
    for groups, needle in [((3,), "no component 3"), ((1, 1), "twice")]:
        with pytest.raises(DdpfixError, match=needle):
            allocation_nodes(HET, het_groups=groups) if groups != (1, 1) else parse_het_groups("1,1")
    with pytest.raises(DdpfixError, match="SLURM_JOB_NUM_NODES_HET_GROUP_1='3'"):
        allocation_nodes({**HET, "SLURM_JOB_NUM_NODES_HET_GROUP_1": "3"}, het_groups=(1,))
    with pytest.raises(DdpfixError, match="not a heterogeneous job"):
        allocation_nodes({"SLURM_JOB_NODELIST": "n1"}, het_groups=(0,))


@pytest.mark.parametrize("text,want", [("0", (0,)), ("1,0", (1, 0)), ("0-2", (0, 1, 2))])
def test_parse_het_groups(text: str, want: tuple[int, ...]) -> None:
    assert parse_het_groups(text) == want


@pytest.mark.parametrize("bad", ["", "a", "2-1", "0,,1", "-1"])
def test_bad_het_group_is_refused(bad: str) -> None:
    with pytest.raises(DdpfixError, match="--het-group"):
        parse_het_groups(bad)


def test_port_range_and_job_port() -> None:
    assert parse_port_range("20000-20999", "x") == (20000, 20999)
    for bad in ("80-90", "30000-20000", "20000", "2e4-3e4", "20000-70000"):
        with pytest.raises(DdpfixError, match=f"x must be a port range LO-HI.*{bad!r}"):
            parse_port_range(bad, "x")
    eph = (32768, 60999)
    assert job_port("1234", (20000, 20999), eph, "s") == 20234
    assert job_port("1234", (20000, 20999), eph, "s") != job_port("1235", (20000, 20999), eph, "s")
    with pytest.raises(DdpfixError, match=r"port range 30000-40000 \(--port-range\) overlaps this node's ephemeral "):
        job_port("1", (30000, 40000), eph, "--port-range")
    with pytest.raises(DdpfixError, match="SLURM_JOB_ID must be a job id"):
        job_port("12;rm", DEFAULT_PORT_RANGE, eph, "s")


STEP = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_STEP_NODELIST": "node[1-3]",
        "SLURM_JOB_NUM_NODES": "3", "SLURM_STEP_NUM_NODES": "3", "SLURM_NODEID": "1", "SLURMD_NODENAME": "node2",
        "SLURM_NTASKS_PER_NODE": "4"}
DOC = {"nodes": [{"name": "node1", "hostname": "node1.lab", "address": "10.9.0.11"}], "job_port_range": "21000-21099"}
EPH = (32768, 60999)


def test_job_env_per_job_values() -> None:
    env, notes = job_env(STEP, doc=DOC, ephemeral=EPH)
    assert env == {"MASTER_ADDR": "10.9.0.11", "MASTER_PORT": "21042", "NNODES": "3", "NODE_RANK": "1",
                   "NPROC_PER_NODE": "4", "PET_NNODES": "3", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4",
                   "PET_MASTER_ADDR": "10.9.0.11", "PET_MASTER_PORT": "21042"}
    assert notes == []
    # the cluster file names its nodes as the inventory does (an FQDN): Slurm's short name still finds the address
    fqdn = {"nodes": [{"name": "node1.cluster.example", "hostname": None, "address": "10.9.0.11"}]}
    assert job_env(STEP, doc=fqdn, ephemeral=EPH)[0]["MASTER_ADDR"] == "10.9.0.11"
    # no cluster file: the node name, with a note; the default range; GPUs on the node first
    env, notes = job_env({**STEP, "SLURM_GPUS_ON_NODE": "8"}, ephemeral=EPH)
    assert env["MASTER_ADDR"] == "node1" and env["MASTER_PORT"] == str(29500 + 4242 % 500)
    assert env["NPROC_PER_NODE"] == "8" and len(notes) == 1 and notes[0].startswith("NOTE: ddpfix: MASTER_ADDR=node1")
    # task-based, no GPUs: tasks per node; an explicit option wins
    assert job_env({**STEP, "SLURM_GPUS_ON_NODE": "0"}, ephemeral=EPH)[0]["NPROC_PER_NODE"] == "4"
    assert job_env(STEP, nproc=2, ephemeral=EPH)[0]["NPROC_PER_NODE"] == "2"
    # ports Slurm reserved for the step (srun --resv-ports) come first; an explicit --port-range before them
    assert job_env({**STEP, "SLURM_STEP_RESV_PORTS": "12000-12003"}, doc=DOC, ephemeral=EPH)[0]["MASTER_PORT"] == "12000"
    assert job_env({**STEP, "SLURM_STEP_RESV_PORTS": "12000"}, port_range=(20000, 20999), port_source="--port-range",
                   ephemeral=EPH)[0]["MASTER_PORT"] == "20242"
    for bad in ("x", "80-81", "99999"):
        with pytest.raises(DdpfixError, match=f"SLURM_STEP_RESV_PORTS must start with a port.*{bad!r}"):
            job_env({**STEP, "SLURM_STEP_RESV_PORTS": bad}, ephemeral=EPH)
    with pytest.raises(DdpfixError, match=r"port range 40000-40000 \(SLURM_STEP_RESV_PORTS\) overlaps"):
        job_env({**STEP, "SLURM_STEP_RESV_PORTS": "40000-40001"}, ephemeral=EPH)
    # the step's nodes, not the job's: SLURM_NODEID numbers the step
    small = {**STEP, "SLURM_STEP_NODELIST": "node[2-3]", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "0"}
    env, _ = job_env(small, ephemeral=EPH)
    assert (env["MASTER_ADDR"], env["NNODES"], env["NODE_RANK"]) == ("node2", "2", "0")


@pytest.mark.parametrize("change,needle", [
    ({"SLURM_NODEID": "2"}, "SLURM_NODEID='2' but this node (node2) is node 1"),
    ({"SLURM_NODEID": ""}, "SLURM_NODEID must be this node's index"),
    ({"SLURM_NODEID": "3"}, "SLURM_NODEID must be this node's index"),
    ({"SLURMD_NODENAME": "node9"}, "this node (node9, SLURMD_NODENAME) is not in"),
    ({"SLURM_STEP_NUM_NODES": "4"}, "SLURM_STEP_NUM_NODES='4' but SLURM_STEP_NODELIST 'node[1-3]' expands to 3"),
    ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID must be a job id"),
    ({"SLURM_HET_SIZE": "2"}, "heterogeneous job (SLURM_HET_SIZE=2)"),
])
def test_job_env_refuses_inconsistent_variables(change: dict, needle: str) -> None:
    with pytest.raises(DdpfixError) as err:
        job_env({**STEP, **change}, ephemeral=EPH)
    assert err.value.code == 2 and needle in str(err.value) and "\n" not in str(err.value)


def test_job_env_het_rank_is_the_place_in_the_selected_components() -> None:
    env = {**HET, "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "gpu-04", "SLURM_NODEID": "1"}
    got, _ = job_env(env, het_groups=(1, 2), ephemeral=EPH)
    assert (got["MASTER_ADDR"], got["NNODES"], got["NODE_RANK"]) == ("gpu-01", "4", "3")
    # each component has its own SLURM_JOB_ID: the port comes from the job's (component 0's) id on every node
    other = {**env, "SLURM_JOB_ID_HET_GROUP_0": "7", "SLURM_JOB_ID": "8", "SLURMD_NODENAME": "gpu-01"}
    assert job_env(other, het_groups=(1, 2), ephemeral=EPH)[0]["MASTER_PORT"] == got["MASTER_PORT"] == "29507"
    with pytest.raises(DdpfixError, match="login1, SLURMD_NODENAME"):
        job_env({**env, "SLURMD_NODENAME": "login1"}, het_groups=(1, 2), ephemeral=EPH)


def test_export_lines_are_shell_safe() -> None:
    assert export_lines({"A": "1", "B": "x y"}) == "export A=1\nexport B='x y'\n"


def _export(env: dict[str, str], *args: str):
    base = dict.fromkeys(("SLURM_HET_SIZE", "SLURM_STEP_NODELIST", "SLURM_GPUS_ON_NODE", "DDPFIX_PORT_RANGE", "DDPFIX_HET_GROUP", "DDPFIX_NPROC_PER_NODE", "SLURM_STEP_RESV_PORTS"), "")
    return CliRunner().invoke(cli, ["env", "--slurm", "--export", "--cluster-file", "/nonexistent/c.json", *args],
                              env={**base, **env})


def test_cli_export_evaluates_in_a_shell(tmp_path) -> None:
    import subprocess

    r = _export({**STEP, "PATH": str(tmp_path)}, "--port-range", "20000-20999")
    assert r.exit_code == 0, r.output
    out = subprocess.run(["bash", "-c", 'eval "$1"; echo "$MASTER_ADDR $MASTER_PORT $PET_NODE_RANK $NNODES"',
                          "x", r.stdout], capture_output=True, text=True, check=True).stdout
    assert out == "node1 20242 1 3\n"
    r = _export({**STEP, "PATH": str(tmp_path)}, "--port-range", "40000-40100")
    assert r.exit_code == 2 and "overlaps this node's ephemeral range" in r.stderr and r.stdout == ""
    r = _export({**STEP, "PATH": str(tmp_path)}, "--apply")
    assert r.exit_code == 2 and "--export prints this job step's values" in r.stderr


def test_cli_het_group(tmp_path, monkeypatch) -> None:
    for k, v in HET.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: python-hostlist expands
    r = CliRunner().invoke(cli, ["inventory", "slurm"])
    assert r.exit_code == 2 and "heterogeneous job (SLURM_HET_SIZE=3)" in r.stderr
    r = CliRunner().invoke(cli, ["inventory", "slurm", "--het-group", "2,1"])
    assert r.exit_code == 0, r.output
    assert list(yaml.safe_load(r.stdout)["ddp_nodes"]["hosts"]) == ["gpu-03", "gpu-04", "gpu-01", "gpu-02"]
    monkeypatch.setenv("DDPFIX_HET_GROUP", "1")  # --slurm's inventory (audit, env, remediate) reads it
    from ddpfix.inventory.slurm import write_allocation_inventory

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    written = yaml.safe_load(Path(write_allocation_inventory()).read_text())
    assert list(written["ddp_nodes"]["hosts"]) == ["gpu-01", "gpu-02"]
    r = CliRunner().invoke(cli, ["-i", "a,b,", "env", "--het-group", "1"])
    assert r.exit_code == 2 and "--het-group selects components of a Slurm allocation: add --slurm" in r.stderr
    # DDPFIX_HET_GROUP exported for a job's steps does not break an inventory run
    assert CliRunner().invoke(cli, ["-i", "a,b,", "env", "--format", "sbatch"]).exit_code == 0
