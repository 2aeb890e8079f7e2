"""The files each node's remediation writes (`ddpfix.remediate.writes`): the per-node play's pre-flight reads them
from the plan (`ddpfix_plan[node].write_paths`, `.write_if_present`) instead of working them out in Jinja. Each path
is the role's default, read from the role, unless the inventory sets the role's input for the node."""

from __future__ import annotations

from pathlib import Path

import yaml

from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.model.cluster import Node
from ddpfix.remediate import HostPlan
from ddpfix.remediate.writes import UNIT_DIR, node_writes, role_file, write_if_present, write_paths

ROOT = Path(__file__).resolve().parents[3]
ENV = "/etc/ddpfix/ddp.env"
EVERY = HostPlan(firewall="firewalld", hosts=True, time=True, env={"MASTER_ADDR": "10.0.0.1"},
                 pin_ifname={"name": "eth1", "mac": "52:54:00:00:00:01"}, limits=True,
                 nofile={"soft": "65536", "hard": "0", "unit_hard": "524288"}, arp=["eth1"],
                 firewalld=[{"policy": "allow-host", "rich_rule": "x"}])


def _default(role: str, name: str) -> str:
    return str(yaml.safe_load((ROOT / "roles" / f"ddpfix_{role}" / "defaults" / "main.yml").read_text())[name])


def test_every_fix_writes_its_roles_default_paths() -> None:
    node = Node("n1", "10.0.0.1", 0, role_vars={"ddp_launcher_units": ["trainer.service"]})
    dropins = yaml.safe_load((ROOT / "roles" / "ddpfix_limits" / "vars" / "main.yml").read_text())
    assert write_paths(EVERY, node, ENV, cluster_file=True) == [
        _default("hosts", "ddpfix_hosts_path"), ENV, "/etc/ddpfix/cluster.json",
        _default("ifname", "ddpfix_ifname_link_file"),
        _default("limits", "ddpfix_limits_path"),
        f"{UNIT_DIR}/trainer.service.d/{dropins['__ddpfix_limits_memlock_dropin']}",
        _default("limits", "ddpfix_limits_nofile_path"),
        f"{UNIT_DIR}/trainer.service.d/{dropins['__ddpfix_limits_nofile_dropin']}",
        _default("sysctl", "ddpfix_sysctl_arp_path"),
        f"/etc/firewalld/zones/{_default('firewall', 'ddpfix_firewall_zone')}.xml",
        "/etc/firewalld/policies/allow-host.xml",
    ]
    assert write_paths(HostPlan(env={"A": "1"}), node, ENV, cluster_file=False) == [ENV]
    assert write_paths(HostPlan(), node, ENV, cluster_file=True) == []
    assert write_if_present(EVERY, node) == []


def test_the_inventory_overrides_a_roles_path_per_node() -> None:
    data = {"all": {"children": ["ddp_nodes"]},
            "ddp_nodes": {"hosts": ["a", "b"]},
            "_meta": {"hostvars": {
                "a": {"ansible_host": "10.0.0.1", "ddpfix_hosts_path": "/srv/hosts", "ddpfix_firewall_zone": "ddp",
                      "ddpfix_limits_units": ["job.service"], "ddp_launcher_units": ["other.service"],
                      "ddpfix_env_cluster_path": "/srv/cluster.json"},
                "b": {"ansible_host": "10.0.0.2", "ddpfix_firewall_iptables_rules_paths": ["/srv/rules.v4"]}}}}
    cluster = cluster_from_inventory_data(data)
    a, b = cluster.node("a"), cluster.node("b")
    plan = HostPlan(firewall="firewalld", hosts=True, env={"A": "1"},
                    nofile={"soft": "65536", "hard": "0", "unit_hard": "infinity"})
    assert write_paths(plan, a, ENV, cluster_file=True) == [
        "/srv/hosts", ENV, "/srv/cluster.json", _default("limits", "ddpfix_limits_nofile_path"),
        f"{UNIT_DIR}/job.service.d/90-ddpfix-nofile.conf", "/etc/firewalld/zones/ddp.xml"]
    assert write_paths(plan, b, ENV, cluster_file=True)[:3] == [_default("hosts", "ddpfix_hosts_path"), ENV,
                                                               "/etc/ddpfix/cluster.json"]
    assert write_if_present(HostPlan(firewall="iptables-legacy"), b) == [
        "/srv/rules.v4", "/etc/ufw/user.rules", "/etc/ufw/user6.rules"]
    assert write_if_present(HostPlan(firewall="nftables"), a) == role_file("firewall")["ddpfix_firewall_nft_layouts"]
    # what the cluster-wide play writes the hosts block and the cluster file into
    assert {k: node_writes(plan, a, ENV, True)[k] for k in ("hosts_path", "cluster_path")} == {
        "hosts_path": "/srv/hosts", "cluster_path": "/srv/cluster.json"}
    assert {k: node_writes(plan, b, ENV, True)[k] for k in ("hosts_path", "cluster_path")} == {
        "hosts_path": _default("hosts", "ddpfix_hosts_path"), "cluster_path": "/etc/ddpfix/cluster.json"}


def test_per_node_is_every_fix_of_the_per_node_play() -> None:
    """HostPlan.per_node: what remediate.yml's per-node play does besides its pre-flight (the hosts block, the env
    file and the limits drop-ins are the cluster-wide play's ddpfix_node_files call's)."""
    assert not HostPlan().per_node
    assert not HostPlan(hosts=True, env={"A": "1"}, limits=True, nofile={"soft": "65536"}).per_node
    for fix in ({"firewall": "iptables"}, {"time": True},
                {"arp": ["eth0"]}, {"pin_ifname": {"name": "eth0", "mac": "m"}}):
        assert HostPlan(**fix).per_node, fix  # type: ignore[arg-type]
        assert HostPlan(**fix).to_vars()["per_node"]  # type: ignore[arg-type]


def test_the_limits_drop_ins_are_rendered_here_with_the_inventorys_values() -> None:
    """The plan's `files`: every limits drop-in at the path the pre-flight checks, its text rendered on the
    controller with the cluster's ddp_memlock (a node's ddpfix_limits_memlock first), the units' drop-ins marked for
    systemd's daemon-reload; values the drop-ins cannot take are refused (ValueError: exit 2 before any node)."""
    import pytest

    from ddpfix.remediate.writes import MEMLOCK_TASK, UNIT_NOFILE_TASK, limits_files

    both = {"ddp_memlock": 8192, "ddp_launcher_units": ["job.service"]}
    data = {"all": {"children": ["ddp_nodes"]}, "ddp_nodes": {"hosts": ["a", "b"]},
            "_meta": {"hostvars": {"a": {"ansible_host": "10.0.0.1", **both},
                                   "b": {"ansible_host": "10.0.0.2", "ddpfix_limits_memlock": "unlimited", **both}}}}
    cluster = cluster_from_inventory_data(data)
    a, b = cluster.node("a"), cluster.node("b")
    files = node_writes(EVERY, a, ENV, True, cluster.memlock_kib)["files"]
    assert [f["path"] for f in files] == [p for p in write_paths(EVERY, a, ENV, True) if "limits.d" in p or
                                          p.startswith(UNIT_DIR)]
    assert [(f["key"], f["reload"]) for f in files] == [("memlock", False), ("memlock", True), ("nofile", False),
                                                        ("nofile", True)]
    assert files[0]["what"] == MEMLOCK_TASK.format(path=files[0]["path"])
    assert files[3]["what"] == UNIT_NOFILE_TASK.format(unit="job.service")
    assert "*       soft    memlock    8192\n" in files[0]["content"] and "LimitMEMLOCK=8192K\n" in files[1]["content"]
    assert "LimitNOFILE=65536:524288\n" in files[3]["content"] and all(f["mode"] == "0644" for f in files)
    b_files = limits_files(EVERY, b, cluster.memlock_kib)
    assert "LimitMEMLOCK=infinity\n" in b_files[1]["content"]
    assert limits_files(HostPlan(hosts=True, env={"A": "1"}), a) == []
    with pytest.raises(ValueError, match="open-file limit"):
        limits_files(HostPlan(nofile={"soft": "99", "hard": "0", "unit_hard": "infinity"}), a)
    with pytest.raises(ValueError, match=r"\.service"):
        limits_files(HostPlan(limits=True), Node("c", "10.0.0.3", 2, role_vars={"ddp_launcher_units": ["x;rm"]}))
