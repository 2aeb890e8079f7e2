"""The collection installs on its own: galaxy.yml names every collection the roles use, ansible-builder reads the
collection's meta/execution-environment.yml (the ddpfix package's PyPI dependencies, SSH client: no unpublished name),
the AWX EE definition in examples/awx/ is accepted by `ansible-builder create` (the build context only: no image is
built), and the built collection installs and loads on the ansible-core these tests run on (CI: both ends)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _fqcn_collections() -> set[str]:
    """Collections named by the task keys of roles and playbooks (`ns.coll.module:`), other than ddpfix's and
    ansible.builtin."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for x in node:
                walk(x)
        elif isinstance(node, dict):
            for k, v in node.items():
                m = re.fullmatch(r"([a-z0-9_]+)\.([a-z0-9_]+)\.[a-z0-9_]+", str(k))
                if m and m.group(1) != "ddpfix" and (m.group(1), m.group(2)) != ("ansible", "builtin"):
                    found.add(f"{m.group(1)}.{m.group(2)}")
                walk(v)

    for path in [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"), *ROOT.glob("playbooks/*.yml")]:
        walk(yaml.safe_load(path.read_text()))
    for path in ROOT.glob("plugins/action/*.py"):  # modules an action plugin runs (e.g. ddpfix_fw_change's ufw)
        for m in re.finditer(r"[\"']([a-z0-9_]+)\.([a-z0-9_]+)\.[a-z0-9_]+[\"']", path.read_text()):
            if m.group(1) not in ("ddpfix", "ansible_collections") and (m.group(1), m.group(2)) != ("ansible", "builtin"):
                found.add(f"{m.group(1)}.{m.group(2)}")
    return found


def test_galaxy_yml_declares_every_collection_the_roles_use() -> None:
    deps = yaml.safe_load((ROOT / "galaxy.yml").read_text())["dependencies"]
    used = _fqcn_collections()
    assert used >= {"ansible.posix", "community.general"}
    assert used <= set(deps), sorted(used - set(deps))
    assert all(re.fullmatch(r">=\d+\.\d+\.\d+", v) for v in deps.values()), deps


def _pypi_requirements() -> list[str]:
    """pyproject.toml's dependencies less ansible and ansible-core (the execution environment's own)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if not re.match(r"ansible(-core)?[<>=~]", d)]


def test_ee_requirements_are_the_packages_pyproject_names() -> None:
    """meta/requirements.txt names published PyPI packages only (`ddpfix` is not one: the collection carries it in
    controller/), the same as the wheel's."""
    lines = (ROOT / "meta" / "requirements.txt").read_text().splitlines()
    reqs = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    assert reqs == _pypi_requirements()
    assert not any(r.startswith("ddpfix") for r in reqs)


def test_ansible_builder_introspects_the_collection(tmp_path: Path) -> None:
    """What `ansible-builder` adds to any EE that installs ddpfix.cluster (its meta/execution-environment.yml)."""
    coll = tmp_path / "ansible_collections" / "ddpfix"
    coll.mkdir(parents=True)
    (coll / "cluster").symlink_to(ROOT)
    r = subprocess.run([str(BIN / "ansible-builder"), "introspect", "--sanitize", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    data = yaml.safe_load(r.stdout)
    found = [p.split()[0] for p in data["python"]]
    # --sanitize leaves out what ansible-core itself requires (pyyaml)
    assert found == [r for r in _pypi_requirements() if not r.startswith("pyyaml")], found
    assert {s.split()[0] for s in data["system"]} == {"openssh-client", "openssh-clients"}


def test_ansible_builder_create_accepts_the_awx_ee_definition(tmp_path: Path) -> None:
    ctx = tmp_path / "context"
    r = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", str(ROOT / "examples/awx/execution-environment.yml"),
                        "-c", str(ctx), "--output-filename", "Containerfile"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    build = ctx / "_build"
    assert set(_pypi_requirements()) <= set((build / "requirements.txt").read_text().split())
    assert "openssh-clients [platform:rpm]" in (build / "bindep.txt").read_text()
    galaxy = yaml.safe_load((build / "requirements.yml").read_text())
    deps = yaml.safe_load((ROOT / "galaxy.yml").read_text())["dependencies"]
    assert {c["name"]: c["version"] for c in galaxy["collections"]} == deps  # the EE installs what galaxy.yml needs
    containerfile = (ctx / "Containerfile").read_text()
    assert "ansible-core>=2.19" in containerfile and "install-from-bindep" in containerfile


def test_the_built_collection_carries_its_ee_requirements(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (tarball,) = tmp_path.glob("ddpfix-cluster-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = yaml.safe_load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    assert {"meta/execution-environment.yml", "meta/requirements.txt", "meta/bindep.txt"} <= names
    assert set(manifest["collection_info"]["dependencies"]) == {"ansible.posix", "community.general"}


def test_the_collection_builds_without_caches_installs_and_loads_on_this_ansible_core(tmp_path: Path) -> None:
    """`ansible-galaxy collection build` of a copy of the collection with test caches in it (.hypothesis/,
    .pytest_cache/, __pycache__/, a .venv*), then `collection install` of the tarball (offline: the dependencies are
    the `ansible` package's) and its modules found with the version check set to error (requires_ansible)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(".venv*", ".git", "inventories", "*.tar.gz"))
    for cache in (".hypothesis/examples", "tests/unit/.hypothesis", ".pytest_cache/v", "controller/.pytest_cache",
                  "plugins/__pycache__", ".venv-x/bin"):
        (src / cache).mkdir(parents=True, exist_ok=True)
        (src / cache / "junk").write_text("x\n")
    out = tmp_path / "out"
    r = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out), str(src)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (tarball,) = out.glob("ddpfix-cluster-*.tar.gz")
    with tarfile.open(tarball) as tar:
        junk = [n for n in tar.getnames() if n.endswith("/junk") or "cache" in n or ".venv" in n or "hypothesis" in n]
    assert not junk, junk
    inst = tmp_path / "collections"
    env = {**os.environ, "ANSIBLE_COLLECTIONS_ON_ANSIBLE_VERSION_MISMATCH": "error", "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(inst),
                        str(tarball)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "ddpfix.cluster:0" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(BIN / "ansible-doc"), "-t", "module", "ddpfix.cluster.ddpfix_probe"], capture_output=True,
                       text=True, timeout=120, env={**env, "ANSIBLE_COLLECTIONS_PATH": str(inst)})
    assert r.returncode == 0 and "ddpfix_probe" in r.stdout, r.stdout[-2000:] + r.stderr
