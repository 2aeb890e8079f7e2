"""Action plugin ddpfix.cluster.ddpfix_analyze: the controller's analysis of the facts play, run once on the controller.

The cluster comes from the inventory the play sees (`groups`, `hostvars`), each node's facts from
`hostvars[node].ansible_facts.ddpfix_node` (this run's facts play, or a fact cache); the pure checks, the report and
the remediation plan are the `ddpfix` package's own (the same code `ddpfix audit` and `ddpfix remediate` run).
Documentation: plugins/modules/ddpfix_analyze.py.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.ddpfix.cluster.plugins.plugin_utils.ddpfix_controller import (
    ddpfix,
    inventory_tree,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "mode": {"type": "str", "choices": ["audit", "plan"], "default": "audit"},
    "facts_from": {"type": "str", "choices": ["run", "cache"], "default": "run"},
    "report": {"type": "path", "default": ""},
    "fail_on": {"type": "str", "choices": ["error", "warning", "info", "none"], "default": "warning"},
    "skip": {"type": "raw", "default": ""},
    "probe": {"type": "bool", "default": True},
    "max_skew": {"type": "float", "default": 1.0},
    "apply": {"type": "bool", "default": False},
    "only": {"type": "raw", "default": ""},
    "allow_partial": {"type": "bool", "default": False},
    "pin_ifnames": {"type": "bool", "default": False},
}


def _csv(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value or "")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # read-only on the nodes; writes only the report on the controller
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        app = ddpfix("ddpfix.errors")
        try:
            result.update(self._analyze(args, task_vars))
        except app.DdpfixError as exc:  # bad input or a refused plan: one line, nothing changed anywhere
            raise AnsibleActionFail(str(exc)) from None
        return result

    def _analyze(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        pipeline = ddpfix("ddpfix.pipeline")
        skip = _csv(args["skip"]) or None
        # --only first, as the CLI checks it: before anything is read (an unknown or detect-only id fails the task)
        only = pipeline.parse_only(_csv(args["only"]), "ddpfix_only") if args["mode"] == "plan" else None
        hostvars = task_vars.get("hostvars") or {}
        cluster = pipeline.cluster_of_play(task_vars, inventory_tree(hostvars, task_vars.get("groups") or {}))
        result = pipeline.analyze(cluster, hostvars, from_run=args["facts_from"] == "run",
                                  limit=task_vars.get("ansible_limit") or None,
                                  thresholds=ddpfix("ddpfix.rules.context").Thresholds(max_skew_s=float(args["max_skew"])))
        if args["mode"] == "plan":
            return self._plan(pipeline, result, only, skip, args)
        v = pipeline.verdict(result, probe=bool(args["probe"]), skip=skip, fail_on=args["fail_on"])
        out: dict[str, Any] = {"changed": False, "summary": v.doc["summary"], "findings": v.doc["findings"]}
        if args["report"]:
            out["report"] = self._write(args["report"], ddpfix("ddpfix.report").to_json(v.doc))
        if v.failing:
            out["failed"] = True
            out["msg"] = f"{v.line}: " + ", ".join(f"{f.id}@{f.host or 'cluster'}" for f in v.failing)
        else:
            out["msg"] = f"nothing at or above {args['fail_on']}"
        return out

    @staticmethod
    def _plan(pipeline: Any, result: Any, only: set[str] | None, skip: str | None,
              args: dict[str, Any]) -> dict[str, Any]:
        """The fixes of every node (what `ddpfix remediate` passes remediate.yml as extra vars), planned and refused
        by the pipeline `ddpfix remediate` runs (bad facts, unknown or unacknowledged CIDR: fail, nothing changed)."""
        fixes = pipeline.plan(result, only=only, skip=skip, allow_partial=bool(args["allow_partial"]),
                              pin_ifnames=bool(args["pin_ifnames"]), apply=bool(args["apply"]))
        todo = fixes.todo
        plan_vars = ddpfix("ddpfix.remediate").remediate_extravars(result.context, fixes.plans)
        plan_vars.pop("ddpfix_target", None)
        return {
            "changed": False,
            "vars": plan_vars,
            "todo": sorted(todo),
            "refused": fixes.refusals,
            "notes": {h: p.notes for h, p in fixes.plans.items() if p.notes},
            "findings": [f.to_json() for f in fixes.findings],
            "warnings": [f"refused: {r}" for r in fixes.refusals],
            "msg": (f"fixes planned on {', '.join(sorted(todo))}" if todo else "nothing to fix"),
        }

    @staticmethod
    def _write(path: str, text: str) -> str:
        path = os.path.abspath(os.path.expanduser(path))
        try:  # a private temporary file, then a rename: never through a planted link
            ddpfix("ddpfix.safefile").write_atomic(path, text)
        except OSError as exc:
            raise AnsibleActionFail(f"ddpfix_report: cannot write {path}: {exc.strerror}") from None
        return path
