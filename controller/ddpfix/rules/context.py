"""The audit context every check reads: the cluster, each node's validated facts and probe results, the plan,
and the small views of facts that several rule areas share. Pure data and functions, no I/O."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ddpfix.model import pyargv
from ddpfix.model.cluster import Cluster
from ddpfix.model.facts import NodeFacts, ProbeResult
from ddpfix.model.net import in_network

if TYPE_CHECKING:
    from ddpfix.plan import NodePlan


@dataclass
class Thresholds:
    max_offset_s: float = 0.1  # a node's own offset from its time source
    max_skew_s: float = 1.0  # between nodes
    peer_port_samples: int = 5  # points of the ephemeral range evaluated per peer source
    max_sources: int = 8  # peer source addresses evaluated per node's firewall
    firewall_budget_s: float = 10.0  # a node's whole firewall analysis; past it, its checks are not evaluated


@dataclass
class HostFacts:
    name: str
    reachable: bool = True
    error: str = ""
    #: not read because a module failed on the node (SSH worked): `error` is the module's own error
    failed: bool = False
    node: NodeFacts | None = None  # ansible_facts.ddpfix_node
    probe: ProbeResult | None = None  # ddpfix_probe result
    collected_at: float | None = None  # controller clock when the facts arrived (epoch seconds)
    # controller clock window (epoch seconds) within which the node read its clock: task start .. result
    window: tuple[float, float] | None = None
    #: the controller whose clock measured `window` / `collected_at` ("": this run's): the skew check compares offsets
    #: measured by one controller's clock only (saved facts of batches run on several controllers, ddpfix.factsdir)
    clock: str = ""


@dataclass
class Context:
    cluster: Cluster
    hosts: dict[str, HostFacts]
    thresholds: Thresholds = field(default_factory=Thresholds)
    #: socket interfaces chosen before, by the interface reach probe of an audit (check --local: the cluster file's)
    ifnames: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # CLI start: the guards and the plan load in the run's preload thread, while ansible-playbook starts
        from ddpfix.factguard.facts import guard_facts
        from ddpfix.factguard.reach import guard_reach
        from ddpfix.plan import derive_cidr, effective_cidr, plan_cluster
        from ddpfix.rolling import fold_rolling

        # a rolling probe's dials to later nodes, from their listeners' records (forks below the nodes)
        self.hosts = fold_rolling(self.hosts)

        raw = {n: (h.node if h.reachable else None) for n, h in self.hosts.items()}
        #: invalid values each read node returned: {host: [(fact, value, why)]}; `facts` has them removed
        checked = {n: guard_facts(f) for n, f in raw.items() if f}
        self.invalid: dict[str, list[tuple[str, str, str]]] = {n: p for n, (p, _) in checked.items() if p}
        self.facts: dict[str, NodeFacts | None] = {n: (checked[n][1] if n in checked else None) for n in raw}
        #: the interface reach probe of each node that ran one (probe.reach), validated like the facts
        self.reach: dict[str, dict[str, dict[str, Any]]] = {}
        for n, h in self.hosts.items():
            got = (h.probe or {}).get("reach") if h.reachable and self.facts.get(n) else None
            if got is None:
                continue
            problems, self.reach[n] = guard_reach(got)
            seen = self.invalid.get(n, [])  # the facts' own probe (folded there) was guarded already
            if new := [p for p in problems if p not in seen]:
                self.invalid[n] = [*seen, *new]
        self.cidr = effective_cidr(self.cluster, self.facts)
        if not self.cluster.cluster_cidr:  # a node's claim of the cluster network wider than the derived one
            for n, problem in derive_cidr(self.cluster, self.facts)[1].items():
                self.invalid[n] = [*self.invalid.get(n, []), problem]
        self.net = ipaddress.ip_network(self.cidr) if self.cidr else None
        self.plan: dict[str, NodePlan] = plan_cluster(self.cluster, self.facts, self.reach, self.ifnames)

        self._audited: list[tuple[str, NodeFacts]] = [
            (n.name, f) for n in self.cluster.nodes if (f := self.facts.get(n.name))
        ]
        #: sources a check could not analyse on a node (source -> why), e.g. a firewall past its time budget:
        #: listed by `unread` like the node's own unread sources, so the checks reading them are not evaluated
        self.unanalysed: dict[str, dict[str, str]] = {}
        self.by_address: dict[str, str] = {}
        for name, node_plan in self.plan.items():
            if node_plan.address:
                self.by_address.setdefault(node_plan.address, name)

    def audited(self) -> list[tuple[str, NodeFacts]]:
        """(name, facts) of every node that returned facts, in rank order (computed once)."""
        return self._audited

    def unread(self, name: str) -> dict[str, str]:
        """source -> reason for every fact source that could not be read on `name` (empty: everything was read)."""
        return {**unread_of(self.facts.get(name)), **self.unanalysed.get(name, {})}

    def in_cidr(self, addr: str | None) -> bool:
        return in_network(addr, self.net)


def unread_of(facts: Mapping[str, Any] | None) -> dict[str, str]:
    """The node's unread fact sources (source -> reason), the firewall collector's included. No torch in ddp_python
    is one (the torch comparison is not evaluated there), with what to do as its reason (`no_torch`)."""
    out: dict[str, str] = {}
    if not facts:
        return out
    for u in list(facts.get("unread") or []) + list((facts.get("firewall") or {}).get("unread") or []):
        if isinstance(u, Mapping) and u.get("source"):
            out.setdefault(str(u["source"]), str(u.get("reason") or "not read"))
    if "torch" in out and torch_absent(facts):
        out["torch"] = no_torch(facts)
    return out


def torch_absent(facts: Mapping[str, Any] | None) -> bool:
    """ddp_python ran on the node and has no torch: the jobs' torch lives elsewhere (a container image, a venv
    ddp_python does not name), which is no fault of the host: its checks are not evaluated, and no finding says so."""
    t = (facts or {}).get("torch")
    return isinstance(t, Mapping) and t.get("absent") is True and not t.get("version")


def no_torch(facts: Mapping[str, Any]) -> str:
    python = ((facts.get("torch") or {}).get("python")) or pyargv.DEFAULT
    return (f"no torch in ddp_python ({pyargv.shown(python)}), not a host fault: set ddp_python to the interpreter "
            "the jobs run, a list for a container's, e.g. [docker, run, --rm, --network, host, IMAGE, python3] "
            "(docs/launch.md, \"Torch in containers\")")


def host_faults(facts: Mapping[str, Any] | None, unread: Mapping[str, str]) -> dict[str, str]:
    """`unread` without the sources whose absence is no fault of the node (torch not in ddp_python; "egress": an
    egress rule the firewall evaluator does not model, read but not decided)."""
    return {k: v for k, v in unread.items() if not (k == "torch" and torch_absent(facts)) and k != "egress"}


def cluster_if(actual: str | None) -> str:
    return f"cluster interface is {actual}" if actual else "no interface has an address in the cluster network"


def past(verdict: object) -> str:
    """A firewall verdict as a past participle: drop -> dropped, reject -> rejected."""
    v = str(verdict or "blocked").lower()
    return {"drop": "dropped", "reject": "rejected", "deny": "denied", "block": "blocked"}.get(v, f"{v}ed")


def iface_named(facts: Mapping[str, Any], name: str | None) -> dict[str, Any] | None:
    for i in facts.get("interfaces") or []:
        if i.get("name") == name:
            return cast(dict[str, Any], i)
    return None


def hosts_lines(facts: Mapping[str, Any], name: str) -> str:
    lines = [e["text"] for e in facts.get("hosts_file") or [] if name in e.get("names", [])]
    return "; ".join(f"/etc/hosts: {ln.strip()}" for ln in lines) or "no /etc/hosts line (resolved through NSS/DNS)"


def not_read(ctx: Context, names: Iterable[str]) -> str:
    """Nodes that were not read, each with why: 'node2 unreachable, node3 not read (its module failed)'."""
    return ", ".join(f"{n} {'not read (its module failed)' if (h := ctx.hosts.get(n)) and h.failed else 'unreachable'}"
                     for n in names)


#: fact sources (`unread[].source` of the node's facts) the rules read
SRC_HOSTS, SRC_IFACES, SRC_ENV = frozenset({"hosts_file"}), frozenset({"interfaces"}), frozenset({"env_file"})
SRC_FABRIC = frozenset({"fabric"})
#: the node's probe (its connects to the master port and its peers): unread when the audit asked for probes and
#: none ran on a node that has a cluster address (ddpfix.audit.unprobed)
SRC_PROBE = frozenset({"probe"})
