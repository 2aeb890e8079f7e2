"""The inventory contract: validation of inputs (no hosts needed; real ansible-inventory)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpfix.cli import cli
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.derive import cluster_from_inventory_data, load_cluster


def _data(hosts: dict[str, dict], **groupvars: object) -> dict:
    hv = {h: {**groupvars, **v} for h, v in hosts.items()}
    return {"_meta": {"hostvars": hv}, "all": {"children": ["ddp_nodes"]}, "ddp_nodes": {"hosts": list(hosts)}}


def test_defaults_master_first_and_ranks_in_inventory_order() -> None:
    c = cluster_from_inventory_data(_data({"a": {"ansible_host": "10.0.0.1"}, "b": {}, "c": {}}))
    assert c.master == "a"
    assert [(n.name, n.rank) for n in c.nodes] == [("a", 0), ("b", 1), ("c", 2)]
    assert c.master_port == 29500 and c.cluster_cidr is None and c.env_path == "/etc/ddpfix/ddp.env"
    assert c.world_size == 3


def test_master_not_first_gets_rank_zero_and_explicit_ranks_kept() -> None:
    c = cluster_from_inventory_data(_data({"a": {"ddp_node_rank": 2}, "b": {}, "c": {}}, ddp_master="b"))
    assert {n.name: n.rank for n in c.nodes} == {"b": 0, "a": 2, "c": 1}


@pytest.mark.parametrize(
    ("hosts", "gv", "message"),
    [
        ({"a": {}, "b": {}}, {"ddp_master": "zz"}, "ddp_master 'zz' is not a host"),
        ({"a": {"ddp_node_rank": 1}, "b": {"ddp_node_rank": 1}}, {}, "duplicate ddp_node_rank 1"),
        ({"a": {}, "b": {}}, {"ddp_cluster_cidr": "10.0.0.0/33"}, "not a valid CIDR"),
        ({"a": {}, "b": {}}, {"ddp_cluster_cidr": "0.0.0.0/0"}, "whole address space"),
        ({"a": {}, "b": {}}, {"ddp_master_port": 70000}, "between 1 and 65535"),
        ({"a": {}, "b": {}}, {"ddp_master_port": 0}, "between 1 and 65535"),
        ({"a": {}, "b": {}}, {"ddp_master_port": "http"}, "must be an integer"),
        ({"a": {}, "b": {}}, {"ddp_firewall": "ufw"}, "ddp_firewall must be one of"),
        ({"a": {"ddp_node_rank": 5}, "b": {}}, {}, "between 0 and 1"),
        ({"a": {"ddp_node_rank": 1}, "b": {}}, {}, "must have rank 0"),
        ({"a": {}, "b": {}}, {"ddp_cluster_cidr": "10.0.0.5/24"}, "has host bits set: did you mean 10.0.0.0/24?"),
        ({"a": {}, "b": {}}, {"ddp_cluster_cidr": "::/0"}, "whole address space"),
        ({"a": {}, "b": {}}, {"ddp_cluster_cidr": "fd00:1::/64"}, "'fd00:1::/64' is IPv6"),
        ({"a": {}, "b": {}}, {"ddp_cluster_cidr_ack_broad": "maybe"}, "ddp_cluster_cidr_ack_broad must be a boolean"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "etc/ddp.env"}, "must be an absolute path"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/tmp/ddp.env"}, "'/tmp/ddp.env' lies under /tmp"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/var/tmp/x/ddp.env"}, "lies under /var/tmp"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/dev/shm/ddp.env"}, "lies under /dev"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/proc/ddp.env"}, "lies under /proc"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/sys/ddp.env"}, "lies under /sys"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/run/user/0/ddp.env"}, "lies under /run/user"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/etc/ddpfix/"}, "names a directory"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/etc/../tmp/ddp.env"}, "not normalized"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/etc/ddp env"}, "whitespace or shell characters"),
        ({"a": {}, "b": {}}, {"ddp_env_path": "/etc/$(id).env"}, "whitespace or shell characters"),
        ({"a": {}, "b": {}}, {"ddp_ntp_servers": ["pool.ntp.org iburst"]}, "'pool.ntp.org iburst' is not a hostname"),
        ({"a": {}, "b": {}}, {"ddp_ntp_servers": "a.example,b.example"}, "is not a hostname"),
        ({"a": {}, "b": {}}, {"ddp_ntp_servers": ["ntp1\nallow all"]}, "is not a hostname"),
        ({"a": {}, "b": {}}, {"ddp_ntp_servers": ['"ntp1"']}, "is not a hostname"),
        ({"a": {"ddp_socket_ifname": "eth0; reboot"}, "b": {}}, {}, "ddp_socket_ifname of a 'eth0; reboot'"),
        ({"a": {"ddp_socket_ifname": "averyveryverylongname0"}, "b": {}}, {}, "at most 15 characters"),
        ({"a": {"ddp_socket_ifname": "eth0/1"}, "b": {}}, {}, "ddp_socket_ifname of a"),
        ({"a": {"ddp_socket_ifname": "eth0,eth1"}, "b": {}}, {}, "explicit ^ or = prefix"),
        ({"a": {"ddp_python": "/opt/my env/python"}, "b": {}}, {}, "ddp_python of a '/opt/my env/python'"),
        ({"a": {"ddp_python": "python3; id"}, "b": {}}, {}, "ddp_python of a"),
        ({"a": {}, "b": {}}, {"ddp_nproc_per_node": 0}, "between 1 and 1024"),
        ({"a": {}, "b": {}}, {"ddp_nproc_per_node": True}, "must be an integer"),
        ({"a": {}, "b": {}}, {"ddp_ntp_local_master": "sure"}, "ddp_ntp_local_master must be a boolean"),
        ({"a": {}, "b": {}}, {"ddp_env_extra": {"nccl_debug": "INFO"}}, "key 'nccl_debug' is not an environment name"),
        ({"a": {}, "b": {}}, {"ddp_env_extra": {"NCCL_DEBUG": "INFO\nX=1"}}, "NCCL_DEBUG must be one line"),
        ({"a": {}, "b": {}}, {"ddp_env_extra": {"MASTER_ADDR": "1.2.3.4"}}, "MASTER_ADDR='1.2.3.4' is reserved"),
        ({"a": {}, "b": {}}, {"ddp_env_extra": ["NCCL_DEBUG=INFO"]}, "ddp_env_extra of a must be a mapping"),
        ({"a": {}, "b": {}}, {"ddp_nccl_ib_hca": "mlx5_0; rm -rf /"}, "ddp_nccl_ib_hca of a must be an NCCL_IB_HCA list"),
        ({"a": {}, "b": {}}, {"ddp_nccl_ib_gid_index": 300}, "ddp_nccl_ib_gid_index of a"),
        ({"a": {}, "b": {}}, {"ddp_launcher_units": ["trainer; reboot"]}, "ddp_launcher_units of a must be a list"),
        ({"a": {}, "b": {}}, {"ddp_memlock": "lots"}, "ddp_memlock"),
        ({"a": {}, "b": {}}, {"ddp_backup_keep": 0}, "ddp_backup_keep of a must be between 1 and 1000, got 0"),
        ({"a": {"ddp_backup_keep": "5; rm"}, "b": {}}, {}, "ddp_backup_keep of a must be an integer, got '5; rm'"),
        ({"a": {}, "b": {"ddp_backup_keep": True}}, {}, "ddp_backup_keep of b must be an integer"),
    ],
)
def test_invalid_inputs(hosts: dict, gv: dict, message: str) -> None:
    with pytest.raises(DdpfixError) as exc:
        cluster_from_inventory_data(_data(hosts, **gv))
    assert message in str(exc.value)
    assert exc.value.code == ExitCode.INVALID_INPUT


@pytest.mark.parametrize("ifname", ["eth0", "ens5f0np0", "^docker,lo", "=eth0", "^=eth0,eth1", "ib0"])
def test_valid_ifnames_and_python(ifname: str) -> None:
    c = cluster_from_inventory_data(_data({"a": {"ddp_socket_ifname": ifname, "ddp_python": "/opt/venv/bin/python"},
                                           "b": {"ddp_python": "python3"}}))
    assert c.node("a").socket_ifname == ifname


def test_cidr_ack_needed_for_public_or_broad_networks() -> None:
    from ddpfix.inventory.contract import cidr_needs_ack

    assert cidr_needs_ack("10.1.0.0/16") is None and cidr_needs_ack("100.64.0.0/16") is None
    assert "broader than /16" in (cidr_needs_ack("10.0.0.0/8") or "")
    assert "not a private network" in (cidr_needs_ack("8.8.8.0/24") or "")
    c = cluster_from_inventory_data(_data({"a": {}, "b": {}}, ddp_cluster_cidr="10.0.0.0/8", ddp_cluster_cidr_ack_broad=True))
    assert c.cidr_ack_broad


def test_empty_group() -> None:
    with pytest.raises(DdpfixError, match="has no hosts"):
        cluster_from_inventory_data({"_meta": {"hostvars": {}}, "ddp_nodes": {"hosts": []}})


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "hosts.yml"
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_real_inventory_file_group_vars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    inv = _write(tmp_path, """
        ddp_nodes:
          vars: {ddp_master_port: 29600, ddp_cluster_cidr: 192.168.50.0/24}
          hosts:
            n1: {ansible_host: 192.168.50.1}
            n2: {ansible_host: 192.168.50.2, ddp_socket_ifname: ens5}
        """)
    c = load_cluster([inv])
    assert c.master_port == 29600 and c.cluster_cidr == "192.168.50.0/24"
    assert c.node("n2").socket_ifname == "ens5" and c.node("n1").address == "192.168.50.1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ddp_nodes:\n  hosts: {}\n", "no hosts"),
        ("ddp_nodes: [unclosed\n", "cannot read inventory"),
        ("ddp_nodes:\n  hosts: {a: {ddp_node_rank: 0}, b: {ddp_node_rank: 0}}\n", "duplicate ddp_node_rank 0"),
    ],
)
def test_cli_bad_inventory_exit_2_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str) -> None:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "inv.yml"
    inv.write_text(text)
    r = CliRunner().invoke(cli, ["-i", str(inv), "audit"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.output


def test_cli_one_unparseable_source_of_two_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ansible would warn and go on with the hosts of the other source; the audit (ansible-playbook is its one reader
    of the inventory) stops with the inventory's error, as the CLI's own read does, and leaves no run behind."""
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text("ddp_nodes:\n  hosts: {a: {ansible_host: 192.0.2.1}}\n")
    bad.write_text("ddp_nodes: [unclosed\n")
    r = CliRunner().invoke(cli, ["-i", str(good), "-i", str(bad), "audit"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot read inventory" in lines[0], r.output
    runs = tmp_path / "state" / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_cli_missing_inventory_and_bad_option(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["-i", str(tmp_path / "nope.yml"), "audit"])
    assert r.exit_code == 2 and "inventory not found" in r.output
    r = CliRunner().invoke(cli, ["-i", str(tmp_path / "nope.yml"), "audit", "--fail-on", "fatal"])
    assert r.exit_code == 2 and "fatal" in r.output


def test_missing_ansible_playbook_is_a_prerequisite_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from ddpfix.ansible.env import find_ansible_playbook

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DdpfixError) as exc:
        find_ansible_playbook()
    assert exc.value.code == ExitCode.PREREQUISITE and "ansible-playbook not found" in str(exc.value)


def test_runner_keeps_host_key_checking_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ddpfix.ansible.env import ansible_env

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("ANSIBLE_HOST_KEY_CHECKING", raising=False)
    env = ansible_env(tmp_path, 5)
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"  # ansible-runner alone would turn it off
    assert env["ANSIBLE_PIPELINING"] == "True" and "ControlPersist" in env["ANSIBLE_SSH_ARGS"]
    assert env["ANSIBLE_HOME"].startswith(str(tmp_path))
