"""Reports and `ddpfix explain -i INV` on real lab hosts (one 3-node lab whose node2 rejects its ephemeral range)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddpfix.cli import cli
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import probes as probes_rules

pytestmark = pytest.mark.lab

LOGS = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "logs"


@pytest.fixture(scope="module")
def fw_lab(lab_factory):
    return lab_factory(nodes=3, scenario="iptables-worker2", wait_sync=False)


def test_explain_with_inventory_confirms_the_cause(fw_lab) -> None:
    r = CliRunner().invoke(cli, ["explain", str(LOGS / "gloo-peer-port-blocked.log"), "-i", str(fw_lab.inventory)])
    assert r.exit_code == 1, r.output
    assert "the audit found:" in r.output
    assert f"{firewall_rules.PEER_PORTS_BLOCKED.id} on node2" in r.output
    # a log whose causes the audit does not find: said so, exit 0
    r = CliRunner().invoke(cli, ["-i", str(fw_lab.inventory), "explain", str(LOGS / "torchrun-address-in-use.log")])
    assert r.exit_code == 0, r.output
    assert "the audit found none of these causes" in r.output


def test_report_outputs_matrix_and_skip(fw_lab, tmp_path) -> None:
    inv = str(fw_lab.inventory)
    html, prom = tmp_path / "report.html", tmp_path / "audit.prom"
    r = CliRunner().invoke(cli, ["audit", "-i", inv, "--matrix", "-o", str(html)])
    assert r.exit_code == 1, r.output
    out = r.stdout
    assert out.startswith("connectivity: 3 nodes")
    assert "node3 -> node2 (refused)" in out
    assert firewall_rules.PEER_PORTS_BLOCKED.id in out and f"explains: {probes_rules.PEER_UNREACHABLE.id} on node1, node3" in out
    assert out.rstrip().endswith("at or above warning")
    assert 'data-row="node3" data-col="node2" data-state="refused"' in html.read_text()
    r = CliRunner().invoke(cli, ["audit", "-i", inv, "--format", "prometheus", "-o", str(prom)])
    assert r.exit_code == 1, r.output
    text = prom.read_text()
    assert (f'ddpfix_finding{{command="audit",host="node2",id="{firewall_rules.PEER_PORTS_BLOCKED.id}",severity="error"}} 1.0'
            in text)
    assert 'ddpfix_last_run_success{command="audit"} 0.0' in text and "ddpfix_run_duration_seconds{" in text
    # accepted findings: --skip on the command line, ddp_skip_findings in the inventory; reported, not counted
    doc = yaml.safe_load(fw_lab.inventory.read_text())
    doc["all"]["children"]["ddp_nodes"]["vars"]["ddp_skip_findings"] = [probes_rules.PEER_UNREACHABLE.id]
    inv2 = tmp_path / "hosts.yml"
    inv2.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(cli, ["audit", "-i", str(inv2), "--skip", f"{firewall_rules.PEER_PORTS_BLOCKED.id}@node2",
                                 "--format", "json"])
    rep = json.loads(r.stdout)
    assert r.exit_code == 0, r.output
    assert rep["findings"] == [] or all(f["severity"] == "info" for f in rep["findings"])
    assert {(s["id"], s["host"]) for s in rep["skipped"]} >= {(firewall_rules.PEER_PORTS_BLOCKED.id, "node2"),
                                                             (probes_rules.PEER_UNREACHABLE.id, "node3")}
