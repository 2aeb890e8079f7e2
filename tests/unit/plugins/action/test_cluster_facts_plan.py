"""The audit play's first task (action ddpfix_cluster, playbooks/audit.yml) decides what the facts task of every node
shares (`facts_plan`), so the facts role's own plan task (roles/ddpfix_facts/tasks/facts.yml) is left out: both,
taken as they are from those files and run by the real ansible-playbook, give every node the same facts-task
arguments (filter ddpfix_facts_args), with the role's defaults, the CLI's extra vars and a user's inventory values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[4]


def _task(tasks: list[dict[str, Any]], name_part: str) -> dict[str, Any]:
    (task,) = [t for t in tasks if name_part in str(t.get("name", ""))]
    return {k: v for k, v in task.items() if k not in ("when", "tags", "any_errors_fatal")}


def _playbook() -> list[dict[str, Any]]:
    audit_play = yaml.safe_load((ROOT / "playbooks" / "audit.yml").read_text())[0]
    role_tasks = yaml.safe_load((ROOT / "roles" / "ddpfix_facts" / "tasks" / "facts.yml").read_text())
    cluster_task = _task(audit_play["tasks"], "Cluster view")
    plan_task = _task(role_tasks, "What the facts task of every node shares")
    args = "ddpfix.cluster.ddpfix_facts_args(inventory_hostname)"
    compare = {"name": "Both plans' arguments", "ansible.builtin.debug": {
        "msg": f"ARGS={{{{ {{'first': (ddpfix_audit_cluster | {args}), 'role': (__ddpfix_facts_plan.data | {args})}}"
               " | to_json }}"}}
    # the audit play's import of the role, not run here: its defaults are the play's, as in the audit play
    (role,) = [t for t in audit_play["tasks"] if "ansible.builtin.import_role" in t]
    role = {**role, "when": False}
    return [{"hosts": "ddp_nodes", "gather_facts": False, "vars": audit_play["vars"],
             "tasks": [cluster_task, plan_task, compare, role]}]


@pytest.mark.parametrize("private_role_vars", ["False", "True"])
@pytest.mark.parametrize("extra", [
    {},  # the role's defaults
    {"ddpfix_facts_forks": 2, "ddpfix_facts_probe_port": 47001, "ddpfix_facts_probe": True,
     "ddpfix_facts_probe_peers": 1, "ddpfix_facts_probe_timeout": 1.5, "ddpfix_run_stale_minutes": 7,
     "ddpfix_run_holder": {"run_id": "r9", "command": "ddpfix audit"}, "ddpfix_limits_nofile_path": "/etc/x.conf"},
])
def test_the_first_tasks_facts_plan_gives_every_node_the_role_plans_arguments(
        tmp_path: Path, extra: dict[str, Any], private_role_vars: str) -> None:
    """A user's ansible.cfg with private_role_vars too: the audit play's import_role is public."""
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"ddp_nodes": {
        "hosts": {f"n{i}": {"ansible_host": f"127.0.0.{10 + i}", "ansible_connection": "local"} for i in (1, 2, 3)},
        "vars": {"ddp_master": "n2", "ddp_master_port": 29511, "ddp_cluster_cidr": "127.0.0.0/8"}}}))
    (tmp_path / "pb.yml").write_text(yaml.safe_dump(_playbook(), sort_keys=False, width=1000))
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DDPFIX_"))}
    env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "playbooks" / "collections"),
                "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_STDOUT_CALLBACK": "default",
                "DDPFIX_STATE_DIR": str(tmp_path / "state"), "ANSIBLE_PRIVATE_ROLE_VARS": private_role_vars})
    exe = Path(sys.executable).parent / "ansible-playbook"
    p = subprocess.run([str(exe), "-i", "inv.yml", "-e", "@extra.json", "pb.yml"], capture_output=True, text=True,
                       timeout=300, env=env, cwd=str(tmp_path), check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    seen = {}
    for line in p.stdout.splitlines():
        if '"msg": "ARGS=' in line:
            seen[len(seen)] = json.loads(json.loads(line.split('"msg": ', 1)[1])[len("ARGS="):])
    assert len(seen) == 3, p.stdout[-4000:]
    for args in seen.values():
        assert args["first"] == args["role"]
        assert args["first"]["master_port"] == 29511 and args["first"]["probe"] is not None
    if extra:
        first = seen[0]["first"]
        assert first["lock_stale_minutes"] == 7 and first["nofile_path"] == "/etc/x.conf"
        assert first["probe"]["port"] == 47001 and first["probe"]["detach"] is True
