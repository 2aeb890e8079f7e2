"""Planning a lab (pure: creates nothing): nodes, addresses, interface names, the scenarios applied to the plan, and
the text of the files a node starts with."""

from __future__ import annotations

from collections.abc import Sequence

from ddpfix.errors import ExitCode
from ddpfix.lab import scenarios as _scn
from ddpfix.lab.model import (
    DEFAULT_NAME,
    DEFAULT_NODES,
    DEFAULT_SUBNET,
    MAX_NODES,
    LabError,
    LabPlan,
    NodePlan,
    netns_name,
    parse_subnet,
    validate_ifname,
    validate_name,
)


def plan_lab(name: str = DEFAULT_NAME, nodes: int = DEFAULT_NODES, scenario: str | Sequence[str] | None = None,
             subnet: str = DEFAULT_SUBNET, ifnames: str | Sequence[str] | None = None) -> LabPlan:
    """Validate the options and build the plan (pure: creates nothing)."""
    validate_name(name)
    if not 1 <= nodes <= MAX_NODES:
        raise LabError(f"--nodes must be between 1 and {MAX_NODES}", ExitCode.INVALID_INPUT)
    net = parse_subnet(subnet)
    if isinstance(scenario, str) or scenario is None:
        names = _scn.parse_scenarios(scenario, nodes)
    else:
        names = _scn.parse_scenarios(",".join(scenario), nodes)
    ifs = [x.strip() for x in ifnames.split(",") if x.strip()] if isinstance(ifnames, str) else list(ifnames or [])
    ifs = [validate_ifname(x) for x in ifs] or ["eth0"]
    plan = LabPlan(name=name, subnet=net, nodes=[], scenarios=names)
    if net.network_address + 10 + 2 * nodes + 1 >= plan.gateway:
        raise LabError(f"subnet {net} is too small for {nodes} nodes", ExitCode.INVALID_INPUT)
    for i in range(1, nodes + 1):
        node = f"node{i}"
        plan.nodes.append(
            NodePlan(
                name=node,
                index=i,
                hostname=node,
                address=net.network_address + 10 + i,
                ifname=ifs[(i - 1) % len(ifs)],
                netns=netns_name(name, node),
                chrony="master" if i == 1 else "client",
            )
        )
    base = [
        ("127.0.0.1", ["localhost"]),
        ("::1", ["localhost", "ip6-localhost", "ip6-loopback"]),
        ("ff02::1", ["ip6-allnodes"]),
        ("ff02::2", ["ip6-allrouters"]),
    ]
    for n in plan.nodes:
        n.hosts = [(a, list(h)) for a, h in base] + [(str(m.address), [m.hostname]) for m in plan.nodes]
    for s in names:
        _scn.SCENARIOS[s].apply(plan)
    return plan


def hosts_text(node: NodePlan) -> str:
    lines = ["# /etc/hosts of a ddpfix lab node"]
    lines += [f"{addr}\t{' '.join(names)}" for addr, names in node.hosts]
    return "\n".join(lines) + "\n"


def env_text(env: dict[str, str]) -> str:
    return "# written by hand, long ago (ddpfix lab scenario)\n" + "".join(f"{k}={v}\n" for k, v in env.items())
