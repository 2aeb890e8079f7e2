"""The chrony role's reader (roles/ddpfix_chrony/library/ddpfix_chrony_conf.py): which file chronyd reads and whether
that file reads ddpfix's drop-in. Host-free: files under tmp_path, a fake /proc."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from unit_helpers import load_role_module


@pytest.fixture(scope="module")
def cc() -> ModuleType:
    return load_role_module("modules/ddpfix_chrony_conf.py", "ddpfix_chrony_conf")


# Debian 12's /etc/chrony/chrony.conf (directives only) and RHEL 9's /etc/chrony.conf
DEBIAN = ("confdir /etc/chrony/conf.d\npool 2.debian.pool.ntp.org iburst\nsourcedir /run/chrony-dhcp\n"
          "sourcedir /etc/chrony/sources.d\nkeyfile /etc/chrony/chrony.keys\ndriftfile /var/lib/chrony/chrony.drift\n")
RHEL = ("# Use public servers from the pool.ntp.org project.\npool 2.rhel.pool.ntp.org iburst\nsourcedir /run/chrony-dhcp\n"
        "driftfile /var/lib/chrony/drift\nmakestep 1.0 3\nrtcsync\nkeyfile /etc/chrony.keys\nntsdumpdir /var/lib/chrony\n"
        "leapsectz right/UTC\nlogdir /var/log/chrony\n")


def _directives(cc: ModuleType, path: Path) -> list:
    return cc.directives(str(path))


def test_debian_default_reads_conf_d(cc: ModuleType, tmp_path: Path) -> None:
    conf = tmp_path / "chrony" / "chrony.conf"
    conf.parent.mkdir()
    conf.write_text(DEBIAN.replace("/etc/chrony/conf.d", str(tmp_path / "chrony" / "conf.d")))
    found = _directives(cc, conf)
    assert [(k, a) for _, _, k, a in found] == [("confdir", [str(tmp_path / "chrony" / "conf.d")])]
    d = cc.choose_dropin_dir(str(conf), found)
    assert d == str(tmp_path / "chrony" / "conf.d") or d.endswith("/chrony/conf.d")
    assert cc.reads(found, str(tmp_path / "chrony" / "conf.d" / "ddpfix.conf"))


def test_rhel_and_hand_written_files_read_no_drop_in(cc: ModuleType, tmp_path: Path) -> None:
    conf = tmp_path / "chrony.conf"
    conf.write_text(RHEL)
    found = _directives(cc, conf)
    assert found == []  # sourcedir reads only *.sources (server/pool/peer), never a .conf drop-in
    assert cc.choose_dropin_dir("/etc/chrony.conf", found) == "/etc/chrony.d"
    assert cc.choose_dropin_dir("/etc/chrony/chrony.conf", found) == "/etc/chrony/conf.d"
    assert not cc.reads(found, "/etc/chrony.d/ddpfix.conf")
    assert cc.choose_dropin_dir("/etc/chrony.conf", found, "/srv/chrony.d/") == "/srv/chrony.d"


@pytest.mark.parametrize(("line", "reads"), [
    ("include /etc/chrony.d/*.conf", True),
    ("include /etc/chrony.d/ddpfix.conf", True),
    ("include /etc/chrony.d/*.sources", False),
    ("include /etc/*.conf", False),  # '*' does not cross '/'
    ("confdir /etc/chrony.d", True),
    ("confdir /run/chrony-extra /etc/chrony.d/", True),
    ("confdir /etc/chrony/conf.d", False),
    ("! confdir /etc/chrony.d", False),  # a comment
    ("  # confdir /etc/chrony.d", False),
])
def test_confdir_and_include_globs(cc: ModuleType, tmp_path: Path, line: str, reads: bool) -> None:
    conf = tmp_path / "chrony.conf"
    conf.write_text(RHEL + line + "\n")
    assert cc.reads(_directives(cc, conf), "/etc/chrony.d/ddpfix.conf") is reads


def test_includes_are_followed(cc: ModuleType, tmp_path: Path) -> None:
    inc = tmp_path / "site"
    inc.mkdir()
    (inc / "local.conf").write_text("confdir /etc/chrony.d\n")
    conf = tmp_path / "chrony.conf"
    conf.write_text(f"include {inc}/*.conf\n")
    found = _directives(cc, conf)
    assert cc.reads(found, "/etc/chrony.d/ddpfix.conf")
    assert any(f.endswith("local.conf") for f, _, _, _ in found)
    (inc / "loop.conf").write_text(f"include {conf}\n")  # include cycles end
    assert cc.reads(_directives(cc, conf), "/etc/chrony.d/ddpfix.conf")


def test_conf_path_from_argv_and_option_files(cc: ModuleType) -> None:
    assert cc.conf_from_argv(["-F", "1", "-x", "-f", "/etc/chrony.conf"]) == "/etc/chrony.conf"
    assert cc.conf_from_argv(["-f/etc/x.conf"]) == "/etc/x.conf"
    assert cc.conf_from_argv(["-F", "1", "-x"]) is None
    assert cc.conf_from_options_file('# opts\nDAEMON_OPTS="-F 1 -x -f /etc/chrony.conf"\n', "DAEMON_OPTS") == "/etc/chrony.conf"
    assert cc.conf_from_options_file('OPTIONS="-F 2"\n', "OPTIONS") is None


def test_find_conf_order(cc: ModuleType, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "comm").write_text("chronyd\n")
    (proc / "77" / "cmdline").write_bytes(b"/usr/sbin/chronyd\0-F\0" + b"1\0-f\0/etc/chrony.conf\0")
    files: dict[str, str] = {"/etc/default/chrony": 'DAEMON_OPTS="-f /opt/other.conf"\n'}
    exists = lambda p: p in files or p == "/etc/debian_version"  # noqa: E731
    read = files.get
    assert cc.find_conf("/srv/c.conf", str(proc), exists, read) == ("/srv/c.conf", "ddpfix_chrony_conf_path")
    assert cc.find_conf("", str(proc), exists, read) == ("/etc/chrony.conf", "the running chronyd's -f")
    assert cc.find_conf("", str(tmp_path / "none"), exists, read) == ("/opt/other.conf",
                                                                     "-f in /etc/default/chrony DAEMON_OPTS")
    files.clear()
    assert cc.find_conf("", str(tmp_path / "none"), exists, read)[0] == "/etc/chrony/chrony.conf"  # Debian
    files["/etc/chrony.conf"] = ""
    assert cc.find_conf("", str(tmp_path / "none"), lambda p: p in files, read)[0] == "/etc/chrony.conf"  # RHEL


def test_writes_name_the_drop_in_and_the_main_file_only_where_it_must_include_it(cc: ModuleType,
                                                                                   tmp_path: Path) -> None:
    """`writes`: what the time fix writes, for remediate.yml's pre-flight: the drop-in, and the main configuration
    where it exists and does not read the drop-in yet (the fix adds the confdir line there)."""
    conf = tmp_path / "chrony.conf"
    dropins = tmp_path / "chrony.d"
    assert cc.inspect(str(conf), str(dropins))["writes"] == [str(dropins / "ddpfix.conf")]  # no main file
    conf.write_text(RHEL)
    assert cc.inspect(str(conf), str(dropins))["writes"] == [str(dropins / "ddpfix.conf"), str(conf)]
    conf.write_text(RHEL + f"confdir {dropins}\n")
    assert cc.inspect(str(conf), str(dropins))["writes"] == [str(dropins / "ddpfix.conf")]
