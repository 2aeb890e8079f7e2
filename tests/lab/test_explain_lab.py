"""`ddpfix explain -i INV` on real lab hosts: the audit runs and names the cause the log points at."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpfix.cli import cli

pytestmark = pytest.mark.lab

LOGS = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "logs"


def test_explain_with_inventory_confirms_the_cause(lab_factory) -> None:
    info = lab_factory(nodes=3, scenario="iptables-worker2", wait_sync=False)
    r = CliRunner().invoke(cli, ["-i", str(info.inventory), "explain", str(LOGS / "gloo-peer-port-blocked.log")])
    assert r.exit_code == 1, r.output
    assert "the audit found:" in r.output
    assert "firewall.peer-ports-blocked on node2" in r.output
    # a log whose causes the audit does not find: said so, exit 0
    r = CliRunner().invoke(cli, ["-i", str(info.inventory), "explain", str(LOGS / "torchrun-address-in-use.log")])
    assert r.exit_code == 0, r.output
    assert "the audit found none of these causes" in r.output
