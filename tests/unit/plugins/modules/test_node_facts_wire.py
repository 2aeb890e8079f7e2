"""What the facts module sends (schema 2) and what the controller reads of it: a real ansible-playbook run of
`ddpfix.cluster.ddpfix_node_facts` on this machine (local connection, no probe, no lock); its result carries the
/etc/hosts entries as one string (`hosts_lines`), and the one conversion (`audit.host_facts`) gives back exactly
the entries the node's own parser reads from that file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from unit_helpers import nodeinfo

from ddpfix.ansible.env import ansible_env
from ddpfix.audit import host_facts

PLAY = """- hosts: localhost
  gather_facts: false
  tasks:
    - name: Facts
      ddpfix.cluster.ddpfix_node_facts:
        master_address: 127.0.0.1
        env_path: "{{ out }}/ddp.env"
        lock_path: "{{ out }}/lock"
      register: facts
    - name: Keep the result
      ansible.builtin.copy:
        content: "{{ facts | to_json }}"
        dest: "{{ out }}/result.json"
        mode: "0600"
"""


def test_the_modules_hosts_lines_read_back_as_the_files_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("ANSIBLE_", "DDPFIX_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pb.yml").write_text(PLAY)
    run_dir = tmp_path / "run"
    (run_dir / "tmp").mkdir(parents=True)
    env = {**os.environ, **ansible_env(run_dir, 1, [])}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"out={tmp_path}", "pb.yml"],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    sent = json.loads((tmp_path / "result.json").read_text())["ansible_facts"]["ddpfix_node"]
    assert sent["schema"] == 2 and isinstance(sent["hosts_lines"], str) and "hosts_file" not in sent
    assert sent["hosts_file_scope"] == "whole"  # no probe: the whole file
    got = host_facts("localhost", sent).node
    assert got is not None and got["schema"] == 1 and "hosts_lines" not in got
    assert got["hosts_file"] == nodeinfo().parse_hosts_file(Path("/etc/hosts").read_text())
