"""Lab scenarios: a clean cluster, or one with a real fault that ddpfix detects (README, "Findings").

Each scenario edits the `LabPlan` before anything is created (interfaces, /etc files, env files,
inventory variables, which daemons run) and may add runtime tasks that run once every node's
sshd is up (start firewalld, load iptables rules, start a listener, ...). Scenarios combine
(`--scenario a,b`); each one picks its victim nodes deterministically, as its docstring says.
When two combined scenarios edit the same thing on the same node (e.g. both write env files),
the later one in the list wins.

Nodes are `node1..nodeN` with addresses `.11 .. .(10+N)`: node1 is the master (rank 0) and the
lowest address, `nodeN` the highest address. In torch's Gloo transport, of each pair of nodes the
one with the higher address dials the lower one, so a fault on `nodeN` that only affects incoming
connections is not hit by an all-reduce although it is a real fault; `iptables-worker2` puts the
same firewall on node2 for that reason.

One module per area registers its scenarios (`registry.scenario`); importing this package imports every area, so
`SCENARIOS` holds them all: `clean` first, then each area's in the order of `AREAS` (the order `lab up --help` and
the README list them).
"""

from __future__ import annotations

from ddpfix.lab.scenarios import clock, fabric, firewall, host, hosts, netif, sites
from ddpfix.lab.scenarios.registry import SCENARIOS, Expect, Scenario, help_text, parse_scenarios

#: the area modules, in the order their scenarios are listed
AREAS = (firewall, hosts, netif, clock, host, sites, fabric)


def _area_order() -> None:
    rank = {m.__name__: i for i, m in enumerate(AREAS)}
    ordered = sorted(SCENARIOS.values(), key=lambda s: rank.get(s.apply.__module__, -1))  # stable; clean first
    SCENARIOS.clear()
    SCENARIOS.update((s.name, s) for s in ordered)


_area_order()

__all__ = ["AREAS", "SCENARIOS", "Expect", "Scenario", "help_text", "parse_scenarios"]
