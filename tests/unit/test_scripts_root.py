"""The README's set-up commands (`./scripts/demo.sh`, `./scripts/test.sh`) work as root on a machine without sudo
and for a user with sudo: scripts/as-root.sh never calls sudo as root, re-runs the script through sudo otherwise,
and says so in one line (exit 4) where there is no sudo. `id` and `sudo` are stand-ins on PATH here."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bin(tmp_path: Path, uid: int, sudo: bool) -> Path:
    """A PATH of its own: bash's helpers, an `id` that answers `uid`, and (if `sudo`) a sudo that logs its
    arguments and the preserved variables."""
    b = tmp_path / "bin"
    b.mkdir()
    for tool in ("bash", "dirname", "basename", "readlink", "cat"):
        found = shutil.which(tool)
        assert found
        (b / tool).symlink_to(found)
    (b / "id").write_text(f"#!{shutil.which('bash')}\necho {uid}\n")
    if sudo:
        (b / "sudo").write_text(f"#!{shutil.which('bash')}\necho \"sudo $*\" >> {tmp_path / 'sudo.log'}\n")
    for f in b.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    return b


def _script(tmp_path: Path) -> Path:
    """A script that sources as-root.sh as demo.sh and test.sh do, then says it ran."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "as-root.sh", tmp_path / "scripts" / "as-root.sh")
    s = tmp_path / "scripts" / "needs-root.sh"
    s.write_text('#!/usr/bin/env bash\nset -uo pipefail\n. "$(dirname "$0")/as-root.sh" "$@"\necho "ran: $*"\n')
    s.chmod(0o755)
    return s


def _run(tmp_path: Path, uid: int, sudo: bool) -> subprocess.CompletedProcess[str]:
    script, path = _script(tmp_path), _bin(tmp_path, uid, sudo)
    env = {"PATH": str(path), "DDPFIX_DEMO_SCENARIOS": "env-wrong"}
    return subprocess.run([str(path / "bash"), str(script), "-k", "lab"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=30)


@pytest.mark.parametrize("sudo", [True, False])
def test_as_root_never_calls_sudo(tmp_path: Path, sudo: bool) -> None:
    r = _run(tmp_path, 0, sudo)
    assert r.returncode == 0 and r.stdout == "ran: -k lab\n", r.stderr
    assert not (tmp_path / "sudo.log").exists()


def test_a_user_with_sudo_runs_the_script_again_through_sudo(tmp_path: Path) -> None:
    r = _run(tmp_path, 1000, True)
    assert r.returncode == 0 and "ran:" not in r.stdout, r.stdout + r.stderr
    log = (tmp_path / "sudo.log").read_text()
    assert log == (f"sudo --preserve-env=DDPFIX_DEMO_SCENARIOS,PYTHON -- "
                   f"{os.path.realpath(tmp_path / 'scripts' / 'needs-root.sh')} -k lab\n")


def test_a_user_without_sudo_gets_one_line_and_exit_4(tmp_path: Path) -> None:
    r = _run(tmp_path, 1000, False)
    assert r.returncode == 4 and r.stdout == ""
    assert r.stderr == "needs-root.sh: needs root: run it as root, or as a user with sudo\n"


@pytest.mark.parametrize("name", ["demo.sh", "test.sh", "apt-deps.sh"])
def test_the_root_scripts_use_it_before_anything_else(name: str) -> None:
    text = (ROOT / "scripts" / name).read_text()
    assert '. "$(dirname "$0")/as-root.sh"' in text
    if name != "apt-deps.sh":  # apt-deps needs root only for missing packages: it checks them first
        before = text[:text.index("as-root.sh")]
        assert "setup.sh" not in before and "apt-get" not in before
    assert "sudo " not in text.replace("as-root.sh", "")  # never `sudo cmd` of their own


def test_readme_set_up_commands_need_no_sudo_binary() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Your own cluster")]
    assert "    ./scripts/demo.sh\n" in quick and "    ./scripts/test.sh\n" in quick
    assert "sudo ./scripts" not in readme
