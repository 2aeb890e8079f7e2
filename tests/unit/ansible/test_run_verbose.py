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


def test_live_output_never_shows_a_secret_that_the_run_records_leave_out(capsys: pytest.CaptureFixture[str]) -> None:
    """A result holding ddp_env_extra's secret (the cluster view) is shown scrubbed, and the value is *** in every
    later line (a -vvvv verbose line), as in the run directory's job events."""
    from ddpfix.ansible.rundirs import LiveOutput, scrub

    secret = "wandb-0123456789abcdef"
    res = {"cluster": {"nodes": [{"name": "node1", "env_extra": [["WANDB_API_KEY", secret], ["A", "1"]]}]},
           "hostvars": {"node1": {"ddp_env_extra": {"WANDB_API_KEY": secret}}}}
    live = LiveOutput()
    live.show(f"ok: [node1] => {res}", res, scrub(res))
    live.show(f"<node1> PUT /tmp/x args={secret}")
    live.show("ok: [node2]", {"a": 1}, scrub({"a": 1}))
    err = capsys.readouterr().err
    assert secret not in err and err.startswith("ok: [node1] => {") and '"A",\n' in err, err
    assert "<node1> PUT /tmp/x args=***\n" in err and err.endswith("ok: [node2]\n")
