"""Action ddpfix_play_values (plugins/action/ddpfix_play_values.py), run by the real ansible-playbook on three
controller-only aliases: a value templated once and registered on every host, and each host's facts kept its own.

The contrast is ansible-core's own behaviour (2.21, ansible/ansible#87148): a `run_once` set_fact run before any host
has facts cached leaves every host sharing one facts object, so one host's cacheable fact becomes every host's (the
facts role's `ddpfix_node` did: every node read as the last one). The test asserts what ddpfix relies on (the action keeps
hosts apart) and records which way ansible-core goes for the set_fact form, without depending on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Once for the play
      {once}
      run_once: true
    - name: Each host's own cacheable fact (as a module's ansible_facts)
      ansible.builtin.set_fact:
        own: "{{{{ inventory_hostname }}}}"
        cacheable: true
- hosts: all
  gather_facts: false
  tasks:
    - name: What each host reads
      ansible.builtin.debug:
        msg: "HOST={{{{ inventory_hostname }}}} OWN={{{{ ansible_facts.own }}}} SHARED={{{{ shared_value }}}}"
"""

ACTION = """ddpfix.cluster.ddpfix_play_values:
        data: {m: "{{ ansible_play_hosts_all | length }}"}
      register: shared"""
SET_FACT = """ansible.builtin.set_fact:
        shared: {data: {m: "{{ ansible_play_hosts_all | length }}"}}"""


def _run(tmp_path: Path, once: str) -> dict[str, tuple[str, str]]:
    (tmp_path / "inv.yml").write_text(
        "all:\n  hosts:\n" + "".join(f"    h{i}: {{ansible_connection: local}}\n" for i in (1, 2, 3))
        + "  vars: {shared_value: '{{ shared.data.m }}'}\n")
    (tmp_path / "pb.yml").write_text(PLAY.format(once=once))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "playbooks" / "collections"),
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_STDOUT_CALLBACK": "default"}
    for k in ("ANSIBLE_CACHE_PLUGIN", "ANSIBLE_CACHE_PLUGIN_CONNECTION", "ANSIBLE_CONFIG"):
        env.pop(k, None)
    exe = Path(sys.executable).parent / "ansible-playbook"
    p = subprocess.run([str(exe), "-i", "inv.yml", "pb.yml"], capture_output=True, text=True, timeout=300, env=env,
                       cwd=str(tmp_path), check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    seen = {}
    for line in p.stdout.splitlines():
        if '"msg": "HOST=' in line:
            host, own, shared = (part.split("=", 1)[1] for part in line.split('"msg": "')[1].rstrip('"').split())
            seen[host] = (own, shared)
    return seen


def test_registered_once_for_the_play_and_each_hosts_facts_its_own(tmp_path: Path) -> None:
    assert _run(tmp_path, ACTION) == {f"h{i}": (f"h{i}", "3") for i in (1, 2, 3)}


def test_the_run_once_set_fact_form_is_what_the_action_avoids(tmp_path: Path) -> None:
    """Not a requirement on ansible-core: either every host keeps its own fact, or (the behaviour the action exists
    for) they all read one host's."""
    seen = _run(tmp_path, SET_FACT)
    owns = {own for own, _ in seen.values()}
    assert set(seen) == {"h1", "h2", "h3"} and (owns == {"h1", "h2", "h3"} or len(owns) == 1), seen


def _tasks(node: object) -> list[dict[str, object]]:
    """Every task of a playbook or task file, blocks and their rescue/always included."""
    out: list[dict[str, object]] = []
    for item in node if isinstance(node, list) else []:
        if not isinstance(item, dict):
            continue
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            out += _tasks(item.get(key))
        if "hosts" not in item and not {"block", "rescue", "always"} & set(item):
            out.append(item)
    return out


def test_no_run_once_set_fact_in_a_playbook_or_role() -> None:
    """Values a play decides once are registered from ddpfix_play_values, never set by a run_once set_fact: on
    ansible-core 2.21 that leaves the hosts with no facts cached sharing one facts object (ansible/ansible#87148),
    so a fact a module returns on one node (its discovered Python, the facts module's ddpfix_node) reads as every
    node's. The test above shows the mechanism through ansible-playbook."""
    import yaml

    files = [*sorted((ROOT / "playbooks").glob("*.yml")), *sorted((ROOT / "roles").glob("*/tasks/*.yml"))]
    assert len(files) > 10
    offenders = []
    for f in files:
        for task in _tasks(yaml.safe_load(f.read_text())):
            set_fact = {"ansible.builtin.set_fact", "set_fact", "ansible.legacy.set_fact"} & set(task)
            if set_fact and str(task.get("run_once", "")).lower() in ("true", "yes", "1"):
                offenders.append(f"{f.relative_to(ROOT)}: {task.get('name')}")
    assert not offenders, offenders
