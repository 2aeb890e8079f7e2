"""Action plugin ddpfix.cluster.ddpfix_play_values: values every host of a play shares, templated once (run it with
`run_once: true` and `register:`), set on no host's facts. Documentation: plugins/modules/ddpfix_play_values.py.

Why not a `run_once` set_fact: ansible-core 2.21 hands every host of a run_once set_fact the same (empty) object as
that task's cacheable-fact layer; a host with no facts cached yet keeps that very object as its facts, so the next
module that returns facts on one host (the facts module's `ddpfix_node`, a discovered interpreter) writes them for
every such host (measured: every node's `ddpfix_node` the last node's; upstream ansible/ansible#87148). A registered
result is kept per host (ansible-core merges it into a fresh per-host dict).
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # changes nothing
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={"data": {"type": "dict", "required": True}})
        result.update(changed=False, data=dict(args["data"]))
        return result
