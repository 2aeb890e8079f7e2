"""Every rule on recorded facts, no host needed: each rule's audit inputs, `<id>/{fail,pass}*`: those derived from
small deltas on the recorded clean cluster, built here at test time (rule_inputs.py: the mutations of test_checks.py
and the declarative cases of tests/unit/fixtures/rules/<id>.json), and those recorded whole from a lab audit
(tests/fixtures/rules/<id>/*.json, record_lab.py).

A fixture is one audit's input (the inventory, each node's facts and probe result or the runner's result for a node
that was not read) and what the audit must find: `expect.id` on `expect.host` (null: cluster-wide) with the evidence
substrings (fail), or `expect.id` nowhere (pass, `absent`); a fixture recorded from a real audit (record_lab.py) also
keeps every (id, host) that audit reported, and the replay must report exactly those. The Context is built as the CLI builds it: the cluster from
the inventory data, each node through the audit's conversion of what the runner returned.
rule_inputs.py builds the derived ones; see its docstring.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import rule_inputs
from unit_helpers import ROOT

from ddpfix.ansible.results import HostResult, record_event
from ddpfix.audit import host_facts, host_facts_of
from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.model.finding import Finding
from ddpfix.rules.context import Context, HostFacts, Thresholds
from ddpfix.rules.engine import run_checks
from ddpfix.rules.registry import RULES

FIXTURES = ROOT / "tests" / "fixtures" / "rules"
#: "<id>/<name>": the recorded inputs' files, and the derived inputs (built once per test session)
RECORDED = {f"{p.parent.name}/{p.stem}": p for p in sorted(FIXTURES.glob("*/*.json"))}
BUILT = rule_inputs.build()
INPUTS = sorted({*RECORDED, *BUILT})
#: the task and module of the facts play, as the runner's events name them
FACTS_TASK = {"task": "Facts | read the node", "resolved_action": "ddpfix.cluster.ddpfix_node_facts"}
#: rules without a failing or a passing fixture, each with the reason (none today)
NO_FIXTURE: dict[str, str] = {}


def load(key: str) -> dict[str, Any]:
    if key in BUILT:
        return copy.deepcopy(BUILT[key])  # each test its own, as a file read would give it
    doc: dict[str, Any] = json.loads(RECORDED[key].read_text())
    return doc


def node_result(name: str, got: dict[str, Any]) -> HostFacts:
    """One node's HostFacts from its recorded result, through the CLI's conversion."""
    if "facts" in got:
        window = got.get("window")
        return host_facts(name, got["facts"], probe=got.get("probe"), collected_at=got.get("collected_at"),
                          window=(float(window[0]), float(window[1])) if window else None)
    kind = "runner_on_unreachable" if "unreachable" in got else "runner_on_failed"
    results: dict[str, HostResult] = {}
    record_event(results, {"event": kind, "event_data": {"host": name, **FACTS_TASK,
                                                         "res": got.get("unreachable") or got.get("failed")}})
    return host_facts_of(results[name])


def context(doc: dict[str, Any]) -> Context:
    cluster = cluster_from_inventory_data(doc["inventory"])
    hosts = {name: node_result(name, got) for name, got in doc["hosts"].items()}
    return Context(cluster, hosts, Thresholds(**(doc.get("thresholds") or {})))


def rendered_as_a_person_wrote_it(f: Finding) -> None:
    """Real values, no placeholders, no None, a fully rendered fix."""
    assert f.message and f.fix and "{" not in f.fix, f
    text = f"{f.message} {f.evidence} {f.fix}"
    assert not re.search(r"\bNone\b|droped|\b(IF|NAME)\b|=N\b|<unset>\)", text.replace("-i INVENTORY", "")), text
    json.dumps(f.to_json())


@pytest.mark.parametrize("key", INPUTS)
def test_rule_fixture(key: str) -> None:
    doc = load(key)
    expect = doc["expect"]
    fid = expect["id"]
    findings = run_checks(context(doc))
    if "recorded_findings" in doc:  # recorded from a real audit: the replay finds what the CLI found
        assert sorted([f.id, f.host] for f in findings) == doc["recorded_findings"]
    found = [f for f in findings if f.id == fid]
    if expect.get("absent"):
        assert found == [], f"{doc['about']}: {[(f.host, f.evidence) for f in found]}"
        return
    on_host = [f for f in found if f.host == expect["host"]]
    assert on_host, f"{doc['about']}: {fid} reported on {[f.host for f in found]}, expected {expect['host']}"
    assert all(all(e in f.evidence for e in expect.get("evidence") or [])
               and all(x in f.fix for x in expect.get("fix") or []) for f in on_host), \
        f"evidence lacks {expect.get('evidence')} or fix lacks {expect.get('fix')}: {[(f.evidence, f.fix) for f in on_host]}"
    for f in found:
        rendered_as_a_person_wrote_it(f)


def test_every_fixture_names_its_rule_and_a_source() -> None:
    assert not set(RECORDED) & set(BUILT), "a recorded input and a derived one share a name"
    for key in INPUTS:
        doc = load(key)
        fid, _, name = key.partition("/")
        assert fid in RULES, f"{key}: no rule {fid!r} in the registry"
        assert doc["expect"]["id"] == fid, key
        assert name.startswith("pass" if doc["expect"].get("absent") else "fail"), key
        assert doc.get("SOURCE") and doc.get("inventory") and doc.get("hosts"), f"{key}: SOURCE, inventory, hosts"


def test_every_rule_has_a_failing_and_a_passing_fixture() -> None:
    missing = []
    for fid in sorted(set(RULES) - set(NO_FIXTURE)):
        kinds = {k.partition("/")[2].split("-")[0] for k in INPUTS if k.partition("/")[0] == fid}
        missing += [f"{fid}: no {k} fixture" for k in ("fail", "pass") if k not in kinds]
    assert missing == []
    assert set(NO_FIXTURE) <= set(RULES), sorted(set(NO_FIXTURE) - set(RULES))
