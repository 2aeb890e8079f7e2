"""The run's job events (`<run dir>/artifacts/<ident>/job_events/`): ddpfix's event handler writes each one itself
(`rundirs.write_event`, one `json.dumps`) and tells ansible-runner not to; the files are what ansible-runner writes:
the same name, bytes and mode. ansible-runner's own `Runner.event_callback` is the judge."""

from __future__ import annotations

import json
import os
import stat
import types
from pathlib import Path
from typing import Any

from ansible_runner.runner import Runner

from ddpfix.ansible.rundirs import write_event

EVENT = {
    "uuid": "0a4e1c2e-1111-4a5b-9c8d-0123456789ab",
    "counter": 7,
    "created": "2026-12-06T14:00:00.000001+00:00",
    "event": "runner_on_ok",
    "stdout": "ok: [n\u00f6de1]",
    "event_data": {"host": "n\u00f6de1", "res": {"ansible_facts": {"ddpfix_node": {
        "hosts_file": [{"line": 6, "addr": "10.0.0.1", "names": ["node1"], "text": "10.0.0.1\tnode1  # \u00e9"}]}},
        "changed": False, "values": [1, 2.5, None, True]}},
}


def _callback(artifacts: Path, handler: Any) -> None:
    """ansible-runner's `Runner.event_callback` on EVENT, with its config's artifact dir `artifacts`."""
    (artifacts / "job_events").mkdir(parents=True)
    runner = types.SimpleNamespace(
        config=types.SimpleNamespace(artifact_dir=str(artifacts), ident="x", check_job_event_data=False),
        event_handler=handler, remove_partials=True, last_stdout_update=0.0)
    Runner.event_callback(runner, json.loads(json.dumps(EVENT)))  # type: ignore[arg-type]


def test_an_event_is_written_as_ansible_runner_writes_it_and_only_once(tmp_path: Path) -> None:
    _callback(tmp_path / "runner", None)  # ansible-runner's own writing
    calls: list[bool] = []

    def handler(event: dict[str, Any]) -> bool:
        calls.append(write_event(tmp_path / "ddpfix" / "job_events", event))
        return not calls[-1]

    _callback(tmp_path / "ddpfix", handler)
    theirs, ours = (sorted((tmp_path / d / "job_events").iterdir()) for d in ("runner", "ddpfix"))
    assert calls == [True]
    assert [p.name for p in ours] == [p.name for p in theirs] == [f"7-{EVENT['uuid']}.json"]  # no .tmp left
    assert ours[0].read_bytes() == theirs[0].read_bytes()
    assert stat.S_IMODE(os.stat(ours[0]).st_mode) == 0o600


def test_an_event_that_cannot_be_written_here_is_left_to_ansible_runner(tmp_path: Path) -> None:
    """No counter or uuid (not named as ansible-runner names it), or a directory that is not there: False, and
    ansible-runner does what it always did."""
    assert not write_event(tmp_path, {k: v for k, v in EVENT.items() if k != "counter"})
    assert not write_event(tmp_path, {**EVENT, "uuid": "../x"})
    assert not write_event(tmp_path / "missing", EVENT)
    assert list(tmp_path.iterdir()) == []
