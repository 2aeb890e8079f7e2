"""Private state, or no run (issue 36 item 2): the state directory, the run directories, ANSIBLE_HOME, the SSH
control path and the locks are refused (exit 2, one line naming the path, owner and mode) when the caller does not
own them, others can write them, or an ancestor up to a root-owned one is someone else's or writable by others (a
sticky one only above the caller's own). Run as root (the unit suite is): other owners are made with chown."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from unit_helpers import ROOT

from ddpfix import paths
from ddpfix.ansible import rundirs
from ddpfix.ansible.env import ddpfix_defaults
from ddpfix.errors import DdpfixError

OTHER = 4242  # some unprivileged uid

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(DdpfixError) as err:
        paths.private_dir(path)
    msg = str(err.value)
    assert err.value.code == 2 and "\n" not in msg and str(path) in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


@needs_root
def test_a_directory_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, OTHER, OTHER)
    _refused(state, f"owner uid {OTHER}", "mode 0700", "is not yours")
    assert state.stat().st_uid == OTHER  # never taken over or changed


def test_a_0777_directory_of_ones_own_is_refused_not_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    _refused(state, "others can write it", "mode 0777")
    assert stat.S_IMODE(state.stat().st_mode) == 0o777  # what others may have put there stays theirs: no run


def test_a_directory_others_may_only_read_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    assert paths.private_dir(state) == state and stat.S_IMODE(state.stat().st_mode) == 0o700


def test_an_ancestor_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    _refused(shared / "ddpfix" / "runs", f"others can write its parent {shared}", "mode 0777")


@needs_root
def test_an_ancestor_of_another_user_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chown(home, OTHER, OTHER)
    _refused(home / ".local" / "state" / "ddpfix", f"its parent {home}", "another user's", f"owner uid {OTHER}")


def test_a_sticky_world_writable_ancestor_is_fine_above_ones_own(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    assert paths.private_dir(tmp / "ddpfix-cp") == tmp / "ddpfix-cp"
    open_below = tmp / "open"
    open_below.mkdir()
    os.chmod(open_below, 0o777)
    _refused(open_below / "ddpfix", f"others can write its parent {open_below}")


@needs_root
def test_in_a_sticky_directory_another_users_directory_or_link_is_refused(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    theirs = tmp / "ddpfix-cp-0"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER, OTHER)
    _refused(theirs, "is not yours")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp / "state"
    link.symlink_to(mine)
    os.lchown(link, OTHER, OTHER)
    _refused(link / "ddpfix", f"its parent {link} is a symbolic link of another user's")


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(real)
    _refused(tmp_path / "state", "is a symbolic link")


@needs_root
def test_the_reproduction_root_never_uses_a_users_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: an unprivileged user's 0777 state directory with a filter plugin under
    ansible/plugins/filter; root runs with it as DDPFIX_STATE_DIR: refused before Ansible is configured or any run
    directory is made, and the user's files are left as they were."""
    state = tmp_path / "state"
    plugin = state / "ansible" / "plugins" / "filter" / "evil.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("import os\nos.system('touch /tmp/pwned')\n")
    for d in (state, *plugin.parents):
        if d == tmp_path:
            break
        os.chown(d, OTHER, OTHER)
    os.chmod(state, 0o777)
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(state))
    with pytest.raises(DdpfixError) as err:
        ddpfix_defaults(tmp_path, 5)
    assert err.value.code == 2 and f"owner uid {OTHER}" in str(err.value)
    with pytest.raises(DdpfixError):
        rundirs.new_run_dir("audit")
    with pytest.raises(DdpfixError):
        paths.collections_dir()
    assert not (state / "runs").exists() and stat.S_IMODE(state.stat().st_mode) == 0o777
    # through the CLI: exit 2, one line naming the directory, its owner and mode
    env = {**os.environ, "PYTHONPATH": str(ROOT / "controller"), "DDPFIX_STATE_DIR": str(state), "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-c", "from ddpfix.cli import main; main()", "-i", "10.255.255.1,10.255.255.2,",
                        "audit"],
                       capture_output=True, text=True, env=env, timeout=120, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(state) in lines[0] and f"owner uid {OTHER}" in lines[0], r.stderr


def test_as_root_does_not_carry_the_callers_state_path() -> None:
    text = (ROOT / "scripts" / "as-root.sh").read_text()
    assert "DDPFIX_STATE_DIR" not in text.split("--preserve-env=", 1)[1].split()[0]
    assert "XDG_STATE_HOME" not in text and " -E " not in text


def test_control_sockets_fit_a_unix_socket_path_under_a_deep_state_dir(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A deep DDPFIX_STATE_DIR (or home) made every node unreachable: ssh cannot bind a control socket whose path is
    longer than a Unix socket address ("too long for Unix domain socket"). The control sockets then go to a private
    directory under /tmp; a short state directory keeps its own cp/."""
    short = tmp_path / "s"
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(short))
    if len(str(short / "cp")) + 1 + 10 + paths.SSH_MASTER_SUFFIX <= paths.SOCKET_PATH_MAX:
        assert paths.control_dir(10) == short / "cp"
    deep = tmp_path / ("d" * 60) / "state"
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(deep))
    fallback = Path("/tmp") / f"ddpfix-cp-{os.getuid()}"  # made as any run makes it, and kept (runs may share it)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cp = Path(ddpfix_defaults(run_dir, 5)["ANSIBLE_SSH_CONTROL_PATH_DIR"])
    assert cp == fallback == paths.control_dir(len("ti-") + 40)
    assert stat.S_IMODE(cp.stat().st_mode) == 0o700 and cp.stat().st_uid == os.getuid()
    # the kernel takes the longest socket ssh binds there: ansible-core's 10-character name and ssh's suffix
    suffix = f"{os.getpid():x}".rjust(16, "x")  # this test's own names
    for name in ("a" * 10, "ti-" + "c" * 40):
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(cp / f"{name}.{suffix}"))
        (cp / f"{name}.{suffix}").unlink()
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError):
        s.bind(str(deep / "cp" / f"{'a' * 10}.{'x' * 16}"))  # where it went before
