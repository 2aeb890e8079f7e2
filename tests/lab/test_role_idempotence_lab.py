"""Role-level idempotence (issue 24, item 6), as linux-system-roles test their roles: each
tests/roles/tests_<role>.yml puts a fault on every node, applies one role that changes nodes, asserts (with
ansible.builtin.assert, tests/roles/tasks/apply_twice.yml) that the first apply changed the node and the second
changed nothing: the same sha256, mtime and inode of the role's files, the same runtime state. One shared 2-node lab
runs every playbook, through ansible-playbook alone (the collection from the checkout, no CLI).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, ansible_playbook

pytestmark = pytest.mark.lab

PLAYBOOKS = sorted((ROOT / "tests" / "roles").glob("tests_*.yml"))
#: roles that only read the nodes (or write their own run files); every other role changes nodes
READ_ONLY = {"facts", "run", "verify"}


@pytest.fixture(scope="module")
def role_lab(lab_factory: Any) -> Any:
    """One clean lab that every playbook in tests/roles runs on (each leaves its role's fix in place)."""
    return lab_factory(nodes=2, scenario="clean", wait_sync=False)


def test_every_changing_role_has_an_idempotence_playbook() -> None:
    changing = {p.name.removeprefix("ddpfix_") for p in (ROOT / "roles").iterdir() if p.is_dir()} - READ_ONLY
    tested = {p.stem.removeprefix("tests_") for p in PLAYBOOKS}
    assert tested == changing, (sorted(changing - tested), sorted(tested - changing))


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=[p.stem for p in PLAYBOOKS])
def test_role_first_apply_changes_second_changes_nothing(role_lab: Any, playbook: Path, tmp_path: Path) -> None:
    r = ansible_playbook(playbook, role_lab.inventory, tmp=tmp_path,
                         ANSIBLE_COLLECTIONS_PATH=str(ROOT / "playbooks" / "collections"))
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-2000:])
    recap = re.findall(r"^(\S+)\s+: ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)", r.stdout, re.M)
    assert {h for h, _, _ in recap} == {n.name for n in role_lab.nodes}, r.stdout[-2000:]
    assert all(u == "0" and f == "0" for _, u, f in recap), r.stdout[-2000:]
