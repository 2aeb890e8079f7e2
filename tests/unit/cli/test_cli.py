"""The installed command: works from any directory, finds its playbooks and roles through the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from ddpfix import __version__, paths
from ddpfix.cli import cli


def test_installed_console_script_runs_from_root_dir() -> None:
    exe = Path(sys.executable).parent / "ddpfix"
    r = subprocess.run([str(exe), "--help"], cwd="/", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for sub in ("audit", "remediate", "env", "verify", "lab"):
        assert sub in r.stdout
    r = subprocess.run([str(exe), "--version"], cwd="/", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and __version__ in r.stdout


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
