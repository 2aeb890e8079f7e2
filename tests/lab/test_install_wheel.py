"""`pip install .` alone gives a complete tool, beside the Ansible a user has: the wheel, installed WITHOUT extras into
a fresh venv on the newest Python CI runs (pyenv's 3.13) that has `ansible` 14.5.0 already, keeps that Ansible
(ansible-core 2.21), runs every subcommand's --help, and `audit`, `remediate --apply` and `verify --torch` (torch on
the nodes: the lab's ddp_python) work on a clean lab; `verify --torch` with an interpreter that has no torch says so in
one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
#: The `ansible` release a user has installed before ddpfix (the newest on PyPI in December 2026: ansible-core 2.21).
USER_ANSIBLE = "14.5.0"


def _run(argv: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd="/", env=env, check=False, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """(venv dir, environment for its ddpfix): the wheel of this checkout, plain `pip install WHEEL`, pip's cache."""
    base = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(ROOT)],
                       check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = next((base / "dist").glob("ddpfix-*.whl"))
    venv = base / "venv"
    pyenv = sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).glob("versions/3.13.*/bin/python3.13"))
    subprocess.run([str(pyenv[-1]) if pyenv else "/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: byte-compiling the ~16k modules of ansible and its collections costs minutes; Python compiles
    # what it imports, and the lab runs only a few of them
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-compile"]
    if pyenv:  # the user's current Ansible first (ansible-core 2.20 and later need Python >= 3.12)
        r = subprocess.run([*pip, f"ansible=={USER_ANSIBLE}"], check=False, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([*pip, str(wheel)], check=False, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    if pyenv:  # ... and pip kept it
        r = subprocess.run([str(venv / "bin/python"), "-m", "pip", "list", "--format", "json"], check=True,
                           capture_output=True, text=True, timeout=120)
        have = {d["name"].lower(): d["version"] for d in json.loads(r.stdout)}
        assert have["ansible"] == USER_ANSIBLE and have["ansible-core"].startswith("2.21."), have
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "ANSIBLE_", "DDPFIX_"))}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # the venv is not activated: ddpfix finds ansible beside itself
    env["DDPFIX_STATE_DIR"] = str(base / "state")
    no_torch = _run([str(venv / "bin/python"), "-c", "import torch"], env)
    assert no_torch.returncode != 0, "the fresh venv must not have torch"
    yield venv, env


@pytest.mark.lab
def test_wheel_without_extras_every_help(fresh_venv: tuple[Path, dict[str, str]]) -> None:
    venv, env = fresh_venv
    exe = str(venv / "bin/ddpfix")
    # the installed package, not this checkout
    r = _run([str(venv / "bin/python"), "-c", "import ddpfix, testinfra; print(ddpfix.__file__)"], env)
    assert r.returncode == 0 and r.stdout.startswith(str(venv)), r.stdout + r.stderr
    # the JSON Schemas ship as package data (ddpfix/schemas/*.json)
    r = _run([str(venv / "bin/python"), "-c", "from ddpfix import schemas; print(' '.join(schemas.ids()))"], env)
    assert r.returncode == 0 and "ddpfix.report/v1" in r.stdout and "ddpfix.verify/v1" in r.stdout, r.stdout + r.stderr
    for args in ([], ["audit"], ["remediate"], ["env"], ["verify"], ["lab"], ["lab", "up"], ["lab", "down"],
                 ["lab", "status"]):
        r = _run([exe, *args, "--help"], env, timeout=120)
        assert r.returncode == 0 and "Usage:" in r.stdout, (args, r.stdout, r.stderr)


@pytest.mark.lab
def test_wheel_without_extras_verifies_a_clean_lab(fresh_venv: tuple[Path, dict[str, str]], clean_lab,
                                                   tmp_path: Path) -> None:
    venv, env = fresh_venv
    exe = str(venv / "bin/ddpfix")
    inv = str(clean_lab.inventory)
    r = _run([exe, "audit", "-i", inv], env)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: the env files are not written yet
    r = _run([exe, "remediate", "-i", inv, "--apply"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run([exe, "verify", "-i", inv, "--torch"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify: all checks passed" in r.stdout

    # the same lab, ddp_python = an interpreter without torch (Debian's own, which the nodes see)
    doc = yaml.safe_load(clean_lab.inventory.read_text())
    doc["all"]["children"]["ddp_nodes"]["vars"]["ddp_python"] = "/usr/bin/python3"
    no_torch_inv = tmp_path / "hosts.yml"
    no_torch_inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = _run([exe, "verify", "--torch", "--no-checks", "-i", str(no_torch_inv)], env)
    out = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(out) == 1, r.stdout + r.stderr
    assert out[0].startswith("verify --torch: torch is missing on node1, node2, node3: ")
    assert "No module named 'torch'" in out[0] and "ddp_python" in out[0]
