"""`ddpfix explain` on real error logs recorded with torch 2.13 (fixtures/logs/record.py) and sourced NCCL excerpts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from unit_helpers import FIXTURES

from ddpfix.cli import cli
from ddpfix.diagnose.match import diagnose
from ddpfix.diagnose.patterns import PATTERNS
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules.registry import RULES

LOGS = FIXTURES / "logs"

EXPECTED = {
    "torchrun-master-unreachable.log": "master-unreachable",
    "torchrun-address-in-use.log": "address-in-use",
    "torchrun-rendezvous-timeout.log": "rendezvous-timeout",
    "gloo-ifname-missing.log": "socket-ifname-missing",
    "gloo-hostname-loopback.log": "loopback-advertised",
    "gloo-peer-port-blocked.log": "gloo-peer-connect",
    "gloo-peer-crashed.log": "connection-reset",
    "env-world-size-mismatch.log": "ranks-missing",
    "nccl-socket-ifname-wrong.log": "socket-ifname-missing",
    "nccl-ib-completion-error.log": "nccl-ib",
}


@pytest.mark.parametrize("log,key", sorted(EXPECTED.items()))
def test_each_recorded_log_is_named(log: str, key: str) -> None:
    got = [d.pattern.key for d in diagnose((LOGS / log).read_text().splitlines())]
    assert got == [key], got


def test_every_recorded_log_is_listed() -> None:
    # the other patterns are recorded in the field corpus (test_explain_field.py: two wordings each)
    assert {p.name for p in LOGS.glob("*.log")} == set(EXPECTED) | {"unknown-error.log"}


def test_pattern_finding_ids_exist() -> None:
    for p in PATTERNS:
        assert set(p.finding_ids) <= set(RULES), p.key


def test_details_carry_the_values() -> None:
    d = diagnose((LOGS / "torchrun-master-unreachable.log").read_text().splitlines())[0]
    assert d.detail == ("127.0.0.1", "29911")
    d = diagnose((LOGS / "gloo-ifname-missing.log").read_text().splitlines())[0]
    assert d.detail == ("nosuch0",)


def test_loopback_explains_the_failed_mesh_connect() -> None:
    # the same log also has "connectFullMesh failed ... Connection refused": reported once, under its cause
    text = (LOGS / "gloo-hostname-loopback.log").read_text()
    assert "connectFullMesh failed" in text
    assert [d.pattern.key for d in diagnose(text.splitlines())] == ["loopback-advertised"]


def test_cli_text_names_failure_ids_and_audit_command() -> None:
    r = CliRunner().invoke(cli, ["explain", str(LOGS / "gloo-peer-port-blocked.log")])
    assert r.exit_code == 0, r.output
    assert "gloo-peer-connect" in r.output and firewall_rules.PEER_PORTS_BLOCKED.id in r.output
    assert "run: ddpfix audit -i INV" in r.output


def test_cli_stdin_json_and_fallback() -> None:
    r = CliRunner().invoke(cli, ["explain", "-", "--format", "json"],
                           input=(LOGS / "torchrun-address-in-use.log").read_text())
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["schema"] == "ddpfix.explain/v1" and doc["known"]
    assert doc["failures"][0]["key"] == "address-in-use"
    assert probes_rules.PORT_IN_USE.id in doc["failures"][0]["finding_ids"]
    r = CliRunner().invoke(cli, ["explain", str(LOGS / "unknown-error.log"), "--format", "json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and not doc["known"] and "No host check applies" in doc["advice"]
    assert doc["events"]["job_first"]  # a shape error in the training code: the job's own failure
    r = CliRunner().invoke(cli, ["explain", "-", "--format", "json"], input="something odd happened\n")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and not doc["known"] and "NCCL_DEBUG=INFO" in doc["advice"]
    r = CliRunner().invoke(cli, ["explain", "-"], input="something odd happened\n")
    assert "no known failure" in r.output
