"""Versions claimed = versions tested: pyproject.toml, meta/runtime.yml and the README's compatibility table state
one ansible-core range with an upper bound, and the ansible-core these tests run on is inside it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import ansible.release
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _range(spec: str) -> tuple[tuple[int, int], tuple[int, int]]:
    lo = re.search(r">=\s*(\d+)\.(\d+)", spec)
    hi = re.search(r"<\s*(\d+)\.(\d+)", spec)
    assert lo and hi, f"no lower and upper bound in {spec!r}"
    return (int(lo[1]), int(lo[2])), (int(hi[1]), int(hi[2]))


def test_pyproject_runtime_and_readme_state_one_bounded_ansible_core_range() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (core,) = [d for d in deps if d.startswith("ansible-core")]
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["requires_ansible"]
    assert _range(core) == _range(runtime) == ((2, 19), (2, 20))
    ee = yaml.safe_load((ROOT / "examples" / "awx" / "execution-environment.yml").read_text())
    assert _range(ee["dependencies"]["ansible_core"]["package_pip"]) == _range(core)
    readme = (ROOT / "README.md").read_text()
    assert "`ansible-core>=2.19,<2.20`" in readme and "| ansible-core | 2.19 (`ansible` 12) |" in readme


def test_the_ansible_core_under_test_is_inside_the_claimed_range() -> None:
    version = tuple(int(x) for x in ansible.release.__version__.split(".")[:2])
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (core,) = [d for d in deps if d.startswith("ansible-core")]
    lo, hi = _range(core)
    assert lo <= version < hi, ansible.release.__version__
