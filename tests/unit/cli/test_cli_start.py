"""What a command loads before it starts ansible-playbook (issue 25, N = 4: the CLI's start is on the audit's wall).

The checks, the firewall evaluator, explain's patterns, the remediation, the verification and the renderers load
after the run has started, in its preload thread (`ddpfix.audit.ANALYSIS_MODULES`, `pipeline.PLAN_MODULES` and
`VERIFY_MODULES`, `cli.common.OUTPUT_MODULES`), while ansible-playbook starts on another core; none of them is
imported by `ddpfix audit`'s own modules (`remediate` and `verify` still import theirs with the command: their
runs are longer). Run in a fresh interpreter (this process has imported everything).
"""

from __future__ import annotations

import json
import subprocess
import sys

#: Loaded only after a run has started (prefixes of module names).
AFTER_SPAWN = ("ddpfix.rules.engine", "ddpfix.rules.firewall", "ddpfix.rules.reachability", "ddpfix.firewall",
               "ddpfix.diagnose", "ddpfix.remediate", "ddpfix.verify", "ddpfix.render", "ddpfix.plan",
               "ddpfix.factguard.facts", "ddpfix.causes", "ddpfix.matrix", "ddpfix.report", "rich")


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


def test_audit_reaches_its_run_without_the_analysis_modules() -> None:
    loaded = _loaded("import ddpfix.cli, ddpfix.cli.audit")
    early = [m for m in loaded if m.startswith(AFTER_SPAWN)]
    assert not early, f"imported before the run starts: {early}"


def test_no_skipped_finding_loads_no_rule_registry() -> None:
    """The cluster task's worker reads ddp_skip_findings on the path to the first node: with none set, the rule
    registry (and the findings model under it) is not imported; a finding id to check loads it."""
    loaded = _loaded("from ddpfix.inventory.contract import parse_skip\nassert parse_skip(' , ', 'x') == ()")
    assert "ddpfix.rules.registry" not in loaded and "ddpfix.model.finding" not in loaded
    from ddpfix.rules import env as env_rules

    rid = env_rules.MISSING.id
    assert "ddpfix.rules.registry" in _loaded("from ddpfix.inventory.contract import parse_skip\n"
                                              f"assert parse_skip({rid!r}, 'x') == ({rid!r},)")


def test_the_preload_lists_name_modules_that_exist_and_cover_the_analysis() -> None:
    from ddpfix import pipeline
    from ddpfix.audit import ANALYSIS_MODULES
    from ddpfix.cli.common import OUTPUT_MODULES, TABLE_MODULES

    names = [*ANALYSIS_MODULES, *pipeline.PLAN_MODULES, *pipeline.VERIFY_MODULES, *OUTPUT_MODULES, *TABLE_MODULES]
    loaded = _loaded("import importlib\n" + "\n".join(f"importlib.import_module({json.dumps(n)})" for n in names))
    assert set(names) <= set(loaded)
    # what an audit's analysis and report need, loaded by the preload thread, not by the main thread after the run
    for heavy in ("ddpfix.rules.engine", "ddpfix.firewall", "ddpfix.plan", "ddpfix.factguard.facts", "ddpfix.render"):
        assert heavy in loaded, heavy
