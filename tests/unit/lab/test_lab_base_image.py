"""A lab node's /etc is a copy of the host's: what ddpfix may have written on the host itself is not copied."""

from __future__ import annotations

from pathlib import Path

from ddpfix.lab.nodefiles import drop_ddpfix_state


def test_host_ddpfix_files_are_dropped_from_the_node_copy_and_nothing_else(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "ddpfix").mkdir(parents=True)
    (etc / "ddpfix" / "ddp.env").write_text("MY_KEY=keepme\n")  # what CI's machine had on its own /etc
    (etc / "nftables.d").mkdir()
    (etc / "nftables.d" / "ddpfix.nft").write_text("table inet ddpfix {}\n")
    (etc / "security" / "limits.d").mkdir(parents=True)
    (etc / "security" / "limits.d" / "90-ddpfix-memlock.conf").write_text("* soft memlock unlimited\n")
    (etc / "security" / "limits.d" / "10-site.conf").write_text("* soft nofile 65536\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "ddpfix-link").symlink_to(etc / "hosts")
    gone = drop_ddpfix_state(etc)
    assert sorted(p.relative_to(etc).as_posix() for p in gone) == [
        "ddpfix", "ddpfix-link", "nftables.d/ddpfix.nft", "security/limits.d/90-ddpfix-memlock.conf"]
    assert sorted(p.relative_to(etc).as_posix() for p in etc.rglob("*") if p.is_file()) == [
        "hosts", "security/limits.d/10-site.conf"]
