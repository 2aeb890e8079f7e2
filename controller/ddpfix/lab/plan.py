"""Planning a lab (pure: creates nothing): nodes, addresses, interface names, the scenarios applied to the plan, and
the text of the files a node starts with."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

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
             subnet: str = DEFAULT_SUBNET, ifnames: str | Sequence[str] | None = None,
             pythons: str | Mapping[str, str] | None = None) -> LabPlan:
    """Validate the options and build the plan (pure: creates nothing). `pythons`: the nodes that run a pyenv build
    as ansible_python_interpreter, `{"node2": "3.8"}` or "node2=3.8,node3=3.9" (`--python`)."""
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
    for node, version in parse_pythons(pythons).items():
        if node not in {n.name for n in plan.nodes}:
            raise LabError(f"invalid --python {node}={version}: the lab has no node {node!r}", ExitCode.INVALID_INPUT)
        plan.node(node).python = version
    return plan


_PYTHON_RE = re.compile(r"^3\.[0-9]{1,2}(\.[0-9]{1,2})?$")


def parse_pythons(pythons: str | Mapping[str, str] | None) -> dict[str, str]:
    """`--python NODE=VERSION[,NODE=VERSION...]` (or a mapping) -> {node: version}; a version is 3.X or 3.X.Y."""
    if isinstance(pythons, str):
        items = [(k.strip(), v.strip()) for k, _, v in (p.partition("=") for p in pythons.split(",") if p.strip())]
    else:
        items = list((pythons or {}).items())
    out: dict[str, str] = {}
    for node, value in items:
        version = str(value)
        if not node or not _PYTHON_RE.match(version):
            raise LabError(f"invalid --python {node.strip()}={version}: use NODE=3.X or NODE=3.X.Y, e.g. node2=3.8",
                           ExitCode.INVALID_INPUT)
        out[node] = version
    return out


def hosts_text(node: NodePlan) -> str:
    lines = ["# /etc/hosts of a ddpfix lab node"]
    lines += [f"{addr}\t{' '.join(names)}" for addr, names in node.hosts]
    return "\n".join(lines) + "\n"


def env_text(env: dict[str, str]) -> str:
    return "# written by hand, long ago (ddpfix lab scenario)\n" + "".join(f"{k}={v}\n" for k, v in env.items())
