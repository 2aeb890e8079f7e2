"""The repository is the Ansible collection ddpfix.cluster: it builds, and the wheel ships the same content."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import yaml
from unit_helpers import ROOT

import ddpfix


def test_collection_builds_with_the_node_content_and_the_controller_package_only(tmp_path: Path) -> None:
    """The roles, plugins and playbooks, and controller/ddpfix (the package the action plugins import when no ddpfix
    is installed, as in an execution environment built from the collection alone); no tests, inventories, scripts."""
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    r = subprocess.run([str(galaxy), "collection", "build", "--output-path", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (tarball,) = tmp_path.glob("ddpfix-cluster-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    assert manifest["collection_info"]["version"] == ddpfix.__version__
    for must in ("plugins/modules/ddpfix_node_facts.py", "plugins/module_utils/ddpfix_envfile.py",
                 "plugins/filter/ddpfix_probe_plan.py", "meta/runtime.yml",
                 "playbooks/audit.yml", "playbooks/remediate.yml", "roles/ddpfix_facts/tasks/main.yml"):
        assert must in names, must
    assert "controller/ddpfix/pipeline.py" in names
    assert not any(n.split("/")[0] in {"tests", "inventories", ".venv", "scripts"} for n in names)
    assert {n.split("/")[1] for n in names if n.startswith("controller/")} == {"ddpfix"}
    assert not any(n.startswith("playbooks/collections") for n in names)


def test_wheel_ships_every_playbook_and_the_collection_metadata() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = cfg["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    for pb in sorted((ROOT / "playbooks").glob("*.yml")):
        assert f"playbooks/{pb.name}" in shipped, pb.name
    for part in ("roles", "plugins", "meta", "galaxy.yml"):
        assert part in shipped, part


def test_roles_and_playbooks_name_modules_by_fqcn() -> None:
    modules = {p.stem for p in (ROOT / "plugins" / "modules").glob("*.py")}

    def tasks(node: object) -> list[dict[str, object]]:
        """Every task-like mapping (one with a `name`) in a YAML document; variables named like a module are not."""
        if isinstance(node, list):
            return [t for x in node for t in tasks(x)]
        if isinstance(node, dict):
            return ([node] if "name" in node else []) + [t for v in node.values() for t in tasks(v)]
        return []

    for path in [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"), *ROOT.glob("playbooks/*.yml")]:
        for task in tasks(yaml.safe_load(path.read_text())):
            for mod in modules:
                assert mod not in task, (path, mod, task.get("name"))
    assert yaml.safe_load((ROOT / "galaxy.yml").read_text())["namespace"] == "ddpfix"


def test_every_module_documents_itself_in_valid_yaml() -> None:
    """ansible-doc (and ansible-lint, which only warns) read these strings; a stray `: ` breaks them silently."""
    import ast

    for path in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        docs = {n.targets[0].id: n.value.value for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                and n.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(n.value, ast.Constant)}
        assert {"DOCUMENTATION", "RETURN"} <= set(docs), path.name
        for name, text in docs.items():
            assert yaml.safe_load(text) is not None, (path.name, name)
        assert yaml.safe_load(docs["DOCUMENTATION"])["module"] == path.stem, path.name


def test_no_test_only_switch_ships() -> None:
    """Fault injection lives in the test tree (tests/lab/plugins): no shipped module documents an option named like
    a test switch, and no role, playbook or module reads a variable named so (an inventory could set it)."""
    import re

    switch = re.compile(r"\b\w*(?:test_break|_test_|fault_inject)\w*\b", re.I)
    for path in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        import ast

        doc = next(n.value.value for n in ast.parse(path.read_text()).body
                   if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                   and n.targets[0].id == "DOCUMENTATION" and isinstance(n.value, ast.Constant))
        options = (yaml.safe_load(doc) or {}).get("options") or {}
        assert not [o for o in options if o.startswith("test") or switch.search(o)], (path.name, list(options))
    shipped = [*ROOT.glob("roles/**/*.yml"), *ROOT.glob("playbooks/*.yml"), *ROOT.glob("plugins/**/*.py")]
    for path in shipped:
        hits = switch.findall(path.read_text())
        assert not hits, (path.relative_to(ROOT), hits)
