"""The user's Ansible configuration: which file is used, and which of ddpfix's settings it overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpfix.ansible import config as ansiblecfg
from ddpfix.ansible.env import ansible_env, default_forks
from ddpfix.ansible.listing import list_inventory


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean environment: no ANSIBLE_* variables, HOME and the state dir in tmp."""
    for k in list(os.environ):
        if k.startswith("ANSIBLE_"):
            monkeypatch.delenv(k)
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    return h


def cfg_file(d: Path, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "ansible.cfg"
    p.write_text(text)
    return p


def test_config_search_order(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd, invdir, envdir = tmp_path / "work", tmp_path / "inv", tmp_path / "envcfg"
    cwd.mkdir()
    (invdir).mkdir()
    inv = invdir / "hosts.yml"
    inv.write_text("all: {}\n")
    monkeypatch.chdir(cwd)
    assert ansiblecfg.find_config([str(inv)]) in (None, Path("/etc/ansible/ansible.cfg"))
    h = cfg_file(home, "")
    (home / "ansible.cfg").rename(home / ".ansible.cfg")
    assert ansiblecfg.find_config([str(inv)]) == (home / ".ansible.cfg").resolve()
    nxt = cfg_file(invdir, "")
    assert ansiblecfg.find_config([str(inv)]) == nxt.resolve()  # next to an -i file
    assert ansiblecfg.find_config([str(invdir)]) == nxt.resolve()  # in an -i directory
    here = cfg_file(cwd, "")
    assert ansiblecfg.find_config([str(inv)]) == here.resolve()
    env = cfg_file(envdir, "")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(envdir))  # a directory: its ansible.cfg
    assert ansiblecfg.find_config([str(inv)]) == env.resolve()
    monkeypatch.setenv("ANSIBLE_CONFIG", str(env))
    assert ansiblecfg.find_config([str(inv)]) == env.resolve()
    assert h is not None


def test_the_search_is_ansible_cores_own(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ansible-core's find_ini_config_file answers is used, except that an inventory's ansible.cfg comes before
    the user-wide ~/.ansible.cfg and /etc/ansible/ansible.cfg."""
    invdir = tmp_path / "inv"
    nxt = cfg_file(invdir, "")
    elsewhere = cfg_file(tmp_path / "elsewhere", "")
    monkeypatch.setattr(ansiblecfg, "core_config_file", lambda: str(elsewhere))
    assert ansiblecfg.find_config([str(invdir)]) == elsewhere.resolve()
    monkeypatch.setattr(ansiblecfg, "core_config_file", lambda: "/etc/ansible/ansible.cfg")
    assert ansiblecfg.find_config([str(invdir)]) == nxt.resolve()
    assert ansiblecfg.find_config([]) == Path("/etc/ansible/ansible.cfg")
    monkeypatch.setattr(ansiblecfg, "core_config_file", lambda: None)
    assert ansiblecfg.find_config([str(invdir)]) == nxt.resolve()
    assert ansiblecfg.find_config([]) is None
    # ANSIBLE_CONFIG naming ~/.ansible.cfg itself: the user's choice stands
    user = home / ".ansible.cfg"
    user.write_text("")
    monkeypatch.setattr(ansiblecfg, "core_config_file", lambda: str(user))
    assert ansiblecfg.find_config([str(invdir)]) == nxt.resolve()
    monkeypatch.setenv("ANSIBLE_CONFIG", str(user))
    assert ansiblecfg.find_config([str(invdir)]) == user.resolve()


def test_core_search_answers_as_ansible_core(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ddpfix's copy of ansible-core's search (it spares every command the import of Ansible's config manager) finds
    the file ansible-core's own find_ini_config_file finds, case by case."""
    from ansible.config.manager import find_ini_config_file

    def same() -> str | None:
        mine = ansiblecfg.core_config_file()
        assert mine == find_ini_config_file()
        return mine

    cwd, envdir = tmp_path / "work", tmp_path / "envcfg"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    none = same()
    assert none in (None, "/etc/ansible/ansible.cfg")
    user = cfg_file(home, "")
    user = user.rename(home / ".ansible.cfg")
    assert same() == str(user)
    here = cfg_file(cwd, "")
    assert same() == str(here)
    cwd.chmod(0o777)  # world-writable: skipped
    assert same() == str(user)
    cwd.chmod(0o755)
    env = cfg_file(envdir, "")
    for named in (str(envdir), str(env), "$HOME/../envcfg", "../envcfg/ansible.cfg", "~/../envcfg/./ansible.cfg"):
        monkeypatch.setenv("ANSIBLE_CONFIG", named)
        assert same() == str(env), named
    monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "missing.cfg"))  # named but absent: the next place
    assert same() == str(here)
    env.chmod(0o000)
    monkeypatch.setenv("ANSIBLE_CONFIG", str(env))
    if not os.access(env, os.R_OK):  # unreadable (not as root): the next place
        assert same() == str(here)


def test_world_writable_cwd_is_skipped_like_ansible(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "public"
    cfg_file(cwd, "[defaults]\nremote_user = eve\n")
    cwd.chmod(0o777)
    monkeypatch.chdir(cwd)
    assert ansiblecfg.find_config([]) != (cwd / "ansible.cfg").resolve()


def test_ddpfix_defaults_only_where_the_user_set_nothing(home: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "work"
    path = cfg_file(cwd, "[defaults]\nremote_user = ops\ntimeout = 42 ; inline comment\nhost_key_checking = False\n"
                         "interpreter_python = /opt/py/bin/python3\nforks = 7\nroles_path = /srv/roles\n"
                         "collections_path = /srv/collections\n"
                         "[ssh_connection]\nssh_args = -F /etc/ssh/cluster_config -o ProxyCommand=\"ssh -W %h:%p jump\"\n"
                         "pipelining = False\n")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("ANSIBLE_REMOTE_PORT", "2200")
    monkeypatch.setenv("ANSIBLE_GATHERING", "smart")
    env = ansible_env(tmp_path / "run", 5, [])
    assert env["ANSIBLE_CONFIG"] == str(path.resolve())
    # the user's file sets these: ddpfix does not override them
    for k in ("ANSIBLE_TIMEOUT", "ANSIBLE_PYTHON_INTERPRETER", "ANSIBLE_PIPELINING", "ANSIBLE_FORKS"):
        assert k not in env, k
    # the user's environment sets these: left alone (ansible-runner passes the environment on)
    assert "ANSIBLE_GATHERING" not in env and "ANSIBLE_REMOTE_PORT" not in env and "ANSIBLE_REMOTE_USER" not in env
    # ansible-runner would turn host key checking off: the user's choice is passed explicitly
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "False"
    # the user's ssh_args are kept verbatim (ProxyCommand with %h), ddpfix's connection reuse appended
    assert env["ANSIBLE_SSH_ARGS"].startswith('-F /etc/ssh/cluster_config -o ProxyCommand="ssh -W %h:%p jump"')
    assert "ControlPersist=60s" in env["ANSIBLE_SSH_ARGS"]
    # ddpfix's collection first, then the user's collections; the user's roles path is theirs
    assert env["ANSIBLE_COLLECTIONS_PATH"].endswith(":/srv/collections") and "ANSIBLE_ROLES_PATH" not in env
    # set by nobody: ddpfix's defaults
    assert env["ANSIBLE_INJECT_FACT_VARS"] == "False" and env["ANSIBLE_HOME"].startswith(str(tmp_path / "state"))
    assert default_forks(100, None, ansiblecfg.user_forks(ansiblecfg.load([]))) == 7
    assert default_forks(100, 3, 7) == 3  # --forks wins


def test_no_user_config_gives_ddpfix_defaults(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ansiblecfg, "find_config", lambda *a, **k: None)
    env = ansible_env(tmp_path / "run", 5, [])
    assert "ANSIBLE_CONFIG" not in env
    assert env["ANSIBLE_SSH_ARGS"] == "-C -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=15"
    assert env["ANSIBLE_TIMEOUT"] == "10" and env["ANSIBLE_PIPELINING"] == "True"
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"


@pytest.mark.parametrize(("user", "want"), [
    ("-F ssh_config", "-F ssh_config -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=15"),
    ("-o ControlMaster=no", "-o ControlMaster=no -o ServerAliveInterval=15"),
    ("-C -oControlPersist=5m -o ServerAliveInterval=30", "-C -oControlPersist=5m -o ServerAliveInterval=30"),
    ("", "-o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=15"),
])
def test_user_ssh_args_are_extended_never_dropped(user: str, want: str) -> None:
    assert ansiblecfg.extend_ssh_args(user) == want


def test_user_ssh_args_from_the_environment_are_kept(home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o ProxyJump=bastion")
    env = ansible_env(tmp_path / "run", 5, [])
    assert env["ANSIBLE_SSH_ARGS"].startswith("-o ProxyJump=bastion -o ControlMaster=auto")


def test_unreadable_config_is_invalid_input(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpfix.errors import DdpfixError, ExitCode

    cfg_file(tmp_path / "w", "no section header\n")
    monkeypatch.chdir(tmp_path / "w")
    with pytest.raises(DdpfixError) as exc:
        ansiblecfg.load([])
    assert exc.value.code == ExitCode.INVALID_INPUT and "ansible.cfg" in str(exc.value)


def test_inventory_listing_reads_the_same_config(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ansible-inventory` (ddpfix's inventory read) uses the ansible.cfg next to the inventory too."""
    from ddpfix.errors import DdpfixError

    inv = tmp_path / "inv" / "hosts.yml"
    inv.parent.mkdir()
    inv.write_text("ddp_nodes:\n  hosts:\n    n1: {ansible_host: 10.0.0.1}\n")
    monkeypatch.chdir(tmp_path)
    assert "n1" in list_inventory([str(inv)])["_meta"]["hostvars"]
    (inv.parent / "ansible.cfg").write_text("[inventory]\nenable_plugins = ini\n")  # no yaml plugin: unparsable
    with pytest.raises(DdpfixError):
        list_inventory([str(inv)])


def test_no_i_reads_the_inventory_ansible_would(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "work"
    cfg_file(cwd, "[defaults]\ninventory = inventories/prod, extra.yml ; comment\n")
    monkeypatch.chdir(cwd)
    origin, paths = ansiblecfg.user_inventory()
    assert paths == (str(cwd.resolve() / "inventories/prod"), str(cwd.resolve() / "extra.yml"))
    cfg_file(cwd, "[defaults]\ninventory = ../inv/hosts.yml\n")  # normalised, as the fix texts show it
    assert ansiblecfg.user_inventory()[1] == (str(tmp_path.resolve() / "inv" / "hosts.yml"),)
    cfg_file(cwd, "[defaults]\ninventory = inventories/prod, extra.yml ; comment\n")
    assert origin == f"inventory in {(cwd / 'ansible.cfg').resolve()}"
    monkeypatch.setenv("ANSIBLE_INVENTORY", "/srv/inv.yml")  # the environment beats the file, as in Ansible
    assert ansiblecfg.user_inventory() == ("ANSIBLE_INVENTORY", ("/srv/inv.yml",))
    monkeypatch.delenv("ANSIBLE_INVENTORY")
    cfg_file(cwd, "[defaults]\nforks = 5\n")
    assert ansiblecfg.user_inventory() == ("", ())


def test_cli_without_i_uses_ansible_cfg_inventory_or_stops(home: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from ddpfix.cli import cli
    from ddpfix.errors import ExitCode

    monkeypatch.delenv("DDPFIX_INVENTORY", raising=False)
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    r = CliRunner().invoke(cli, ["remediate"])
    assert r.exit_code == ExitCode.INVALID_INPUT and "no inventory given" in r.output, r.output
    (cwd / "hosts.yml").write_text("ddp_nodes:\n  hosts:\n    n1: {ansible_host: 10.0.0.1, ddp_master_port: 99999}\n")
    cfg_file(cwd, "[defaults]\ninventory = hosts.yml\n")
    r = CliRunner().invoke(cli, ["remediate"])  # the file's error proves it was read: one line, exit 2
    assert r.exit_code == ExitCode.INVALID_INPUT and "ddp_master_port" in r.output and "99999" in r.output, r.output
    assert f"inventory {cwd.resolve() / 'hosts.yml'} (from inventory in" in r.output


@pytest.mark.parametrize(("user_env", "user_file", "want"), [
    (None, None, "ddpfix.cluster.ddpfix_exit,ddpfix.cluster.ddpfix_payloads"),
    (None, "callbacks_enabled = ansible.builtin.tree, profile_tasks\n",
     "ansible.builtin.tree,profile_tasks,ddpfix.cluster.ddpfix_exit,ddpfix.cluster.ddpfix_payloads"),
    ("timer,ddpfix.cluster.ddpfix_exit", "callbacks_enabled = ansible.builtin.tree\n",
     "timer,ddpfix.cluster.ddpfix_exit,ddpfix.cluster.ddpfix_payloads"),  # the environment beats the file; no duplicate
])
def test_the_users_callbacks_stay_enabled_and_ddpfix_adds_its_exit_callback(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_env: str | None, user_file: str | None,
        want: str) -> None:
    cwd = tmp_path / "work"
    cfg_file(cwd, "[defaults]\n" + (user_file or ""))
    monkeypatch.chdir(cwd)
    if user_env is not None:
        monkeypatch.setenv("ANSIBLE_CALLBACKS_ENABLED", user_env)
    assert ansible_env(tmp_path / "run", 5, [])["ANSIBLE_CALLBACKS_ENABLED"] == want
