"""verify --backend nccl without a GPU: bus bandwidth math, NCCL_DEBUG=INFO parsing, the per-node verdict, the CLI.

The logs under fixtures/nccl/nccl_info_*.log follow NCCL's INFO line format (`host:pid:tid [dev] NCCL INFO ...`) as
published in NVIDIA/nccl-tests#185 (`NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB ...`,
`Using network IB`), NVIDIA/nccl#958 (`NET/IB : No device found.`), Mellanox/nv_peer_memory#56 (`NET/Socket : Using
[0]ib0:...`), NVIDIA/nccl#1814 (`Channel 03/0 : 47[7] -> 39[7] [receive] via NET/IBext_v8/2`) and aws-ofi-nccl's
`NET/OFI Selected Provider is efa`; host names, addresses and PIDs are our own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from unit_helpers import FIXTURES

from ddpfix.cli import cli
from ddpfix.rules import netif as netif_rules
from ddpfix.verify import nccl
from ddpfix.verify.nccl import nccl_entry, nccl_skip_line

LOGS = FIXTURES / "nccl"


def log(name: str) -> str:
    return (LOGS / name).read_text()


@pytest.mark.parametrize(("n", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), (16, 1.875)])
def test_busbw_is_nccl_tests_formula(n: int, factor: float) -> None:
    assert nccl.busbw(100.0, n) == pytest.approx(100.0 * factor)


def test_algbw_in_gb_per_s() -> None:
    assert nccl.algbw(1 << 30, 0.01) == pytest.approx(107.374, rel=1e-4)
    assert nccl.algbw(1 << 20, 0) == 0.0


def test_default_sweep_is_8m_to_1g() -> None:
    assert nccl.DEFAULT_SIZES[0] == 8 << 20 and nccl.DEFAULT_SIZES[-1] == 1 << 30 and len(nccl.DEFAULT_SIZES) == 8


def test_parse_sizes() -> None:
    assert nccl.parse_sizes("1G,8M,64MiB,8M") == (8 << 20, 64 << 20, 1 << 30)
    for bad in ("", "8X", "0M", "1G,,2G"):
        with pytest.raises(ValueError):
            nccl.parse_sizes(bad)


def test_roce_log() -> None:
    t = nccl.parse_transport(log("nccl_info_roce.log"))
    assert (t.kind, t.network, t.gdrdma, t.version) == ("RoCE", "IB", True, "2.19.3")
    assert t.net_devices == ["mlx5_0:1/RoCE", "mlx5_1:1/RoCE"] and t.via == ["NET/IB"]
    assert nccl.fallback_error(t, rdma_present=True) is None


def test_socket_fallback_is_an_error_only_where_rdma_exists() -> None:
    t = nccl.parse_transport(log("nccl_info_socket_fallback.log"))
    assert (t.kind, t.no_ib_device, t.net_devices) == ("Socket", True, ["eth0:192.168.77.12<0>"])
    err = nccl.fallback_error(t, rdma_present=True)
    assert err and "fell back to sockets" in err and "NET/IB found no usable device" in err
    assert nccl.fallback_error(t, rdma_present=False) is None


def test_efa_log() -> None:
    t = nccl.parse_transport(log("nccl_info_efa.log"))
    assert (t.kind, t.ofi_provider, t.network) == ("EFA", "efa", "AWS Libfabric")
    assert "P2P/IPC" in t.via


def test_ibext_plugin_counts_as_ib() -> None:
    t = nccl.parse_transport("node1:1:2 [7] NCCL INFO Channel 03/0 : 47[7] -> 39[7] [receive] via NET/IBext_v8/2\n")
    assert t.kind == "IB" and t.via == ["NET/IBext_v8"]


def test_ring_pairs() -> None:
    assert nccl.ring_pairs(["a"]) == []
    assert nccl.ring_pairs(["a", "b"]) == [("a", "b")]
    assert nccl.ring_pairs(["a", "b", "c"]) == [("a", "b"), ("b", "c"), ("c", "a")]


def _res(stdout: str, rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


RESULT = ('DDPFIX_NCCL_RESULT {"ok": true, "rank": 0, "world_size": 16, "hostname": "node1", "gpus": 8, "nccl": "2.21.5", '
          '"sweep": [{"size": 8388608, "seconds": 0.0002}, {"size": 1073741824, "seconds": 0.0125}]}')


def test_entry_computes_busbw_per_size_and_applies_the_threshold() -> None:
    e = nccl_entry("node1", _res(log("nccl_info_roce.log") + RESULT + "\n"), True, None)
    assert e["ok"] and e["transport"]["kind"] == "RoCE" and e["world_size"] == 16
    top = e["sweep"][-1]
    assert top["algbw"] == pytest.approx(85.899, rel=1e-3) and top["busbw"] == pytest.approx(85.899 * 1.875, rel=1e-3)
    slow = nccl_entry("node1", _res(log("nccl_info_roce.log") + RESULT + "\n"), True, 200.0)
    assert not slow["ok"] and "below --min-busbw 200" in slow["error"] and "at 1G" in slow["error"]


def test_entry_fails_on_silent_socket_fallback() -> None:
    e = nccl_entry("node2", _res(log("nccl_info_socket_fallback.log") + RESULT.replace("node1", "node2") + "\n"), True, None)
    assert not e["ok"] and "fell back to sockets" in e["error"]


def test_entry_without_gpu_is_skipped_with_the_reason() -> None:
    # torchrun --nproc_per_node=gpu on a node without CUDA (torch.distributed.run's own message)
    e = nccl_entry("node1", _res("", rc=1, stderr="ValueError: Cuda is not available.\n"), False, None)
    assert e["skipped"] and not e["ok"] and "torch.cuda.is_available() is False" in e["error"]
    line = nccl_skip_line({"gang": [e, dict(e, host="node2")]})
    assert line and "no GPU on node1, node2" in line


def test_entry_bad_interface_names_the_cause() -> None:
    err = ("node1:11:11 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to =eth9\n"
           "node1:11:11 [0] bootstrap.cc:1093 NCCL WARN Bootstrap : no socket interface found\n"
           "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, internal error\n")
    e = nccl_entry("node1", _res("", rc=1, stderr=err), True, None)
    assert not e["ok"] and "DistBackendError" in e["error"] and netif_rules.MISSING.id in e["cause"]


def test_cli_rejects_bad_sizes_and_nccl_options_without_nccl(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    ddp_nodes:\n      hosts:\n        node1: {}\n")
    r = CliRunner().invoke(cli, ["-i", str(inv), "verify", "--backend", "nccl", "--sizes", "8X"])
    assert r.exit_code == 2 and "--sizes" in r.output and len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(cli, ["-i", str(inv), "verify", "--pairs"])
    assert r.exit_code == 2 and "need --backend nccl" in r.output
