"""The scenario registry: Scenario, Expect, the `scenario` decorator that registers one, the victim helpers
every area uses, and `clean`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddpfix.errors import ExitCode
from ddpfix.lab.model import LabError, LabPlan, NodePlan

if TYPE_CHECKING:
    from ddpfix.lab.model import LabInfo




@dataclass(frozen=True)
class Expect:
    """What `ddpfix audit` must report on a 3-node lab built with this scenario (asserted by
    tests/lab/test_audit_lab.py, which audits every scenario that declares its expectations in one shared lab)."""

    id: str  # finding id
    host: str | None  # inventory name (node1..node3); None: cluster-wide
    evidence: Callable[[LabInfo], list[str]]  # substrings the finding's evidence must contain, from the lab's facts


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str  # one line, for `lab up --help`
    findings: tuple[str, ...]  # audit finding ids the scenario must produce
    min_nodes: int
    apply: Callable[[LabPlan], None]
    expect: tuple[Expect, ...] = ()

    @property
    def doc(self) -> str:
        return (self.apply.__doc__ or "").strip()


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str, summary: str, findings: tuple[str, ...] = (), min_nodes: int = 1, expect: tuple[Expect, ...] = ()
) -> Callable[[Callable[[LabPlan], None]], Callable[[LabPlan], None]]:
    def deco(fn: Callable[[LabPlan], None]) -> Callable[[LabPlan], None]:
        ids = findings or tuple(dict.fromkeys(e.id for e in expect))
        SCENARIOS[name] = Scenario(name, summary, ids, min_nodes, fn, expect)
        return fn

    return deco


def parse_scenarios(text: str | None, nodes: int) -> list[str]:
    names = [s.strip() for s in (text or "clean").split(",") if s.strip()] or ["clean"]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        raise LabError(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", ExitCode.INVALID_INPUT)
    for s in names:
        if nodes < SCENARIOS[s].min_nodes:
            raise LabError(f"scenario {s} needs at least {SCENARIOS[s].min_nodes} nodes", ExitCode.INVALID_INPUT)
    seen: list[str] = []
    for s in names:
        if s not in seen:
            seen.append(s)
    return seen


def last(plan: LabPlan) -> NodePlan:
    """The highest-address node."""
    return plan.nodes[-1]


def second(plan: LabPlan) -> NodePlan:
    """node2, or node1 in a one-node lab."""
    return plan.nodes[1] if len(plan.nodes) > 1 else plan.nodes[0]


def unused_ifname(node: NodePlan, *candidates: str) -> str:
    taken = {node.ifname, *(x.ifname for x in node.extra_nics)}
    for c in candidates:
        if c not in taken:
            return c
    raise LabError(f"no free interface name on {node.name}", ExitCode.INVALID_INPUT)


def set_env_everywhere(plan: LabPlan, **override: str) -> None:
    for n in plan.nodes:
        n.env = plan.env_for(n, **override)




@scenario("clean", "no fault: every node resolves every peer, chrony syncs to node1, no firewall, no env file")
def _clean(plan: LabPlan) -> None:
    """No fault. Every node's /etc/hosts maps every node's hostname to its lab address (the own
    name is not on 127.0.1.1), chronyd runs everywhere (node1 serves `local stratum 8` to the
    subnet, the others sync to it with `iburst`), no firewall rules, no env file. An audit must
    report nothing at warning or above (only the missing env file, info)."""


def help_text() -> str:
    width = max(len(s) for s in SCENARIOS)
    return "\n".join(f"{s.name.ljust(width)}  {s.summary}" for s in SCENARIOS.values())
