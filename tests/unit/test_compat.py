"""Versions claimed = versions tested: pyproject.toml, meta/runtime.yml, the roles, the AWX execution environment and
the README's compatibility table state one ansible-core range, open upwards; CI runs its newest end (.venv) and its
oldest end (.venv-node, scripts/setup-node.sh), as the README's table says; the ansible-core these tests run on is
inside it; and ddpfix uses no private ansible-core module or method, whose absence on another ansible-core would
break it there."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import ansible.release
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
#: The claimed ansible-core range: its lowest (major, minor), and no upper bound (pip keeps a current Ansible).
CLAIMED = (2, 19)
#: The lowest `ansible` package (the collections that go with the lowest ansible-core).
CLAIMED_ANSIBLE = 12


def _lowest(spec: str) -> tuple[int, int]:
    """The lower bound of a requirement; one with an upper bound fails (it would make pip downgrade Ansible)."""
    lo = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert lo, f"no lower bound in {spec!r}"
    assert "<" not in spec and "~=" not in spec and "==" not in spec, f"an upper bound in {spec!r}"
    return int(lo[1]), int(lo[2])


def _deps() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def test_pyproject_runtime_roles_ee_and_readme_state_one_open_ansible_core_range() -> None:
    (core,) = [d for d in _deps() if d.startswith("ansible-core")]
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["requires_ansible"]
    assert _lowest(core) == _lowest(runtime) == CLAIMED
    ee = yaml.safe_load((ROOT / "examples" / "awx" / "execution-environment.yml").read_text())
    assert _lowest(ee["dependencies"]["ansible_core"]["package_pip"]) == CLAIMED
    for meta in sorted(ROOT.glob("roles/*/meta/main.yml")):
        version = yaml.safe_load(meta.read_text())["galaxy_info"]["min_ansible_version"]
        assert tuple(int(x) for x in str(version).split(".")) == CLAIMED, (meta, version)
    (pkg,) = [d for d in _deps() if re.match(r"ansible[<>=]", d)]
    assert pkg == f"ansible>={CLAIMED_ANSIBLE}", pkg
    readme = (ROOT / "README.md").read_text()
    lo = f"{CLAIMED[0]}.{CLAIMED[1]}"
    assert f"`ansible-core>={lo}`" in readme
    assert f"| ansible-core | {lo} and later (`ansible` {CLAIMED_ANSIBLE} and later) |" in readme


def _setting(script: str, name: str) -> str:
    m = re.search(rf'^{name}="?([^"\n]*)"?$', (ROOT / "scripts" / script).read_text(), re.M)
    assert m, (script, name)
    return m[1]


def test_readme_table_is_what_ci_runs() -> None:
    """The controller Pythons and ansible-cores of the README's table are the ones scripts/setup.sh (.venv, the whole
    suite: the newest) and scripts/setup-node.sh (.venv-node, the unit tests and the smoke lab test: the oldest)
    install; the oldest is the claimed lower bound."""
    newest_py, newest_core = _setting("setup.sh", "NEWEST_PYTHON"), _setting("setup.sh", "NEWEST_CORE")
    oldest_py, oldest_core = _setting("setup-node.sh", "OLDEST_PYTHON"), _setting("setup-node.sh", "OLDEST_CORE")
    assert oldest_core == f"ansible-core=={CLAIMED[0]}.{CLAIMED[1]}.*", oldest_core
    assert _setting("setup-node.sh", "OLDEST_ANSIBLE") == f"ansible=={CLAIMED_ANSIBLE}.*"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={oldest_py}", requires
    core = {"newest": newest_core.split("==")[1].rstrip(".*"), "oldest": oldest_core.split("==")[1].rstrip(".*")}
    readme = (ROOT / "README.md").read_text()
    row = f"| controller Python | {oldest_py} to {newest_py} | CI runs {newest_py} (the whole suite) and {oldest_py} (the oldest end) |"
    assert row in readme, row
    assert (f"CI runs the whole suite on the newest, {core['newest']} on Python {newest_py} (`.venv`" in readme
            and f"on the oldest, {core['oldest']} on Python {oldest_py}" in readme), core


def test_ci_runs_the_oldest_end_of_the_range_next_to_the_main_suite() -> None:
    """scripts/test-oldest.sh runs the unit tests and the smoke lab test on .venv-node (the oldest end); scripts/test.sh,
    CI's test command, starts it alongside the main suite and fails with it."""
    oldest = (ROOT / "scripts" / "test-oldest.sh").read_text()
    assert "scripts/setup-node.sh" in oldest and ".venv-node/bin/python -m pytest" in oldest
    assert "tests/unit" in oldest and "tests/lab/test_version_smoke_lab.py" in oldest
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "scripts/test-oldest.sh" in test_sh and "oldest_rc" in test_sh


def test_the_ansible_core_under_test_is_inside_the_claimed_range() -> None:
    version = tuple(int(x) for x in ansible.release.__version__.split(".")[:2])
    assert version >= CLAIMED, ansible.release.__version__


def _sources() -> list[Path]:
    return sorted([*(ROOT / "controller").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")])


def test_no_private_ansible_module_is_imported() -> None:
    """No `ansible._internal`, `ansible.cli.inventory._inventory_legacy` or any other `_`-name of ansible-core:
    they change without notice between releases (2.19's `_inventory_legacy` did not exist on 2.17)."""
    bad = []
    for path in _sources():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ansible":
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "ansible"]
            if any(part.startswith("_") for n in names for part in n.split(".")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        bad += [f"{path.relative_to(ROOT)}: {m}" for m in re.findall(r"ansible\.[a-z_.]*\._[a-z]\w*", text)]
    assert not bad, bad


def test_no_private_method_of_an_ansible_class_is_overridden() -> None:
    """A subclass of an ansible-core class defines no `_`-method the base has (the old strategy plugin overrode
    `_get_next_task_lockstep`; the env file module `_log_invocation` and `_return_formatted`)."""
    bad = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        imported: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ansible":
                for a in node.names:
                    imported[a.asname or a.name] = f"{node.module}:{a.name}"
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for base in cls.bases:
                if not isinstance(base, ast.Name) or base.id not in imported:
                    continue
                module, name = imported[base.id].split(":")
                base_cls = getattr(importlib.import_module(module), name)
                for fn in cls.body:
                    if (isinstance(fn, ast.FunctionDef) and fn.name.startswith("_") and not fn.name.startswith("__")
                            and hasattr(base_cls, fn.name)):
                        bad.append(f"{path.relative_to(ROOT)}: {cls.name}.{fn.name} overrides {base.id}.{fn.name}")
    assert not bad, bad


def test_test_sh_runs_the_oldest_alongside_prefixes_its_output_and_fails_with_it(tmp_path: Path) -> None:
    """scripts/test.sh (CI's test command) with stand-ins for setup.sh and test-oldest.sh: without arguments the
    oldest run's output follows, each line prefixed `[oldest] `, and its failure fails the run; DDPFIX_TEST_OLDEST=0
    leaves it out. The suite runs in two xdist workers; DDPFIX_TEST_WORKERS=1 in one process."""
    if os.geteuid() != 0:
        pytest.skip("scripts/test.sh re-runs itself through sudo when not root")
    (tmp_path / "scripts").mkdir()
    for name in ("test.sh", "as-root.sh"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    (tmp_path / "scripts" / "setup.sh").write_text("#!/bin/sh\n")
    oldest = tmp_path / "scripts" / "test-oldest.sh"
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    for f in (*(tmp_path / "scripts").iterdir(), tmp_path / ".venv" / "bin" / "python"):
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DDPFIX_TEST_OLDEST", "DDPFIX_TEST_WORKERS")}
    for rc, extra, expect_rc in ((3, {}, 1), (0, {}, 0), (3, {"DDPFIX_TEST_OLDEST": "0", "DDPFIX_TEST_WORKERS": "1"}, 0)):
        oldest.write_text(f'#!/bin/sh\necho "old out"\necho "old err" >&2\nexit {rc}\n')
        oldest.chmod(0o755)
        p = subprocess.run([str(tmp_path / "scripts" / "test.sh")], env={**env, **extra}, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == expect_rc, (rc, extra, p.stdout[-2000:], p.stderr[-2000:])
        # the whole suite runs in two pytest-xdist workers; DDPFIX_TEST_WORKERS=1 runs it in one process
        assert ("bringing up nodes" in p.stdout) is not bool(extra), p.stdout[-2000:]  # xdist starting its workers
        assert "1 passed" in p.stdout, p.stdout[-2000:]
        if extra:
            assert "[oldest]" not in p.stdout
        else:
            assert "[oldest] old out" in p.stdout and "[oldest] old err" in p.stdout
            assert f"[oldest] scripts/test-oldest.sh: rc={rc}" in p.stdout
