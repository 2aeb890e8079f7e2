"""`verify --torch` when ddp_python has no torch (or is not there): one line, from torchrun's real output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpfix.ansible.results import HostResult, RunResult, TaskResult
from ddpfix.verify import torch as verify

# Recorded on a lab node: `ddp_python -m torch.distributed.run ...` with a venv without torch, and with no such file.
NO_TORCH = ("/tmp/venv/bin/python: Error while finding module specification for 'torch.distributed.run' "
            "(ModuleNotFoundError: No module named 'torch')\n")
NO_PYTHON = "timeout: failed to run command \u2018/opt/nope/bin/python\u2019: No such file or directory\n"
GLOO_WAIT = "torch.distributed.DistStoreError: Timed out after 31 seconds waiting for clients. 1/3 clients joined.\n"


def _results(sim: Any, monkeypatch: pytest.MonkeyPatch, stderr: dict[str, str]) -> list[dict[str, Any]]:
    hosts = {h: HostResult(h, tasks=[TaskResult("Verify | torchrun all-reduce on every node at once, from the env file",
                                                 "ok", {"rc": 1, "stdout": "", "stderr": err},
                                                 action="ansible.builtin.command", role="ddpfix_verify")])
             for h, err in stderr.items()}
    run = RunResult("successful", 0, {}, hosts, Path("/nonexistent"), 1.0)
    monkeypatch.setattr(verify, "run_playbook", lambda *a, **k: run)
    return verify.run_torch(sim.cluster(), limit=None, forks=None, verbosity=0, progress=None, findings=[])


def test_torch_missing_everywhere_is_one_line(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _results(sim, monkeypatch, dict.fromkeys(sim.docs, NO_TORCH))
    line = verify.torch_missing_line(results)
    assert line is not None and "\n" not in line
    assert line.startswith(f"verify --torch: torch is missing on {', '.join(sim.docs)}: ")
    assert "No module named 'torch'" in line and "ddp_python" in line


def test_torch_missing_on_one_node_names_that_node(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    names = list(sim.docs)
    results = _results(sim, monkeypatch, {names[0]: GLOO_WAIT, names[1]: NO_TORCH, names[2]: GLOO_WAIT})
    line = verify.torch_missing_line(results)
    assert line is not None and line.startswith(f"verify --torch: torch is missing on {names[1]}: ")


def test_ddp_python_not_found(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _results(sim, monkeypatch, dict.fromkeys(sim.docs, NO_PYTHON))
    line = verify.torch_missing_line(results)
    assert line is not None and line.startswith("verify --torch: ddp_python is missing on ") and "/opt/nope" in line


def test_other_failures_keep_the_table(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert verify.torch_missing_line(_results(sim, monkeypatch, dict.fromkeys(sim.docs, GLOO_WAIT))) is None


def test_cli_prints_one_line(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from click.testing import CliRunner

    import ddpfix.cli.verify as verify_cli
    from ddpfix.cli import cli

    results = _results(sim, monkeypatch, dict.fromkeys(sim.docs, NO_TORCH))
    monkeypatch.setattr(verify_cli, "inventory_of", lambda app: ("x.yml",))  # the audit's play reads it
    monkeypatch.setattr(verify_cli.pipeline, "run_audit",
                        lambda *a, **k: SimpleNamespace(cluster=sim.cluster(), context=sim.context(), findings=[]))
    monkeypatch.setattr(verify, "run_torch", lambda *a, **k: results)  # pipeline.verify imports it when it runs
    r = CliRunner().invoke(cli, ["verify", "-i", "x.yml", "--torch", "--no-checks"])
    assert r.exit_code == 1
    assert r.output.splitlines() == [verify.torch_missing_line(results)]
