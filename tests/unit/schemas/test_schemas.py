"""The JSON Schemas shipped in controller/ddpfix/schemas/ describe what the CLI really writes: every schema id the code
emits has a schema file, and real documents (recorded, and produced by the CLI on recorded facts) validate."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from click.testing import CliRunner
from unit_helpers import FIXTURES, ROOT

from ddpfix import clusterfile, report, schemas
from ddpfix.cli import cli
from ddpfix.verify import endstate, nccl

jsonschema = pytest.importorskip("jsonschema")



def validate(doc: Any) -> None:
    """Validate `doc` against the schema its own `schema` key names."""
    schemas.validate(doc)


def test_every_schema_file_is_a_valid_schema_named_by_its_id() -> None:
    assert schemas.ids() == sorted(["ddpfix.cluster/v1", "ddpfix.env/v1", "ddpfix.explain/v1", "ddpfix.facts/v1",
                                    "ddpfix.report/v1", "ddpfix.verify/v1"])
    for sid in schemas.ids():
        s = schemas.load(sid)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["properties"]["schema"] == {"const": sid}
        assert s["$id"].endswith("/" + schemas.path(sid).name)


def test_every_schema_id_in_the_code_has_a_file() -> None:
    emitted = set()
    for p in (ROOT / "controller" / "ddpfix").rglob("*.py"):
        emitted |= set(re.findall(r'"(ddpfix\.[a-z]+/v\d+)"', p.read_text()))
    emitted.discard("ddpfix.firewall/v1")  # none: node facts inside ddpfix_node, not a document the CLI writes
    assert emitted <= set(schemas.ids()), emitted - set(schemas.ids())
    assert {report.SCHEMA, endstate.SCHEMA, clusterfile.SCHEMA} <= set(schemas.ids())


def test_recorded_lab_report_validates() -> None:
    validate(json.loads((FIXTURES / "reports" / "multi-fault.json").read_text()))


def test_schema_rejects_a_wrong_document() -> None:
    doc = json.loads((FIXTURES / "reports" / "multi-fault.json").read_text())
    doc["findings"][0]["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)
    del doc["summary"]
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def _audit_on(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpfix.audit
    import ddpfix.cli.audit as audit_cli

    monkeypatch.setattr(ddpfix.audit, "collect", lambda cluster, **_: (sim.context(), None))
    monkeypatch.setattr(audit_cli, "inventory_of", lambda app: ("x.yml",))


def test_audit_json_validates(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sim.set_hosts_file("node2", "127.0.1.1\tnode2\n127.0.0.1\tlocalhost\n")
    sim.set_unreachable("node3", "ssh: connect to host node3 port 22: Connection refused")
    _audit_on(sim, monkeypatch)
    r = CliRunner().invoke(cli, ["audit", "-i", "x.yml", "--format", "json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["findings"] and doc["hosts"]["node3"]["reachable"] is False
    validate(doc)


def test_verify_json_validates(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpfix.cli.verify as verify_cli
    from ddpfix.audit import AuditResult
    from ddpfix.rules.engine import run_checks

    ctx = sim.context()
    monkeypatch.setattr(verify_cli, "inventory_of", lambda app: ("x.yml",))  # the audit's play reads it
    monkeypatch.setattr(verify_cli.pipeline, "run_audit",
                        lambda cluster, **_: AuditResult(sim.cluster(), ctx, run_checks(ctx), None))
    monkeypatch.setattr(endstate, "testinfra_checks", lambda c, f: [  # pipeline.verify imports it when it runs
        endstate.chrony_check(n, facts, c.thresholds.max_offset_s) for n, facts in c.audited()])
    r = CliRunner().invoke(cli, ["verify", "-i", "x.yml", "--format", "json"])
    doc = json.loads(r.stdout)
    assert doc["schema"] == "ddpfix.verify/v1" and doc["checks"], r.output
    validate(doc)
    nccl_doc = {"gang": [nccl.nccl_entry("node1", {"rc": 1, "stdout": "", "stderr": "Cuda is not available"},
                                           False, None)], "pairs": None}
    torch = [{"host": "node1", "ok": False, "error": "x", "cause": "y"}]
    validate(endstate.document(sim.cluster(), False, [], torch, nccl_doc))


def test_explain_json_validates() -> None:
    for log in sorted((FIXTURES / "logs").glob("*.log"))[:6]:
        r = CliRunner().invoke(cli, ["explain", str(log), "--format", "json"])
        validate(json.loads(r.stdout))


def test_cluster_file_validates(sim: Any) -> None:
    validate(clusterfile.build(sim.context()))


def test_schemas_ship_in_the_wheel() -> None:
    """hatch packages controller/ddpfix whole: the schema files are package data next to the code."""
    cfg = (ROOT / "pyproject.toml").read_text()
    assert 'packages = ["controller/ddpfix"]' in cfg
    assert schemas.HERE == ROOT / "controller" / "ddpfix" / "schemas" or schemas.path("ddpfix.report/v1").is_file()


def test_env_json_validates(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpfix.cli.env as env_cli

    monkeypatch.setattr(env_cli, "cluster_of", lambda app: sim.cluster())
    monkeypatch.setattr(env_cli.pipeline, "collect", lambda cluster, **_: (sim.context(), None))
    r = CliRunner().invoke(cli, ["env", "-i", "x.yml", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc["files"]) == set(sim.docs)
    validate(doc)
