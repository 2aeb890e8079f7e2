"""The installed command: works from any directory, finds its playbooks and roles through the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpfix import __version__, paths
from ddpfix.cli import cli
from ddpfix.errors import EXIT_CODE_MEANING, ExitCode


def test_installed_console_script_runs_from_root_dir() -> None:
    exe = Path(sys.executable).parent / "ddpfix"
    r = subprocess.run([str(exe), "--help"], cwd="/", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for sub in ("audit", "remediate", "env", "verify", "lab"):
        assert sub in r.stdout
    r = subprocess.run([str(exe), "--version"], cwd="/", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and __version__ in r.stdout


def test_version_names_what_ddpfix_runs_with_as_ansible_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ddpfix's, ansible-core's and Python's versions, the config file (ansible-core's search), the collection and the
    collections path; nothing is created in the state directory."""
    import ansible
    import ansible.release

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\ncollections_path = /srv/collections\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == f"ddpfix {__version__}"
    assert f"  ansible-core = {ansible.release.__version__} ({Path(ansible.__file__).parent})" in lines
    assert f"  python = {sys.version.split()[0]} ({sys.executable})" in lines
    assert f"  config file = {cfg.resolve()}" in lines
    assert f"  ddpfix.cluster = {paths.ansible_root()}" in lines
    assert f"  collections path = {paths.collections_base()}:/srv/collections" in lines
    assert not (tmp_path / "state").exists()


def test_help_lists_every_exit_code() -> None:
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0
    listed = [" ".join(ln.split()) for ln in r.output.split("Exit codes (every subcommand):", 1)[1].splitlines()]
    for code in ExitCode:
        assert f"{int(code)} {EXIT_CODE_MEANING[code]}" in listed, (code, listed)
    assert set(EXIT_CODE_MEANING) == set(ExitCode)


def test_ansible_content_found_through_the_package() -> None:
    for pb in ("audit.yml", "remediate.yml", "verify_torch.yml"):
        assert paths.playbook(pb).is_file()
    for role in ("ddpfix_facts", "ddpfix_firewall", "ddpfix_hosts", "ddpfix_chrony", "ddpfix_env", "ddpfix_verify",
                 "ddpfix_ifname"):
        assert (paths.roles_dir() / role / "tasks" / "main.yml").is_file()


def test_every_subcommand_has_help() -> None:
    for args in (["audit"], ["remediate"], ["env"], ["verify"], ["lab", "up"], ["lab", "down"], ["lab", "status"]):
        r = CliRunner().invoke(cli, [*args, "--help"])
        assert r.exit_code == 0 and "Usage:" in r.output, args


def test_remediate_only_rejects_unknown_ids(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("ddp_nodes:\n  hosts: {a: {}, b: {}}\n")
    r = CliRunner().invoke(cli, ["-i", str(inv), "remediate", "--only", "firewall.nope"])
    assert r.exit_code == 2 and "unknown finding id(s): firewall.nope" in r.output
