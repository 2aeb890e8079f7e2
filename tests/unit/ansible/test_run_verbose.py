"""`-v`..`-vvvv`: Ansible's own output, live on stderr, at that verbosity (as ansible-playbook shows it); without -v,
nothing of it (stdout stays ddpfix's). ansible-runner stands in: its events carry Ansible's display lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpfix.ansible.run import run_playbook

SSH_LINE = "<10.0.0.2> ESTABLISH SSH CONNECTION FOR USER: root"


class _Result:
    status, rc, stats = "successful", 0, {"ok": {"node1": 1}}


@pytest.mark.parametrize(("verbosity", "passed"), [(0, None), (1, 1), (3, 3), (4, 4), (6, 4)])
def test_verbosity_reaches_ansible_and_its_output_is_shown_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str], verbosity: int,
                                                                passed: int | None) -> None:
    import ansible_runner

    seen: dict[str, Any] = {}

    def fake_run(**kwargs: Any) -> _Result:
        seen["verbosity"] = kwargs["verbosity"]
        for event in ({"event": "playbook_on_start"}, {"event": "verbose", "stdout": SSH_LINE},
                      {"event": "runner_on_ok", "stdout": "ok: [node1]", "event_data": {"host": "node1"}}):
            kwargs["event_handler"](event)
            seen.setdefault("live", []).append(capsys.readouterr().err)  # written as each event comes
        return _Result()

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ansible_runner, "run", fake_run)
    inv = tmp_path / "hosts.yml"
    inv.write_text("ddp_nodes:\n  hosts: {node1: {}}\n")
    run_playbook("audit.yml", [str(inv)], verbosity=verbosity)
    out = capsys.readouterr()
    assert seen["verbosity"] == passed and out.out == ""
    if verbosity:
        assert seen["live"] == ["", f"{SSH_LINE}\n", "ok: [node1]\n"]
    else:
        assert seen["live"] == ["", "", ""]
