"""The code that runs on the nodes (plugins/modules, plugins/module_utils, roles/*/files) compiles without a warning
on every node Python the README claims, 3.8 (Ubuntu 20.04) to 3.13 (Debian 13), with pyenv's builds where this machine
has them (CI's has). Warnings are errors: 3.12 turned invalid escape sequences into a SyntaxWarning a node prints.
ruff checks the syntax against py37 (pyproject's per-file target); tests/lab/test_node_interpreters_lab.py runs the
modules on those Pythons."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from unit_helpers import ROOT

NODE_PYTHONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
PYENV = Path("/root/.pyenv/versions")

_COMPILE = """
import sys, warnings
warnings.simplefilter("error")
bad = []
for f in sys.argv[1:]:
    with open(f) as fh:
        src = fh.read()
    try:
        compile(src, f, "exec")
    except (SyntaxError, Warning) as e:
        bad.append("%s: %s" % (f, e))
print("\\n".join(bad))
sys.exit(1 if bad else 0)
"""


def _interpreter(version: str) -> Path | None:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}")) if PYENV.is_dir() else []
    return found[-1] if found else None


def _node_files() -> list[str]:
    files = [*(ROOT / "plugins" / "modules").glob("*.py"), *(ROOT / "plugins" / "module_utils").glob("*.py"),
             *ROOT.glob("roles/*/files/*.py")]
    return sorted(str(p) for p in files)


@pytest.mark.parametrize("version", NODE_PYTHONS)
def test_node_code_compiles_without_warnings(version: str) -> None:
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no pyenv build of Python {version} on this machine (pyenv install {version})")
    files = _node_files()
    assert len(files) > 20
    res = subprocess.run([str(python), "-I", "-c", _COMPILE, *files], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
