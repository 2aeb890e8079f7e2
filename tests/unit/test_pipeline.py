"""The one orchestrator (`ddpfix.pipeline`): the CLI and the playbooks' action plugin (ddpfix_analyze) sequence a run
through it, so the same inputs give the same findings, plan and refusals on both paths (the lab proof with a real
ansible-playbook: tests/lab/test_standalone_lab.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from ddpfix import pipeline
from ddpfix.ansible.results import HostResult, RunResult, TaskResult
from ddpfix.audit import AuditResult, cluster_from_data, cluster_of_run
from ddpfix.cli import cli
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.remediate import remediate_extravars
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules.engine import run_checks
from ddpfix.rules.registry import RULES

ROOT = Path(__file__).resolve().parents[2]
FIXABLE = hosts_rules.HOSTNAME_LOOPBACK.id
DETECT_ONLY = next(i for i, r in RULES.items() if not r.fixable)
UNKNOWN = "no.such-finding"
PKG = "ansible_collections.ddpfix.cluster.plugins"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def analyze_action(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The action plugin ddpfix_analyze's class, loaded from the checkout (its collection path is not installed)."""
    pytest.importorskip("ansible")
    utils = f"{PKG}.plugin_utils.ddpfix_controller"
    monkeypatch.setitem(sys.modules, utils, None)
    _load(utils, ROOT / "plugins" / "plugin_utils" / "ddpfix_controller.py")
    mod = _load(f"{PKG}.action.ddpfix_analyze", ROOT / "plugins" / "action" / "ddpfix_analyze.py")
    monkeypatch.delitem(sys.modules, f"{PKG}.action.ddpfix_analyze")
    return mod.ActionModule


def _faulty(sim: Any) -> Any:
    """The recorded clean cluster with its last node's hostname on 127.0.1.1 (hosts_rules.HOSTNAME_LOOPBACK, fixable)."""
    name = sim.cluster().names[-1]
    sim.set_hosts_file(name, f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n")
    sim.node(name)["resolve_self"] = {name: ["127.0.1.1"]}
    return sim


def _play_vars(sim: Any) -> dict[str, Any]:
    """What the analysis play sees: every node's facts in a fact cache, the inventory as groups and hostvars."""
    inv = sim.inventory
    hostvars = {n: {**inv["_meta"]["hostvars"].get(n, {}),
                    "ansible_facts": {"ddpfix_node": {**d["node"], "probe": d["probe"]}}}
                for n, d in sim.docs.items()}
    groups = {g: v.get("hosts", []) for g, v in inv.items() if g != "_meta"}
    groups["all"] = list(sim.docs)
    return {"hostvars": hostvars, "groups": groups, "ansible_inventory_sources": []}


def _plugin(action: Any, sim: Any, **args: Any) -> dict[str, Any]:
    full = {"mode": "audit", "facts_from": "cache", "report": "", "fail_on": "warning", "skip": "", "probe": True,
            "max_skew": 1.0, "apply": False, "only": "", "allow_partial": False, "pin_ifnames": False, **args}
    self = object.__new__(action)
    return action._analyze(self, full, _play_vars(sim))  # type: ignore[no-any-return]


def _cli_audit(sim: Any) -> AuditResult:
    ctx = sim.context()
    return AuditResult(ctx.cluster, ctx, run_checks(ctx), None)  # type: ignore[arg-type]


def test_only_is_judged_once_for_both_paths() -> None:
    assert pipeline.parse_only(None, "--only") is None and pipeline.parse_only(" , ", "--only") is None
    assert pipeline.parse_only(f"{FIXABLE}, ", "--only") == {FIXABLE}
    assert pipeline.parse_only([FIXABLE], "ddpfix_only") == {FIXABLE}
    for bad, words in ((DETECT_ONLY, "not fixed by remediate (detect-only)"), (UNKNOWN, "unknown finding id(s)")):
        with pytest.raises(DdpfixError) as exc:
            pipeline.parse_only(f"{FIXABLE},{bad}", "ddpfix_only")
        assert exc.value.code == ExitCode.INVALID_INPUT and str(exc.value).startswith(f"ddpfix_only: {words}: {bad}")


@pytest.mark.parametrize("only", [DETECT_ONLY, UNKNOWN])
def test_only_refused_alike_by_the_cli_and_the_playbook(only: str, sim: Any, analyze_action: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The known disagreement, fixed: a detect-only id exits 2 on the CLI and fails the playbook's plan task, with
    the same words (each naming its own option), before anything is read; so does an unknown id."""
    import ddpfix.cli.remediate as remediate_cli

    monkeypatch.setattr(remediate_cli, "inventory_of", lambda app: pytest.fail("read the inventory"))
    r = CliRunner().invoke(cli, ["remediate", "-i", "x.yml", "--only", only])
    assert r.exit_code == 2 and r.stdout == "", r.output
    with pytest.raises(DdpfixError) as exc:
        _plugin(analyze_action, _faulty(sim), mode="plan", only=only)
    assert exc.value.code == ExitCode.INVALID_INPUT
    cli_line = r.stderr.strip().removeprefix("ddpfix: error: ")
    assert str(exc.value).replace("ddpfix_only:", "--only:", 1) == cli_line


@pytest.mark.parametrize("only", ["", FIXABLE])
def test_plan_of_the_playbook_is_the_clis(only: str, sim: Any, analyze_action: Any) -> None:
    sim = _faulty(sim)
    got = _plugin(analyze_action, sim, mode="plan", only=only)
    fixes = pipeline.plan(_cli_audit(sim), only=pipeline.parse_only(only, "--only"))
    want = remediate_extravars(sim.context(), fixes.plans)
    want.pop("ddpfix_target", None)
    assert json.loads(json.dumps(got["vars"])) == json.loads(json.dumps(want))
    assert got["todo"] == sorted(fixes.todo) and sim.cluster().names[-1] in got["todo"]
    assert not only or all(p["hosts"] and not p["env"] for p in got["vars"]["ddpfix_plan"].values())
    assert got["findings"] == [f.to_json() for f in fixes.findings]


def test_audit_of_the_playbook_is_the_clis(sim: Any, analyze_action: Any) -> None:
    sim = _faulty(sim)
    got = _plugin(analyze_action, sim)
    v = pipeline.verdict(_cli_audit(sim))
    assert got["findings"] == v.doc["findings"] and got["summary"] == v.doc["summary"]
    assert got["failed"] and got["msg"].startswith(v.line) and v.code == ExitCode.FINDINGS
    assert FIXABLE in {f["id"] for f in got["findings"]}


def _cluster_task(res: dict[str, Any]) -> RunResult:
    task = TaskResult("Cluster view", "ok", res, action="ddpfix.cluster.ddpfix_cluster")
    return RunResult(status="successful", rc=0, stats={}, hosts={"n1": HostResult(name="n1", tasks=[task])},
                     run_dir=Path("/nonexistent"), seconds=0.0)


def test_cluster_is_derived_once_and_handed_along(sim: Any) -> None:
    """The audit play's first task returns the cluster it derived; the CLI and the analysis take it as it is."""
    cluster = sim.cluster()
    data = json.loads(json.dumps(dataclasses.asdict(cluster)))  # through the task result's JSON
    assert cluster_from_data(data, ["inv.yml"]) == dataclasses.replace(cluster, inventories=("inv.yml",))
    # no inventory in the result: nothing is derived again from it
    assert cluster_of_run(_cluster_task({"cluster": data}), ["inv.yml"]).inventories == ("inv.yml",)
    play = {"ddpfix_audit_cluster": {"cluster": data}, "ansible_inventory_sources": ["inv.yml"]}
    assert pipeline.cluster_of_play(play, {}) == cluster_from_data(data, ["inv.yml"])


def test_clock_window_is_read_one_way_from_either_source() -> None:
    """The CLI's runner event times and the play's ddpfix_facts_window fact give the same window, or none."""
    from ddpfix.audit import _window, clock_window, hosts_from_vars

    task = TaskResult("Facts", "ok", {}, start="2026-01-01T00:00:00+00:00", end="2026-01-01T00:00:02.5+00:00",
                      action="ddpfix.cluster.ddpfix_node_facts")
    lo, hi = _window(task) or (0.0, 0.0)
    assert hi - lo == 2.5
    assert clock_window(str(lo), str(hi)) == clock_window(lo, hi) == (lo, hi)
    for bad in ((hi, lo), (None, hi), ("x", hi), ([], hi)):
        assert clock_window(*bad) is None
    assert _window(TaskResult("Facts", "ok", {}, start="garbage", end="2026-01-01T00:00:02+00:00")) is None
    play = {"n1": {"ansible_facts": {"ddpfix_node": {"hostname": "n1"}, "ddpfix_facts_window": ["nan?", hi]}}}
    cluster = cluster_from_data({"nodes": [{"name": "n1", "address": "10.0.0.1", "rank": 0}], "master": "n1"})
    assert hosts_from_vars(cluster, play, from_run=False)["n1"].window is None


def test_cli_dry_run_reports_the_pipelines_plan(sim: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`ddpfix remediate --only ID --format json` (dry run) on recorded facts: the play (check mode) stands in with
    one change per planned host; the report is the pipeline's (`Remediation.doc`), its hosts the plan's todo, the
    same the playbook's plan task returns."""
    import ddpfix.cli.remediate as remediate_cli
    from ddpfix import remediate as remediate_mod
    from ddpfix import schemas
    from ddpfix.remediate import Change

    sim = _faulty(sim)
    audited = _cli_audit(sim)
    played: list[list[str]] = []

    def play(ctx: Any, plans: dict[str, Any], **_: Any) -> tuple[RunResult, list[Change]]:
        played.append(sorted(plans))
        run = RunResult(status="successful", rc=0, stats={"changed": dict.fromkeys(plans, 1)}, hosts={},
                        run_dir=tmp_path, seconds=0.0)
        return run, [Change(h, f"Fix {hosts_rules.HOSTNAME_LOOPBACK.id} | /etc/hosts", "") for h in sorted(plans)]

    monkeypatch.setattr(remediate_cli, "inventory_of", lambda app: ("x.yml",))  # the audit's play reads it
    monkeypatch.setattr(pipeline, "run_audit", lambda cluster, **_: audited)
    monkeypatch.setattr(remediate_mod, "run_remediation", play)  # pipeline.apply imports it when it runs
    r = CliRunner().invoke(cli, ["remediate", "-i", "x.yml", "--only", FIXABLE, "--format", "json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    schemas.validate(doc)
    want = pipeline.plan(audited, only={FIXABLE}).todo
    assert played == [sorted(want)] and sorted(h for h, n in doc["changed"].items() if n) == sorted(want)
    assert doc["apply"] is False and doc["remaining_fixable"] is None and doc["exit_code"] == 1
    assert FIXABLE in {f["id"] for f in doc["findings"]}


@pytest.mark.parametrize("apply", [False, True])
def test_interrupted_remediate_says_whether_anything_was_changed(sim: Any, monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path, apply: bool) -> None:
    """A signal during the play: exit 6, and stderr names the changes as made (--apply) or as found by the dry run,
    which changed nothing (it said "the changes above were made" for check-mode changes too)."""
    import ddpfix.cli.remediate as remediate_cli
    from ddpfix import remediate as remediate_mod
    from ddpfix.remediate import Change

    audited = _cli_audit(_faulty(sim))

    def play(ctx: Any, plans: dict[str, Any], **_: Any) -> tuple[RunResult, list[Change]]:
        run = RunResult(status="failed", rc=1, stats={}, hosts={}, run_dir=tmp_path, seconds=0.0, interrupted=True)
        return run, [Change(h, f"Fix {FIXABLE} | /etc/hosts", "") for h in sorted(plans)]

    monkeypatch.setattr(remediate_cli, "inventory_of", lambda app: ("x.yml",))  # the audit's play reads it
    monkeypatch.setattr(pipeline, "run_audit", lambda cluster, **_: audited)
    monkeypatch.setattr(remediate_mod, "run_remediation", play)
    r = CliRunner().invoke(cli, ["remediate", "-i", "x.yml", "--only", FIXABLE, "--format", "json",
                                 *(["--apply"] if apply else [])])
    assert r.exit_code == 6, r.output
    last = r.stderr.splitlines()[-1]
    verb = "changed" if apply else "would change"
    assert all(ln.startswith(f"{verb} ") for ln in r.stderr.splitlines()[:-1]), r.stderr
    if apply:
        assert "the changes above were made" in last, last
    else:
        assert "nothing was changed (dry run)" in last and "were made" not in last, last
