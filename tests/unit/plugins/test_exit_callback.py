"""plugins/callback/ddpfix_exit.py: ansible-playbook exits without Python's final garbage collection passes; ddpfix
enables it for its runs next to the user's own callbacks (ANSIBLE_CALLBACKS_ENABLED, `ddpfix.ansible.config`)."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from unit_helpers import ROOT

from ddpfix.ansible.env import EXIT_CALLBACK, ansible_env


def test_the_callback_freezes_the_heap_at_exit_only_after_the_playbook_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("ddpfix_exit_cb", ROOT / "plugins" / "callback" / "ddpfix_exit.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    registered: list[Any] = []
    monkeypatch.setattr(mod.atexit, "register", registered.append)
    cb = mod.CallbackModule()
    assert mod.CallbackModule.CALLBACK_NEEDS_ENABLED and mod.CallbackModule.CALLBACK_NAME == EXIT_CALLBACK
    assert registered == []
    cb.v2_playbook_on_stats(None)
    assert registered == [gc.freeze]


def test_a_real_run_loads_it_next_to_the_users_callback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's ansible.cfg enables the builtin tree callback: it still writes its files, and ddpfix's exit callback
    is loaded from the collection, without a warning."""
    for k in list(os.environ):
        if k.startswith("ANSIBLE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "ansible.cfg").write_text("[defaults]\ncallbacks_enabled = ansible.builtin.tree\n"
                                      f"[callback_tree]\ndirectory = {tmp_path / 'tree'}\n")
    (work / "pb.yml").write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                                 "    - ansible.builtin.debug: {msg: hello}\n")
    monkeypatch.chdir(work)
    (tmp_path / "run" / "tmp").mkdir(parents=True)
    env = {**os.environ, **ansible_env(tmp_path / "run", 1, [])}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        "-vvvv", "pb.yml"], env=env, capture_output=True, text=True, timeout=120, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    assert "Skipping callback plugin" not in out and "Failed to load callback" not in out
    assert any(line.startswith("Loading callback plugin " + EXIT_CALLBACK) for line in out.splitlines()), out[-2000:]
    assert (tmp_path / "tree" / "localhost").is_file()
