"""The launch path's host facts (module_utils ddpfix_launchenv) and their checks (ddpfix.rules.host), no host needed.

Shell start files are read as text: the parser is shown what bash would do with each line (exported or not, set
for one command only, quoted, expanded), and the collector real files in a temporary tree, one unreadable.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest
from unit_helpers import Sim, load_role_module

from ddpfix.rules import env as env_rules
from ddpfix.rules import host as host_rules
from ddpfix.rules.host import NCCL_SHM_SEGMENT, shm_needed


def launchenv() -> ModuleType:
    return load_role_module("module_utils/ddpfix_launchenv.py", "ddpfix_launchenv")


def _parsed(text: str) -> list[tuple[int, str, str, bool, bool]]:
    return [(a["line"], a["key"], a["value"], a["dynamic"], a["exported"])
            for a in launchenv().parse_assignments(text)]


@pytest.mark.parametrize(("line", "want"), [
    ("export MASTER_ADDR=10.0.0.5", [(1, "MASTER_ADDR", "10.0.0.5", False, True)]),
    ('MASTER_PORT="29500"  # the old port', [(1, "MASTER_PORT", "29500", False, False)]),
    ("export NCCL_SOCKET_IFNAME='^docker,lo'", [(1, "NCCL_SOCKET_IFNAME", "^docker,lo", False, True)]),
    ('export NODE_RANK="$SLURM_NODEID"', [(1, "NODE_RANK", "$SLURM_NODEID", True, True)]),
    ("export WORLD_SIZE=`nproc`", [(1, "WORLD_SIZE", "`nproc`", True, True)]),
    ('[ -n "$X" ] && export RANK=0', [(1, "RANK", "0", False, True)]),
    ("if true; then export LOCAL_RANK=0; fi", [(1, "LOCAL_RANK", "0", False, True)]),
    ('export A=1 PET_NNODES="4" B=2', [(1, "PET_NNODES", "4", False, True)]),
    ("declare -x GLOO_SOCKET_IFNAME=ens5", [(1, "GLOO_SOCKET_IFNAME", "ens5", False, True)]),
    ("GLOO_SOCKET_IFNAME=eth0 python train.py", []),  # set for that one command only
    ("# export MASTER_ADDR=10.0.0.5", []),
    ("export PATH=/usr/bin:$PATH", []),  # not a launcher variable
    ("MASTER_ADDR_OLD=1", []),
])
def test_assignments_are_read_as_bash_reads_them(line: str, want: list[tuple[int, str, str, bool, bool]]) -> None:
    assert _parsed(line) == want


def test_a_later_export_exports_an_earlier_assignment() -> None:
    assert _parsed("RANK=3\nMASTER_PORT=1\nexport RANK\n") == [(1, "RANK", "3", False, True),
                                                               (2, "MASTER_PORT", "1", False, False)]


def test_start_files_are_read_as_files_with_their_lines(tmp_path: Path) -> None:
    etc, home = tmp_path / "etc", tmp_path / "home" / "ops"
    (etc / "profile.d").mkdir(parents=True)
    home.mkdir(parents=True)
    (etc / "environment").write_text('PATH="/usr/bin"\nNODE_RANK=0\n')
    (etc / "profile.d" / "site.sh").write_text("# site\nexport MASTER_ADDR=10.0.0.5\n$(touch /tmp/never)\n")
    (etc / "profile.d" / "token.sh").write_text("export PET_RDZV_ENDPOINT=https://u:secret@h:1\n")
    (etc / "profile.d" / "not-sh.txt").write_text("export RANK=9\n")  # not *.sh: not sourced by /etc/profile
    (home / ".bashrc").write_text("export NCCL_SOCKET_IFNAME=eth1\n")
    locked = home / ".profile"
    locked.write_text("export RANK=1\n")
    locked.chmod(0)
    he = launchenv()
    facts, unread = he.stray_env_facts(system_files=(str(etc / "environment"), str(etc / "profile")),
                                       profile_d=str(etc / "profile.d" / "*.sh"), homes=[("ops", str(home))])
    got = {(a["file"].replace(str(tmp_path), ""), a["line"], a["key"], a["value"]) for a in facts["assignments"]}
    assert ("/etc/profile.d/site.sh", 2, "MASTER_ADDR", "10.0.0.5") in got
    assert ("/home/ops/.bashrc", 1, "NCCL_SOCKET_IFNAME", "eth1") in got
    assert ("/etc/profile.d/token.sh", 1, "PET_RDZV_ENDPOINT", "***") in got  # URL userinfo never leaves the node
    assert not any(k == "RANK" and v == "9" for _, _, k, v in got)
    assert not (tmp_path / "never").exists() and not Path("/tmp/never").exists()
    if os.geteuid() != 0:  # root reads a mode-0 file
        assert unread and unread[0]["source"] == "shell_env" and ".profile" in unread[0]["reason"]
    assert facts["users"] == ["ops"]


def test_shm_facts_read_statvfs_mountinfo_and_the_gpus(tmp_path: Path) -> None:
    gpus = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    for pci in ("0000:07:00.0", "0000:0f:00.0"):
        (gpus / pci).mkdir(parents=True)
    mi = tmp_path / "mountinfo"
    mi.write_text(f"30 25 0:27 / {tmp_path} rw,nosuid,nodev - tmpfs shm rw,size=65536k\n")
    facts, unread = launchenv().shm_facts(str(tmp_path), str(mi), str(tmp_path / "proc"), str(tmp_path / "dev"))
    assert unread == [] and facts["size_bytes"] > 0 and facts["fstype"] == "tmpfs"
    assert facts["options"] == "rw,size=65536k" and facts["gpus"] == 2 and facts["gpus_source"] == str(gpus)


def test_shm_that_cannot_be_read_is_unread_never_a_size(tmp_path: Path) -> None:
    facts, unread = launchenv().shm_facts(str(tmp_path / "absent"), str(tmp_path / "mi"), str(tmp_path), str(tmp_path))
    assert facts["size_bytes"] is None and facts["gpus"] is None
    assert [u["source"] for u in unread] == ["shm"] and "No such file" in unread[0]["reason"]


def test_shm_rule() -> None:
    assert NCCL_SHM_SEGMENT == 4194304 + 4915200 + 524288 + 4100  # Simple + LL128 + LL buffers + header (nccl#342)
    assert shm_needed(0) == shm_needed(1) == 2**30
    assert shm_needed(8) == 8 * 32 * NCCL_SHM_SEGMENT > 2 * 2**30


def test_ddp_nproc_per_node_counts_when_the_driver_shows_no_gpu(sim: Sim) -> None:
    sim.set_var(None, ddp_nproc_per_node=8)
    sim.node("node2")["shm"] = {"path": "/dev/shm", "size_bytes": 2 * 2**30, "avail_bytes": 2 * 2**30,
                                "fstype": "tmpfs", "options": "rw,size=2097152k", "gpus": None, "gpus_source": None}
    found = [f for f in sim.findings() if f.id == host_rules.SHM_SMALL.id]
    assert [f.host for f in found] == ["node2"] and "GPUs per node: 8 (ddp_nproc_per_node 8)" in found[0].evidence


def test_stray_secret_is_never_shown(sim: Sim) -> None:
    sim.node("node2")["shell_env"] = {"users": ["root"], "files": ["/etc/environment"], "assignments": [
        {"file": "/etc/environment", "line": 1, "key": "MASTER_ADDR", "value": "***", "dynamic": False,
         "conditional": False, "exported": True, "secret": True}]}
    f = next(f for f in sim.findings() if f.id == env_rules.STRAY.id)
    assert "MASTER_ADDR=*** (secret-looking, not shown) (cannot be compared" in f.evidence
