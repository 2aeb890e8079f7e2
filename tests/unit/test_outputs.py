"""Outputs that their consumers accept: JUnit against fixtures/junit/strict-junit.xsd (written for these tests: what
the Jenkins xunit plugin's JUnit type and Ant's JUnit report format require, see its header), Prometheus textfiles
through prometheus_client's parser, and -o.

The report is the recorded multi-fault audit (fixtures/reports/multi-fault.json), plus findings that share a check
and a host, a check not evaluated, an unreachable host and an accepted finding.
"""

from __future__ import annotations

import copy
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import click
import pytest
import xmlschema
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from ddpfix.app import Application
from ddpfix.cli import cli
from ddpfix.cli.common import emit
from ddpfix.formats import output_format
from ddpfix.render import render_junit, render_prometheus
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import time as time_rules

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA = xmlschema.XMLSchema(str(FIXTURES / "junit" / "strict-junit.xsd"))
BASE: dict[str, Any] = json.loads((FIXTURES / "reports" / "multi-fault.json").read_text())


def _doc(command: str = "audit", exit_code: int = 1) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["command"] = command
    doc["exit_code"] = exit_code
    doc["duration_s"] = 12.345
    # two findings of one check on one host (per peer): one testcase, one failure, two series never
    doc["findings"] += [
        {"id": hosts_rules.PEER_UNRESOLVABLE.id, "severity": "error", "host": "node3", "message": f"peer {p} unresolvable",
         "evidence": f"getent hosts {p}: no address", "fix": "ddpfix remediate", "fixable": True, "caused_by": None}
        for p in ("node1", "node2")]
    doc["hosts"]["node2"]["not_evaluated"] = [{"id": time_rules.UNSYNCHRONIZED.id, "reason": "chronyc not readable"}]
    doc["skipped"] = [{"id": time_rules.SKEW.id, "host": None, "message": "clocks differ", "severity": "warning"}]
    return doc


def test_junit_validates_against_the_strict_schema() -> None:
    xml = render_junit(_doc())
    errors = [f"{e.path}: {e.reason}" for e in SCHEMA.iter_errors(xml)]
    assert errors == []


def test_the_schemas_reject_what_strict_consumers_reject() -> None:
    """The schema does refuse the old report's faults: no errors count (Jenkins), two failures in one testcase and
    no times (Ant)."""
    root = ET.fromstring(render_junit(_doc()))
    suite = root.find("testsuite")
    assert suite is not None
    del suite.attrib["errors"]
    assert not SCHEMA.is_valid(ET.tostring(root, encoding="unicode"))
    root = ET.fromstring(render_junit(_doc()))
    case = root.find("testsuite/testcase[failure]")
    assert case is not None
    case.append(ET.Element("failure", type="error"))
    assert not SCHEMA.is_valid(ET.tostring(root, encoding="unicode"))
    root = ET.fromstring(render_junit(_doc()))
    for c in root.iter("testcase"):
        del c.attrib["time"]
    assert not SCHEMA.is_valid(ET.tostring(root, encoding="unicode"))


def test_junit_one_failure_per_testcase_times_and_timestamp() -> None:
    doc = _doc()
    suite = ET.fromstring(render_junit(doc)).find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert all(len(c.findall("failure")) <= 1 for c in cases)
    assert all(c.get("time") == "0.000" for c in cases)
    assert suite.get("time") == "12.345" and suite.get("timestamp") == doc["generated_at"].rstrip("Z")
    assert suite.get("hostname") and suite.get("errors") == "0"
    both = next(c for c in cases if (c.get("classname"), c.get("name")) == (hosts_rules.PEER_UNRESOLVABLE.id, "node3"))
    failure = both.find("failure")
    assert failure is not None and failure.get("message", "").startswith("2 findings: peer node1 unresolvable")
    assert "getent hosts node1" in (failure.text or "") and "getent hosts node2" in (failure.text or "")
    failed = {(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None}
    assert int(suite.get("failures", "-1")) == len(failed) == len({(f["id"], f["host"] or "cluster")
                                                                  for f in doc["findings"]})
    blind = next(c for c in cases if (c.get("classname"), c.get("name")) == (time_rules.UNSYNCHRONIZED.id, "node2"))
    skipped = blind.find("skipped")
    assert skipped is not None and "not a pass" in skipped.get("message", "")


def _series(text: str) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    return [(s.name, tuple(sorted(s.labels.items()))) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


def test_prometheus_series_unique_labelled_by_command_and_counting_every_finding() -> None:
    doc = _doc()
    text = render_prometheus(doc)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    series = _series(text)
    assert len(series) == len(set(series))
    assert all(dict(labels).get("command") == "audit" for _, labels in series)
    findings = fams["ddpfix_finding"].samples
    assert sum(s.value for s in findings) == len(doc["findings"])  # 20: nothing collapses
    assert {s.value for s in findings if (s.labels["id"], s.labels["host"]) == (hosts_rules.PEER_UNRESOLVABLE.id,
                                                                              "node3")} == {2}
    assert fams["ddpfix_last_run_success"].samples[0].value == 0
    assert fams["ddpfix_run_duration_seconds"].samples[0].value == 12.345
    assert fams["ddpfix_audit_timestamp_seconds"].samples[0].value == doc["generated_at_unix"]
    assert "ddpfix_remediate_timestamp_seconds" not in fams
    ok = {f.name: f for f in text_string_to_metric_families(render_prometheus(_doc(exit_code=0)))}
    assert ok["ddpfix_last_run_success"].samples[0].value == 1


def test_prometheus_audit_and_remediate_textfiles_side_by_side_never_repeat_a_series() -> None:
    audit, remediate = render_prometheus(_doc("audit")), render_prometheus(_doc("remediate", 0))
    a, r = set(_series(audit)), set(_series(remediate))
    assert a and r and not a & r
    rem = {f.name for f in text_string_to_metric_families(remediate)}
    assert "ddpfix_remediate_timestamp_seconds" in rem and "ddpfix_audit_timestamp_seconds" not in rem
    # node_exporter merges families of all textfiles: the same name must carry the same HELP in each file
    helps = [{f.name: f.documentation for f in text_string_to_metric_families(t)} for t in (audit, remediate)]
    assert all(helps[0][n] == helps[1][n] for n in set(helps[0]) & set(helps[1]))


@pytest.mark.parametrize(("fmt", "output", "expected"), [
    ("text", "r.prom", "prometheus"), ("text", "r.xml", "junit"), ("table", "report", "json"),
    ("junit", "r.xml", "junit"), ("prometheus", "/var/lib/node_exporter/ddpfix.prom", "prometheus"),
    ("json", "r.log", "json"), ("html", "r.htm", "html"), ("plain", "r.txt", "plain"),
])
def test_output_format_by_extension_or_format(fmt: str, output: str, expected: str) -> None:
    assert output_format(fmt, output) == expected


@pytest.mark.parametrize(("fmt", "output", "said"), [
    ("plain", "x.prom", "the extension .prom means --format prometheus, not --format plain"),
    ("json", "x.html", "means --format html"),
    ("text", "json", "-o json: a format name, not a file: use --format json"),
    ("text", "xml", "use --format junit"),
    ("junit", "prometheus", "use --format prometheus"),
])
def test_output_contradictions_refused(fmt: str, output: str, said: str) -> None:
    with pytest.raises(ValueError, match=said.replace(".", r"\.")):
        output_format(fmt, output)


@pytest.mark.parametrize("args", [
    ["audit", "-i", "nonexistent.yml", "--format", "plain", "-o", "x.prom"],
    ["audit", "-i", "nonexistent.yml", "-o", "json"],
    ["remediate", "-i", "nonexistent.yml", "--apply", "--format", "junit", "-o", "x.html"],
])
def test_cli_refuses_a_contradicting_output_before_anything_runs(args: list[str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpfix: error: -o "), r.stderr  # -o's, before the inventory's
    assert list(tmp_path.iterdir()) == []


def test_output_dash_is_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    emit(_doc(), "junit", "-")
    assert ET.fromstring(capsys.readouterr().out).tag == "testsuites"
    emit(_doc(), "prometheus", "-", code=0)
    assert "ddpfix_last_run_success" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


def test_emit_records_exit_code_and_duration_in_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "audit.prom"
    doc = _doc()
    del doc["duration_s"]
    with click.Context(cli, obj=Application()):
        emit(doc, "text", str(target), "exit 1", code=1)
    fams = {f.name: f for f in text_string_to_metric_families(target.read_text())}
    assert fams["ddpfix_last_run_success"].samples[0].value == 0
    assert fams["ddpfix_run_duration_seconds"].samples[0].value >= 0
    assert capsys.readouterr().out.rstrip().endswith("exit 1")  # stdout: the text report


def test_fail_on_none_is_a_choice(tmp_path: Path) -> None:
    from ddpfix.audit import failing
    from ddpfix.rules.registry import finding

    assert failing([finding(time_rules.SKEW.id, None, "m", "e")], "none") == []
    r = CliRunner().invoke(cli, ["audit", "--fail-on", "none", "-i", str(tmp_path / "nonexistent.yml")])
    assert r.exit_code == 2 and "Invalid value" not in r.output and "nonexistent.yml" in r.output, r.output
    r = CliRunner().invoke(cli, ["audit", "--fail-on", "never", "-i", str(tmp_path / "nonexistent.yml")])
    assert r.exit_code == 2 and "--fail-on" in r.output
