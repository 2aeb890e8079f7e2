"""The fabric reader on the recorded sysfs trees (fixtures/sysfs, see its README)."""

from __future__ import annotations

import os
from pathlib import Path

from unit_helpers import SYSFS_FIXTURES, fabric_facts, fabric_module


def test_no_infiniband_class_reads_nothing_and_runs_nothing(tmp_path: Path) -> None:
    facts, unread = fabric_module().collect(str(tmp_path), str(tmp_path), python="/nonexistent/python")
    assert facts["present"] is False and facts["devices"] == [] and facts["memlock"] is None
    assert facts["nccl_version"] is None and unread == []


def test_ib_tree() -> None:
    f = fabric_facts("ib_hdr")
    assert [d["name"] for d in f["devices"]] == ["mlx5_0", "mlx5_1"]
    d = f["devices"][1]
    assert d["netdevs"] == ["ib1"] and d["numa_node"] == 1 and d["driver"] == "mlx5_core"
    p = d["ports"][0]
    assert (p["port"], p["state"], p["state_num"], p["phys_state"]) == (1, "ACTIVE", 4, "LinkUp")
    assert (p["rate_gbps"], p["link_layer"], p["pkey0"]) == (200.0, "InfiniBand", "0xffff")
    assert [g["index"] for g in p["gids"]] == [0]  # all-zero entries skipped
    assert f["uverbs"] == ["uverbs0", "uverbs1"] and f["umad"] == ["umad0", "umad1"] and f["mad_abi"] == "5"
    assert f["modules"] == {"nvidia_peermem": True, "gdrdrv": False} and f["gpu"] is True
    assert f["memlock"]["soft"] != 0 and f["efa"]["devices"] == []


def test_roce_tree_gids_with_types_and_netdevs() -> None:
    f = fabric_facts("roce")
    gids = f["devices"][0]["ports"][0]["gids"]
    v2 = [g for g in gids if g["type"] == "RoCE v2" and g["ipv4"]]
    assert [(g["index"], g["ipv4"], g["ndev"]) for g in v2] == [(3, "10.10.0.11", "eth2")]
    assert f["devices"][0]["ports"][0]["link_layer"] == "Ethernet" and f["gpu"] is False


def test_efa_tree() -> None:
    f = fabric_facts("efa")
    assert f["efa"]["devices"] == ["rdmap16s27"] and f["efa"]["fi_info"] is None  # tools not run here


def test_parsers() -> None:
    m = fabric_module()
    assert m.parse_state("1: DOWN") == (1, "DOWN") and m.parse_state("") == (None, None)
    assert m.parse_rate("25 Gb/sec (1X EDR)") == 25.0 and m.parse_rate("junk") is None
    assert m.ipv4_of_gid("0000:0000:0000:0000:0000:ffff:c0a8:4d0b") == "192.168.77.11"
    assert m.ipv4_of_gid("fe80:0000:0000:0000:0a5e:45ff:fe00:0001") is None


def test_unreadable_port_is_unread_not_empty(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        import pytest
        pytest.skip("root reads a mode-000 file")
    import shutil
    shutil.copytree(SYSFS_FIXTURES / "roce", tmp_path / "t", symlinks=True)
    ports = tmp_path / "t" / "sys" / "class" / "infiniband" / "mlx5_0" / "ports"
    os.chmod(ports, 0)
    try:
        _facts, unread = fabric_module().collect(str(tmp_path / "t" / "sys"), str(tmp_path / "t" / "dev"), run_tools=False)
    finally:
        os.chmod(ports, 0o755)
    assert unread and unread[0]["source"] == "fabric"


def test_no_fabric_costs_nothing(tmp_path: Path) -> None:
    """Without /sys/class/infiniband: one stat, no tools, well under a millisecond per call on average."""
    import time

    collect = fabric_module().collect
    t0 = time.perf_counter()
    for _ in range(1000):
        collect(str(tmp_path), str(tmp_path), python="/nonexistent/python")
    assert (time.perf_counter() - t0) / 1000 < 1e-3


def test_unit_memlock_parses_systemctl_show(monkeypatch) -> None:
    m = fabric_module()
    answers = {"a.service": (0, "LimitMEMLOCK=infinity\nLimitMEMLOCKSoft=infinity\n", ""),
               "b.service": (0, "LimitMEMLOCK=8388608\nLimitMEMLOCKSoft=65536\n", ""),
               "c.service": (1, "", "Failed to connect to bus: No such file or directory\n")}
    monkeypatch.setattr(m, "run_command", lambda argv, timeout: answers[argv[-1]])
    got, whys = m.unit_memlock(["a.service", "b.service", "c.service"])
    assert got["a.service"]["soft"] == -1 and (got["b.service"]["soft"], got["b.service"]["hard"]) == (65536, 8388608)
    assert whys == ["systemctl show c.service: Failed to connect to bus: No such file or directory"]
