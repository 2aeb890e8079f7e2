"""plugins/callback/ddpfix_payloads.py: the payloads of the modules a ddpfix run names (DDPFIX_PAYLOADS) are built
while the playbook starts, into ansible-playbook's own cache, so the worker that sends them reads them from there."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from unit_helpers import ROOT

from ddpfix.ansible.env import PAYLOADS_CALLBACK, ansible_env


def _callback_module() -> Any:
    spec = importlib.util.spec_from_file_location("ddpfix_payloads_cb", ROOT / "plugins" / "callback" /
                                                  "ddpfix_payloads.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_only_fully_qualified_module_names_are_built() -> None:
    mod = _callback_module()
    assert mod.CallbackModule.CALLBACK_NEEDS_ENABLED and mod.CallbackModule.CALLBACK_NAME == PAYLOADS_CALLBACK
    assert mod.payload_names(None) == [] and mod.payload_names("") == []
    assert mod.payload_names(" ddpfix.cluster.ddpfix_node_facts , ping,a.b.c;rm -rf /,../x.y.z,A.b.c") == [
        "ddpfix.cluster.ddpfix_node_facts"]
    assert len(mod.payload_names(",".join(f"a.b.m{i}" for i in range(20)))) == 8


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payloads: str) -> str:
    for k in list(os.environ):
        if k.startswith(("ANSIBLE_", "DDPFIX_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    # the pause leaves the builder time, as the ddpfix plays' controller-side tasks do before the facts task
    (work / "pb.yml").write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                                 "    - ansible.builtin.pause: {seconds: 1}\n    - ansible.builtin.ping:\n")
    monkeypatch.chdir(work)
    run_dir = tmp_path / f"run-{payloads or 'none'}"
    (run_dir / "tmp").mkdir(parents=True)
    env = {**os.environ, **ansible_env(run_dir, 1, []), "ANSIBLE_DEBUG": "1", "DDPFIX_PAYLOADS": payloads}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", "pb.yml"],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "Skipping callback plugin" not in out and "Failed to load callback" not in out
    assert not list((run_dir / "tmp").glob("ansible-local-*")), "ansible-playbook's temporary directory is left"
    return out


def test_the_worker_reads_the_payload_the_callback_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ansible-playbook run: with the module named, the task's worker finds its payload in the cache (the
    builder's own messages go to /dev/null); without, the worker builds it, as Ansible does."""
    built_ahead = _run(tmp_path, monkeypatch, "ansible.builtin.ping")
    assert "ANSIBALLZ: using cached module" in built_ahead and "ANSIBALLZ: Creating module" not in built_ahead
    plain = _run(tmp_path, monkeypatch, "")
    assert "ANSIBALLZ: Creating module" in plain
