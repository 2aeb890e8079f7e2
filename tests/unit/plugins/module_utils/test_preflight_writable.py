"""The remediation pre-flight (module_utils ddpfix_writable, `ddpfix_run_lock state=writable`): every reason a file
ddpfix will write cannot be written is found before any node is changed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from unit_helpers import load_role_module

wr = load_role_module("module_utils/ddpfix_writable.py", "ddpfix_writable")
REAL_STATVFS = os.statvfs


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    d = tmp_path / "etc"
    (d / "ddpfix").mkdir(parents=True)
    (d / "ddpfix" / "ddp.env").write_text("A=1\n")
    (d / "hosts").write_text("127.0.0.1 localhost\n")
    return d


def _flags(monkeypatch: pytest.MonkeyPatch, by_path: dict[str, int]) -> None:
    monkeypatch.setattr(wr, "attr_flags", lambda p: by_path.get(str(p), 0))


def _statvfs(monkeypatch: pytest.MonkeyPatch, **fields: int) -> None:
    real = REAL_STATVFS
    names = ["f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail", "f_flag",
             "f_namemax"]

    def fake(p: str) -> Any:
        st = real(p)
        return os.statvfs_result(tuple(fields.get(n, getattr(st, n)) for n in names))

    monkeypatch.setattr(wr.os, "statvfs", fake)


def test_plain_files_and_a_new_file_in_a_new_directory_pass(etc: Path) -> None:
    assert wr.unwritable([str(etc / "hosts"), str(etc / "ddpfix" / "ddp.env"), str(etc / "ddpfix" / "cluster.json"),
                          str(etc / "systemd" / "network" / "10-ddpfix-cluster.link")]) == {}


@pytest.mark.parametrize(("flag", "word", "cmd"), [(0x10, "immutable (chattr +i)", "chattr -i"),
                                                   (0x20, "append-only (chattr +a)", "chattr -a")])
def test_immutable_or_append_only_file_or_directory(etc: Path, monkeypatch: pytest.MonkeyPatch, flag: int,
                                                    word: str, cmd: str) -> None:
    env = str(etc / "ddpfix" / "ddp.env")
    _flags(monkeypatch, {env: flag})
    assert wr.unwritable([env]) == {env: f"{env}: {word}: run `{cmd} {env}` if it may change"}
    # the directory: no temporary file can be renamed into it (append-only) or created (immutable)
    d = str(etc / "ddpfix")
    _flags(monkeypatch, {d: flag})
    assert word in wr.unwritable([env])[env]
    new = str(etc / "ddpfix" / "cluster.json")
    assert wr.unwritable([new]) == {new: f"{d}: {word}: run `{cmd} {d}` if it may change"}


def test_read_only_mount(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _statvfs(monkeypatch, f_flag=os.ST_RDONLY)
    p = str(etc / "hosts")
    assert wr.unwritable([p]) == {p: f"{p}: read-only file system"}


def test_full_file_system_blocks_and_inodes(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = str(etc / "ddpfix" / "ddp.env")
    _statvfs(monkeypatch, f_bfree=1, f_bavail=1, f_frsize=4096)
    assert "file system full (4096 bytes free" in wr.unwritable([p])[p]
    _statvfs(monkeypatch, f_files=1000, f_ffree=0, f_favail=0)
    assert "out of inodes (0 free, 2 needed)" in wr.unwritable([p])[p]
    new = str(etc / "a" / "b" / "new.conf")  # two directories to create, the file and its temporary: 4 inodes
    _statvfs(monkeypatch, f_files=1000, f_ffree=3, f_favail=3)
    assert "out of inodes (3 free, 4 needed)" in wr.unwritable([new])[new]
    _statvfs(monkeypatch, f_files=0, f_ffree=0, f_favail=0)  # no inode limit (btrfs): not a problem
    assert wr.unwritable([new]) == {}


def test_room_for_the_file_and_its_backup(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = etc / "hosts"
    big.write_text("x" * 100_000)
    _statvfs(monkeypatch, f_bfree=60, f_bavail=60, f_frsize=4096)  # 240 KiB: less than 2 x 100 kB + 64 KiB
    assert "needed for the new file and its backup" in wr.unwritable([str(big)])[str(big)]
    _statvfs(monkeypatch, f_bfree=80, f_bavail=80, f_frsize=4096)
    assert wr.unwritable([str(big)]) == {}


def test_missing_directory_that_cannot_be_created(etc: Path) -> None:
    (etc / "systemd").write_text("a file where a directory should be")
    p = str(etc / "systemd" / "network" / "10-ddpfix-cluster.link")
    assert wr.unwritable([p]) == {p: f"{etc / 'systemd'}: not a directory, so {etc}/systemd/network cannot be "
                                     "created"}


def test_dangling_symlink_and_directory(etc: Path) -> None:
    (etc / "link.env").symlink_to(etc / "nowhere.env")
    p = str(etc / "link.env")
    assert "a symlink to" in wr.unwritable([p])[p]
    assert "a directory" in wr.unwritable([str(etc / "ddpfix")])[str(etc / "ddpfix")]
    assert "not an absolute path" in wr.unwritable(["etc/hosts"])["etc/hosts"]


def test_symlink_checked_at_its_target(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (etc / "link.env").symlink_to(etc / "ddpfix" / "ddp.env")
    _flags(monkeypatch, {str(etc / "ddpfix" / "ddp.env"): 0x20})
    p = str(etc / "link.env")
    assert "append-only" in wr.unwritable([p])[p]


def test_if_present_groups(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf, inc = str(etc / "nftables.conf"), str(etc / "nftables.d" / "ddpfix.nft")
    rules = str(etc / "iptables" / "rules.v4")
    assert wr.unwritable([], [[conf, inc], [rules]]) == {}  # none exists: nothing to check
    Path(conf).write_text("")
    (etc / "nftables.d").write_text("not a directory")
    assert list(wr.unwritable([], [[conf, inc], [rules]])) == [inc]


@pytest.fixture
def chattr_file(tmp_path: Path) -> Iterator[Path]:
    p = tmp_path / "real.env"
    p.write_text("A=1\n")
    yield p
    subprocess.run(["chattr", "-a", "-i", str(p)], check=False, capture_output=True)


@pytest.mark.parametrize(("flag", "word"), [("+a", "append-only"), ("+i", "immutable")])
def test_real_chattr_read_by_the_ioctl(chattr_file: Path, flag: str, word: str) -> None:
    """lsattr's own ioctl on a real file (tmp_path is on a file system with attributes here, as on the lab's
    nodes; the lab test does the same through ansible)."""
    if os.geteuid() != 0 or subprocess.run(["chattr", flag, str(chattr_file)], capture_output=True).returncode:
        pytest.skip("chattr needs root and a file system with inode flags")
    assert word in wr.unwritable([str(chattr_file)])[str(chattr_file)]
