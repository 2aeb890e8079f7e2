"""ansible-playbook's flags (-l -f -e -u -b --private-key -K), before or after the subcommand: the exact arguments
that reach ansible-playbook (ansible_runner.run replaced by one that builds the command line and stops), -e in the
in-process inventory read, and refusals (exit 2, one line, nothing run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from unit_helpers import ROOT

from ddpfix.ansible import args as ansibleargs
from ddpfix.cli import cli

INV = """all:
  children:
    ddp_nodes:
      hosts:
        node1: {ansible_host: 10.0.0.1}
        node2: {ansible_host: 10.0.0.2, ansible_user: bob}
      vars:
        ddp_master_port: 29500
"""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """A state dir, an inventory, a key file, and ansible_runner.run recording what ansible-playbook would get."""
    import ansible_runner
    from ansible_runner.config.runner import RunnerConfig

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    for var in ("DDPFIX_LIMIT", "DDPFIX_FORKS", "DDPFIX_INVENTORY", "ANSIBLE_BECOME_ASK_PASS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(ansibleargs, "_current", ansibleargs.AnsibleArgs())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.yml").write_text(INV)
    (tmp_path / "id_test").write_text("not a key\n")
    seen: dict[str, Any] = {"calls": 0}

    def fake_run(**kw: Any) -> Any:
        seen["calls"] += 1
        rc = RunnerConfig(**{k: v for k, v in kw.items() if k in (
            "private_data_dir", "project_dir", "playbook", "inventory", "limit", "forks", "cmdline", "envvars",
            "suppress_env_files", "extravars", "verbosity", "tags", "passwords", "fact_cache_type")})
        rc.prepare()
        seen["command"] = rc.command
        seen["env"] = dict(rc.env)
        seen["passwords"] = kw.get("passwords")
        seen["expect"] = getattr(rc, "expect_passwords", {})
        seen["extravars"] = json.loads((Path(kw["private_data_dir"]) / "env" / "extravars").read_text())
        raise KeyboardInterrupt  # stop here: nothing runs

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    return {"seen": seen, "tmp": tmp_path}


def _opt(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def _plain(v: Any) -> Any:
    """The extravars file's value without ddpfix's data marking ({"__ansible_unsafe": s})."""
    if isinstance(v, dict):
        return v["__ansible_unsafe"] if set(v) == {"__ansible_unsafe"} else {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


FLAGS = ["-l", "node2", "-f", "7", "-u", "alice", "-b", "--private-key", "id_test", "-e", "site='a b'",
         "-e", '{"nested": {"k": [1, 2]}}']


@pytest.mark.parametrize("where", ["before", "after"])
def test_flags_reach_ansible_playbook(env: dict[str, Any], where: str) -> None:
    args = [*FLAGS, "audit", "-i", "hosts.yml"] if where == "before" else ["audit", "-i", "hosts.yml", *FLAGS]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 6, r.output  # the fake run's KeyboardInterrupt: interrupted, nothing ran
    cmd: list[str] = env["seen"]["command"]
    assert cmd[0].endswith("ansible-playbook")
    assert _opt(cmd, "--limit") == "node2" and _opt(cmd, "--forks") == "7"
    assert _opt(cmd, "--user") == "alice" and "--become" in cmd
    assert _opt(cmd, "--private-key") == str(env["tmp"] / "id_test")  # absolute: same file whatever the cwd
    assert "--ask-become-pass" not in cmd and env["seen"]["passwords"] is None
    ev = [a for a in cmd if a.startswith("@")]
    assert len(ev) == 1  # the -e values travel in the run's private extravars file, not on the command line
    extra = _plain(env["seen"]["extravars"])
    assert extra["site"] == "a b" and extra["nested"] == {"k": [1, 2]}
    assert "ddpfix_run_holder" in extra  # ddpfix's own keys are still there


def test_after_the_subcommand_overrides_and_extra_vars_add_up(env: dict[str, Any]) -> None:
    r = CliRunner().invoke(cli, ["-l", "node1", "-u", "alice", "-e", "a=1 b=2", "audit", "-i", "hosts.yml",
                                 "-l", "node2", "-u", "carol", "-e", "b=3"])
    assert r.exit_code == 6, r.output
    cmd = env["seen"]["command"]
    assert _opt(cmd, "--limit") == "node2" and _opt(cmd, "--user") == "carol"
    assert cmd.count("--user") == 1 and "--become" not in cmd and "--private-key" not in cmd
    extra = _plain(env["seen"]["extravars"])
    assert extra["a"] == "1" and extra["b"] == "3"  # later -e wins per key, as in ansible-playbook


def test_long_forms(env: dict[str, Any]) -> None:
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml", "--limit", "node1", "--forks", "3", "--user", "u1",
                                 "--become", "--extra-vars", "x=y", "--key-file", "id_test"])
    assert r.exit_code == 6, r.output
    cmd = env["seen"]["command"]
    assert _opt(cmd, "--private-key") == str(env["tmp"] / "id_test")
    assert _opt(cmd, "--limit") == "node1" and _opt(cmd, "--forks") == "3" and _opt(cmd, "--user") == "u1"
    assert "--become" in cmd and _plain(env["seen"]["extravars"])["x"] == "y"


def test_no_flags_no_arguments(env: dict[str, Any]) -> None:
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml"])
    assert r.exit_code == 6, r.output
    cmd = env["seen"]["command"]
    for flag in ("--user", "--become", "--private-key", "--ask-become-pass", "--limit"):
        assert flag not in cmd


def test_extra_vars_from_file(env: dict[str, Any]) -> None:
    (env["tmp"] / "vars.yml").write_text("ddp_master_port: 29600\nlist: [a, b]\n")
    (env["tmp"] / "vars.json").write_text('{"list": ["c"]}')
    r = CliRunner().invoke(cli, ["-e", "@vars.yml", "audit", "-i", "hosts.yml", "-e", "@vars.json"])
    assert r.exit_code == 6, r.output
    extra = _plain(env["seen"]["extravars"])
    assert extra["ddp_master_port"] == 29600 and extra["list"] == ["c"]


@pytest.mark.parametrize("where", ["before", "after"])
def test_ask_become_pass_prompts_once_and_answers_the_prompt_in_memory(env: dict[str, Any], where: str) -> None:
    args = ["-K", "audit", "-i", "hosts.yml"] if where == "before" else ["audit", "-i", "hosts.yml", "-K"]
    r = CliRunner().invoke(cli, args, input="s3cr3t-pw\n")
    assert r.exit_code == 6, r.output
    assert r.output.count("BECOME password") == 1
    cmd = env["seen"]["command"]
    assert "--ask-become-pass" in cmd and not any("s3cr3t-pw" in a for a in cmd)
    assert env["seen"]["passwords"] == {ansibleargs.BECOME_PROMPT: "s3cr3t-pw"}
    import re

    expect = env["seen"]["expect"]  # ansible-runner answers the prompt with it
    assert [v for p, v in expect.items() if hasattr(p, "search") and p.search("BECOME password: ")] == ["s3cr3t-pw"]
    assert re.search(ansibleargs.BECOME_PROMPT, "BECOME password[defaults to SSH password]:", re.M)
    for f in (env["tmp"] / "state").rglob("*"):  # never in a file
        if f.is_file():
            assert b"s3cr3t-pw" not in f.read_bytes(), f


def test_ask_become_pass_without_input_exits_2(env: dict[str, Any]) -> None:
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml", "-K"], input="")
    assert r.exit_code == 2 and "ddpfix: error: -K/--ask-become-pass: no password given" in r.output, r.output
    assert env["seen"]["calls"] == 0


def test_ask_become_pass_from_ansible_environment(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSIBLE_BECOME_ASK_PASS", "True")  # would make ansible-playbook prompt: ddpfix asks instead
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml"], input="pw\n")
    assert r.exit_code == 6, r.output
    assert "--ask-become-pass" in env["seen"]["command"] and env["seen"]["passwords"]


@pytest.mark.parametrize("args, needle", [
    (["-e", "ddpfix_target=all"], "-e/--extra-vars ddpfix_target: a ddpfix variable"),
    (["-e", '{"__ddpfix_x": 1}'], "-e/--extra-vars __ddpfix_x"),
    (["-e", "@missing.yml"], "cannot read"),
    (["-e", "vars.yml"], "is not key=value"),  # ansible-playbook would pass {"_raw_params": "vars.yml"} on
    (["-e", "site=a b"], "\"b\" is not key=value"),
    (["-e", "./vars.yml"], "needs a leading @"),
    (["-e", "[1, 2]"], "not a mapping"),
    (["-e", "{a: [}"], "not YAML/JSON"),
    (["-u", "-x"], None),  # click: -u needs a value... '-x' is taken as the value: refused below
    (["-u", "a b"], "-u/--user \"a b\": not a user name"),
    (["--private-key", "nope"], "--private-key \"nope\": no such file"),
    (["-f", "0"], "'-f' / '--forks'"),
])
@pytest.mark.parametrize("where", ["before", "after"])
def test_bad_values_exit_2_one_line_nothing_run(env: dict[str, Any], args: list[str], needle: str | None,
                                                 where: str) -> None:
    argv = [*args, "audit", "-i", "hosts.yml"] if where == "before" else ["audit", "-i", "hosts.yml", *args]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2, (argv, r.output)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddpfix: error: "), r.output
    if needle:
        assert needle in lines[0], lines[0]
    assert env["seen"]["calls"] == 0


def test_extra_vars_win_in_the_in_process_inventory_read(env: dict[str, Any]) -> None:
    """remediate/env/verify read the inventory in this process: -e ddp_* values win over the inventory's, as they do
    in ansible-playbook's hostvars (the audit's cluster comes from there)."""
    from ddpfix.inventory.derive import load_cluster

    inv = str(env["tmp"] / "hosts.yml")
    assert load_cluster([inv]).master_port == 29500
    ansibleargs.use(ansibleargs.AnsibleArgs(extra_vars=ansibleargs.merge_extra_vars(["ddp_master_port=29600"])))
    assert load_cluster([inv]).master_port == 29600
    ansibleargs.use(ansibleargs.AnsibleArgs(extra_vars=ansibleargs.merge_extra_vars(["ddp_master_port=0"])))
    from ddpfix.errors import DdpfixError

    with pytest.raises(DdpfixError, match="ddp_master_port"):  # validated like an inventory value
        load_cluster([inv])


def test_apply_to_inventory_reaches_hosts_without_vars() -> None:
    data: dict[str, Any] = {"all": {"children": ["g"]}, "g": {"hosts": ["a", "b"]},
                            "_meta": {"hostvars": {"a": {"x": 1, "y": 1}}}}
    out = ansibleargs.apply_to_inventory(data, {"x": 2})
    assert out["_meta"]["hostvars"] == {"a": {"x": 2, "y": 1}, "b": {"x": 2}}
    assert ansibleargs.apply_to_inventory({"_meta": {}}, {}) == {"_meta": {}}


def test_testinfra_gets_user_and_become_below_the_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify's testinfra checks: -u/-b apply where the host sets no ansible_user/ansible_become (Ansible's order)."""
    import os

    from ddpfix.verify.endstate import _cli_connection

    monkeypatch.delenv("ANSIBLE_REMOTE_USER", raising=False)
    monkeypatch.delenv("ANSIBLE_BECOME", raising=False)
    monkeypatch.setattr(ansibleargs, "_current", ansibleargs.AnsibleArgs(user="alice", become=True))
    with _cli_connection({}):
        assert os.environ["ANSIBLE_REMOTE_USER"] == "alice" and os.environ["ANSIBLE_BECOME"] == "True"
    assert "ANSIBLE_REMOTE_USER" not in os.environ and "ANSIBLE_BECOME" not in os.environ
    with _cli_connection({"ansible_user": "bob", "ansible_become": False}):
        assert "ANSIBLE_REMOTE_USER" not in os.environ and "ANSIBLE_BECOME" not in os.environ


def test_secret_extra_vars_are_redacted_in_the_run_dir_after_the_run(env: dict[str, Any]) -> None:
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml", "-e", "db_password=hunter2-xyz"])
    assert r.exit_code == 6, r.output
    assert _plain(env["seen"]["extravars"])["db_password"] == "hunter2-xyz"  # the run had it
    files = list((env["tmp"] / "state").rglob("extravars"))
    assert files
    for f in files:  # what stays in the run directory does not
        assert b"hunter2-xyz" not in f.read_bytes() and (f.stat().st_mode & 0o077) == 0


@pytest.mark.parametrize("cfg, argv, needle", [
    ("[privilege_escalation]\nbecome_ask_pass = True\n", [], "become_ask_pass is on"),
    ("[defaults]\nask_pass = yes\n", [], "ask_pass is on"),
    ("[defaults]\nask_pass = yes\n", ["-K"], "ask_pass is on"),
])
def test_a_prompt_nobody_answers_is_refused_before_the_run(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                           cfg: str, argv: list[str], needle: str) -> None:
    """ansible.cfg's become_ask_pass/ask_pass would make ansible-playbook wait for a password forever."""
    (env["tmp"] / "ansible.cfg").write_text(cfg)
    monkeypatch.setenv("ANSIBLE_CONFIG", str(env["tmp"] / "ansible.cfg"))
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml", *argv], input="pw\n")
    assert r.exit_code == 2 and needle in r.output, r.output
    assert env["seen"]["calls"] == 0


def test_become_ask_pass_in_config_with_k_runs(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    (env["tmp"] / "ansible.cfg").write_text("[privilege_escalation]\nbecome_ask_pass = True\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(env["tmp"] / "ansible.cfg"))
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml", "-K"], input="pw\n")
    assert r.exit_code == 6, r.output
    assert env["seen"]["passwords"] == {ansibleargs.BECOME_PROMPT: "pw"}


def _flags(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


def test_every_global_option_also_after_each_ansible_subcommand_and_in_the_usage_table() -> None:
    from ddpfix.cli import load_commands

    group = _flags(cli) - {"--version", "-h", "--help"}
    for name, cmd in load_commands().items():
        if name in ("audit", "remediate", "env", "verify", "explain"):
            assert group <= _flags(cmd), (name, sorted(group - _flags(cmd)))
    readme = (ROOT / "docs" / "usage.md").read_text()  # the global options' table, moved from the README
    start = readme.index("| option | env | meaning |")
    table = readme[start:readme.index("\n\n", start)]
    cells = {ln.split("|")[1] for ln in table.splitlines()[2:]}
    documented = {f.strip("`, ") for cell in cells for f in cell.replace("/", " ").split() if f.strip("`,").startswith("-")}
    assert group <= documented, sorted(group - documented)


def test_facts_stay_in_memory_unless_the_user_configures_a_cache(env: dict[str, Any]) -> None:
    """ansible-runner forces its jsonfile fact cache unless told otherwise: ansible-playbook gets ddpfix's memory
    cache (no JSON encoding of every node's facts at each task, issue 21 item 6), and no cache directory."""
    r = CliRunner().invoke(cli, ["audit", "-i", "hosts.yml"])
    assert r.exit_code == 6, r.output
    got = env["seen"]["env"]
    assert got.get("ANSIBLE_CACHE_PLUGIN") == "memory" and "ANSIBLE_CACHE_PLUGIN_CONNECTION" not in got
