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
        audit = ddpfix("ddpfix.audit")
        context = ddpfix("ddpfix.rules.context")
        engine = ddpfix("ddpfix.rules.engine")
        inventory = ddpfix("ddpfix.inventory.derive")
        hostvars = task_vars.get("hostvars") or {}
        cluster = inventory.cluster_from_hostvars(inventory_tree(hostvars, task_vars.get("groups") or {}), hostvars,
                                                  [str(s) for s in task_vars.get("ansible_inventory_sources") or []])
        limit = task_vars.get("ansible_limit") or None
        hosts = audit.hosts_from_vars(cluster, hostvars, from_run=args["facts_from"] == "run", limit=limit)
        ctx = context.Context(cluster, hosts, context.Thresholds(max_skew_s=float(args["max_skew"])))
        findings = engine.run_checks(ctx)
        if args["mode"] == "plan":
            return self._plan(ctx, findings, args)
        doc, kept = audit.audit_report(ctx, findings, probe=bool(args["probe"]), skip=_csv(args["skip"]) or None)
        out: dict[str, Any] = {"changed": False, "summary": doc["summary"], "findings": doc["findings"]}
        if args["report"]:
            out["report"] = self._write(args["report"], ddpfix("ddpfix.report").to_json(doc))
        failing = audit.failing(kept, args["fail_on"])
        if failing:
            out["failed"] = True
            out["msg"] = (f"{len(failing)} finding{'s' if len(failing) != 1 else ''} at or above {args['fail_on']}: "
                          + ", ".join(f"{f.id}@{f.host or 'cluster'}" for f in failing))
        else:
            out["msg"] = f"nothing at or above {args['fail_on']}"
        return out

    def _plan(self, ctx: Any, findings: list[Any], args: dict[str, Any]) -> dict[str, Any]:
        """The fixes of every node (what `ddpfix remediate` passes remediate.yml as extra vars), refused exactly
        where the CLI refuses (bad facts, unknown or unacknowledged CIDR: fail, nothing changed)."""
        audit = ddpfix("ddpfix.audit")
        remediate = ddpfix("ddpfix.remediate")
        rules = ddpfix("ddpfix.rules.registry").RULES
        only = {s.strip() for s in _csv(args["only"]).split(",") if s.strip()} or None
        unknown = sorted((only or set()) - set(rules))
        if unknown:
            raise ddpfix("ddpfix.errors").DdpfixError(f"ddpfix_only: unknown finding id(s): {', '.join(unknown)}")
        kept, _ = audit.split_skipped(findings, _csv(args["skip"]) or None, ctx.cluster)
        plans, refusals = remediate.build_plan(ctx, kept, only=only, allow_partial=bool(args["allow_partial"]),
                                               pin_ifnames=bool(args["pin_ifnames"]))
        todo = {h: p for h, p in plans.items() if not p.empty}
        if ctx.invalid or todo:
            remediate.preflight(ctx, todo, apply=bool(args["apply"]))
        plan_vars = remediate.remediate_extravars(ctx, plans)
        plan_vars.pop("ddpfix_target", None)
        return {
            "changed": False,
            "vars": plan_vars,
            "todo": sorted(todo),
            "refused": refusals,
            "notes": {h: p.notes for h, p in plans.items() if p.notes},
            "findings": [f.to_json() for f in kept],
            "warnings": [f"refused: {r}" for r in refusals],
            "msg": (f"fixes planned on {', '.join(sorted(todo))}" if todo else "nothing to fix"),
        }

    @staticmethod
    def _write(path: str, text: str) -> str:
        path = os.path.abspath(os.path.expanduser(path))
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            raise AnsibleActionFail(f"ddpfix_report: cannot write {path}: {exc.strerror}") from None
        return path
