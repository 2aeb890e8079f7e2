"""apply_fabric's contract, without a lab: every fabric scenario differs from `clean` only in what it redoes in place."""

from __future__ import annotations

import pytest

from ddpfix.lab.model import LabError
from ddpfix.lab.scenarios.inplace import fabric_plan
from ddpfix.lab.scenarios.registry import SCENARIOS

FABRIC = [s for s in SCENARIOS if s.startswith("fabric-")]


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("scenario", FABRIC)
def test_fabric_scenario_changes_only_files_and_variables(scenario: str, nodes: int) -> None:
    plan = fabric_plan("t1", nodes, scenario, "192.168.91.0/24", ["eth0"])
    assert all(n.tasks for n in plan.nodes)  # the tree is written by a task on every node
    assert all(n.hostvars["ddpfix_facts_sysfs_root"] == "/run/ddpfix-lab-fabric/sys" for n in plan.nodes)


@pytest.mark.parametrize("scenario", ["hostname-loopback", "mtu-mismatch", "iptables-worker2"])
def test_other_scenarios_are_refused(scenario: str) -> None:
    with pytest.raises(LabError, match="not a fabric scenario"):
        fabric_plan("t1", 3, scenario, "192.168.91.0/24", ["eth0"])


def test_a_fabric_named_scenario_that_changes_more_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    real = SCENARIOS["fabric-port-down"]

    def more(plan):  # type: ignore[no-untyped-def]
        real.apply(plan)
        plan.nodes[1].mtu = 1400

    monkeypatch.setitem(SCENARIOS, "fabric-port-down", replace(real, apply=more))
    with pytest.raises(LabError, match="changes more than files and variables"):
        fabric_plan("t1", 2, "fabric-port-down", "192.168.91.0/24", ["eth0"])
