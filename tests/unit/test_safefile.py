"""Files the controller writes never follow a planted link (issue 36 item 6): `ddpfix.safefile.write_atomic` creates
its temporary file exclusively under an unpredictable name in the target's directory, then renames it; every
writer (`-o FILE`, `inventory slurm -o FILE`, the standalone playbook's report, env files, run directory files)
uses it. No host."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from unit_helpers import ROOT

from ddpfix.ansible import collection
from ddpfix.app import Application
from ddpfix.cli import cli
from ddpfix.cli.common import emit
from ddpfix.errors import DdpfixError
from ddpfix.safefile import target_mode, umask, write_atomic


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    return victim


def _plant(directory: Path, name: str, victim: Path) -> list[Path]:
    """Links at every temporary name the old writers used (`.NAME.tmp`, `NAME.tmp`)."""
    links = [directory / f".{name}.tmp", directory / f"{name}.tmp"]
    for link in links:
        link.symlink_to(victim)
    return links


def _untouched(victim: Path, links: list[Path]) -> None:
    assert victim.read_text() == "precious\n"
    for link in links:
        assert link.is_symlink() and os.readlink(link) == str(victim)


def test_planted_links_at_old_temporary_names_are_never_followed(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    links = _plant(tmp_path, "report.json", victim)
    write_atomic(tmp_path / "report.json", "new\n")
    assert (tmp_path / "report.json").read_text() == "new\n"
    _untouched(victim, links)
    leftovers = {p.name for p in tmp_path.iterdir()} - {"report.json", "elsewhere", ".report.json.tmp", "report.json.tmp"}
    assert leftovers == set()  # the temporary file was renamed away


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "out.prom").symlink_to(victim)
    write_atomic(tmp_path / "out.prom", "x 1\n")
    assert not (tmp_path / "out.prom").is_symlink() and (tmp_path / "out.prom").read_text() == "x 1\n"
    assert victim.read_text() == "precious\n"


def test_mode_kept_set_or_from_the_umask(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    write_atomic(kept, "new")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "new"
    secret = tmp_path / "secret"
    write_atomic(secret, "k=v", mode=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    old = os.umask(0o027)
    try:
        assert umask() == 0o027
        fresh = write_atomic(tmp_path / "fresh", b"bytes")
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640 and fresh.read_bytes() == b"bytes"
    assert target_mode(tmp_path / "missing", 0o600) == 0o600


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "d", "x")
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "nodir" / "x", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_report_output_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    links = _plant(tmp_path, "audit.prom", victim)
    doc = {"schema": "ddpfix.report/v1", "summary": {}, "findings": [], "hosts": {}}
    with click.Context(cli, obj=Application()):
        emit(doc, "prometheus", str(tmp_path / "audit.prom"), code=0)
    assert "ddpfix_last_run_success" in (tmp_path / "audit.prom").read_text()
    _untouched(victim, links)
    with pytest.raises(DdpfixError) as err:
        emit(doc, "json", str(tmp_path / "missing" / "audit.json"))
    assert err.value.code == 2 and "cannot write" in str(err.value)


def test_inventory_slurm_output_does_not_follow_a_planted_link(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[01-02]")
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: python-hostlist expands
    victim = _victim(tmp_path)
    links = _plant(tmp_path, "hosts.yml", victim)
    r = CliRunner().invoke(cli, ["inventory", "slurm", "-o", str(tmp_path / "hosts.yml")])
    assert r.exit_code == 0, r.output
    assert "gpu-01" in (tmp_path / "hosts.yml").read_text()
    _untouched(victim, links)


def test_standalone_report_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    collection.plugin_utils("ddpfix_controller")  # what the action imports, served from the collection's files
    action = collection.action_plugin("ddpfix_analyze").ActionModule
    victim = _victim(tmp_path)
    links = _plant(tmp_path, "report.json", victim)
    assert action._write(str(tmp_path / "report.json"), "{}\n") == str(tmp_path / "report.json")
    assert (tmp_path / "report.json").read_text() == "{}\n"
    _untouched(victim, links)


def test_every_controller_writer_uses_the_one_helper() -> None:
    """No writer of the controller or of the controller-side plugins makes a temporary name of its own (the lab's
    files, which only a lab's root writes in its own directories, aside)."""
    pattern = re.compile(r"""\.tmp\b|\{os\.getpid\(\)\}"|mkstemp\(""")
    # the collection link in the private state directory: symlink(2) makes a link, it never opens or follows one
    allowed = {"controller/ddpfix/paths.py": "tmp = link.with_name("}
    offenders = []
    for path in [*ROOT.glob("controller/ddpfix/**/*.py"), *ROOT.glob("plugins/action/*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("controller/ddpfix/lab/") or rel == "controller/ddpfix/safefile.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and allowed.get(rel, "\0") not in line:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []
