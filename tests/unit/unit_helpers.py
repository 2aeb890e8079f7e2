"""Shared helpers for the host-free unit tests: role code loaded by path, and the recorded clean cluster.

Tests anywhere under tests/unit import it as `unit_helpers` (pyproject.toml's pytest `pythonpath` puts tests/unit on
sys.path; a name of its own, as tests/lab/helpers.py is `helpers` in the same session). tests/unit/conftest.py holds
the fixtures.

The clean 3-node cluster under fixtures/facts/clean3/ is derived from facts recorded on a real machine by
fixtures/facts/record.py (see its docstring); tests mutate a fresh deep copy of it, one realistic change each.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from ddpfix.ansible import collection
from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.model.cluster import Cluster
from ddpfix.model.finding import Finding, Severity
from ddpfix.rules.context import Context, HostFacts, Thresholds
from ddpfix.rules.engine import run_checks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURES = HERE / "fixtures"
FACTS = FIXTURES / "facts"
FIREWALL_FIXTURES = FIXTURES / "firewall"


def load_role_module(relpath: str, name: str) -> ModuleType:
    """A plugin of the ddpfix.cluster collection (`modules/NAME.py`, `module_utils/NAME.py`, `filter/NAME.py`),
    imported under Ansible's own name for it."""
    kind = relpath.split("/")[0]
    return {"modules": collection.module, "module_utils": collection.module_utils,
            "filter": collection.filter_plugin}[kind](name)


def nodeinfo() -> ModuleType:
    return load_role_module("module_utils/ddpfix_nodeinfo.py", "ddpfix_nodeinfo")


def envfile() -> ModuleType:
    return load_role_module("module_utils/ddpfix_envfile.py", "ddpfix_envfile")


def hosts_file_module() -> ModuleType:
    return load_role_module("modules/ddpfix_hosts_file.py", "ddpfix_hosts_file")


def probe_plan_module() -> ModuleType:
    return load_role_module("filter/ddpfix_probe_plan.py", "ddpfix_probe_plan")


def recorded(name: str) -> str:
    return (FACTS / "recorded" / name).read_text()


def firewall_fixture(name: str) -> str:
    return (FIREWALL_FIXTURES / name).read_text()


class Sim:
    """A mutable copy of the recorded clean cluster: the facts each host returned, plus the inventory."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        for p in sorted((FACTS / "clean3").glob("node*.json")):
            doc = json.loads(p.read_text())
            self.docs[doc["name"]] = doc
        self.inventory: dict[str, Any] = json.loads((FACTS / "clean3" / "inventory.json").read_text())
        self.unreachable: dict[str, str] = {}
        self.module_failed: dict[str, dict[str, Any]] = {}  # host -> the facts task's failed result (event res)

    # ---------------------------------------------------------------- mutation helpers
    def node(self, name: str) -> dict[str, Any]:
        return self.docs[name]["node"]

    def probe(self, name: str) -> dict[str, Any]:
        return self.docs[name]["probe"]

    def iface(self, name: str, ifname: str = "eth0") -> dict[str, Any]:
        return next(i for i in self.node(name)["interfaces"] if i["name"] == ifname)

    def set_var(self, name: str | None, **kv: Any) -> None:
        """Set an inventory host var on one host (None: on every host, like group_vars)."""
        hv = self.inventory["_meta"]["hostvars"]
        for h in [name] if name else list(hv):
            hv[h].update(kv)

    def set_hosts_file(self, name: str, text: str) -> None:
        self.node(name)["hosts_file"] = nodeinfo().parse_hosts_file(text)

    def set_env_file(self, name: str, text: str) -> None:
        """The env_file facts ddpfix_node_facts returns for a file with this text."""
        ef = self.node(name)["env_file"]
        lib, parse = envfile(), nodeinfo().parse_env_file
        values, managed, salt = parse(text), parse(lib.managed_text(text)), lib.new_salt()
        ef.update(exists=True, readable=True, text=lib.redact(text), values=lib.redact_values(values),
                  owner=lib.ownership(text),
                  managed=lib.redact_values(managed), outside_keys=lib.outside_keys(text),
                  secrets={"salt": salt, "values": lib.secret_digests(values, salt),
                           "managed": lib.secret_digests(managed, salt)})

    def write_planned_env_files(self, **override: dict[str, str]) -> None:
        """Give every node the env file ddpfix would write (plan.render_env), then apply per-node overrides."""
        from ddpfix.plan import plan_cluster, render_env

        plans = plan_cluster(self.cluster(), {n: d["node"] for n, d in self.docs.items()})
        for n, plan in plans.items():
            text = render_env(plan)
            extra = override.get(n) or {}
            if extra:
                text += "".join(f"{k}={v}\n" for k, v in extra.items())  # a later line wins, as in bash
            self.set_env_file(n, text)

    def set_unreachable(self, name: str, error: str) -> None:
        self.unreachable[name] = error

    def set_module_failed(self, name: str, res: dict[str, Any]) -> None:
        """The facts module failed on `name` with result `res` (SSH worked), as ansible-runner reports it."""
        self.module_failed[name] = res

    # ---------------------------------------------------------------- running the checks
    def cluster(self) -> Cluster:
        return cluster_from_inventory_data(self.inventory)

    def context(self, thresholds: Thresholds | None = None) -> Context:
        hosts = {}
        for n, d in self.docs.items():
            if n in self.unreachable:
                hosts[n] = HostFacts(n, reachable=False, error=self.unreachable[n])
            elif n in self.module_failed:
                # through the CLI's own conversion: the runner event, then the audit's HostFacts
                from ddpfix.ansible.results import HostResult, record_event
                from ddpfix.audit import host_facts_of

                results: dict[str, HostResult] = {}
                record_event(results, {"event": "runner_on_failed", "event_data": {
                    "host": n, "task": "Facts | read the node", "resolved_action": "ddpfix.cluster.ddpfix_node_facts",
                    "res": self.module_failed[n]}})
                hosts[n] = host_facts_of(results[n])
            else:
                hosts[n] = HostFacts(n, node=d["node"], probe=d["probe"], collected_at=d["collected_at"])
        return Context(self.cluster(), hosts, thresholds or Thresholds())

    def findings(self, thresholds: Thresholds | None = None) -> list[Finding]:
        return run_checks(self.context(thresholds))


def at_least(findings: list[Finding], severity: Severity) -> list[Finding]:
    return [f for f in findings if f.severity >= severity]


SYSFS_FIXTURES = FIXTURES / "sysfs"


def fabric_module() -> ModuleType:
    return load_role_module("module_utils/ddpfix_fabric.py", "ddpfix_fabric")


def fabric_facts(tree: str, **kw: Any) -> dict[str, Any]:
    """The fabric facts the node module returns on the recorded tree `tree` (no tools run)."""
    root = SYSFS_FIXTURES / tree
    facts, unread = fabric_module().collect(str(root / "sys"), str(root / "dev"), proc_root=str(root / "proc"),
                                            run_tools=False, **kw)
    assert unread == [], unread
    return facts


def _fabric(sim: Sim, tree: str = "ib_hdr") -> None:
    """Give every node the fabric facts read from a recorded tree, with an unlimited memlock (a clean RDMA node)."""
    for n in sim.docs:
        fb = copy.deepcopy(fabric_facts(tree))
        fb["memlock"] = {"soft": -1, "hard": -1, "source": "ssh session"}
        sim.node(n)["fabric"] = fb


def _port(sim: Sim, node: str, dev: str = "mlx5_1", port: int = 1) -> dict[str, Any]:
    d = next(d for d in sim.node(node)["fabric"]["devices"] if d["name"] == dev)
    return next(p for p in d["ports"] if p["port"] == port)


def _add_mgmt_hca(sim: Sim, node: str) -> None:
    """A 25G RoCE NIC whose netdev is eth0, the SSH interface (as on many cloud GPU nodes)."""
    fb = sim.node(node)["fabric"]
    fb["devices"].append({"name": "mlx5_2", "driver": "mlx5_core", "netdevs": ["eth0"], "numa_node": 0, "ports": [
        {"port": 1, "state": "ACTIVE", "state_num": 4, "phys_state": "LinkUp", "phys_state_num": 5,
         "rate": "25 Gb/sec (1X EDR)", "rate_gbps": 25.0, "link_layer": "Ethernet", "pkey0": "0xffff", "gids": []}]})


# hostile strings (hypothesis): template syntax, line breaks, NUL, terminal escapes, shell metacharacters, lone
# surrogates (what undecodable bytes become), very long text
ATOMS = ["{{ 7*191 }}", "{{", "}}", "{%", "%}", "{#", "$(id)", "`id`", ";", "|", "&&", "\n", "\r\n", "\x00", "\x1b[2J",
         "\x1b]0;x\x07", "'", '"', "\\", " ", "\t", "..", "/", "%s", "\udcff", "\u2028", "=", "#", "mlx5_0", "eth0",
         "192.168.77.11", "::1"]
MARK = "ZZ1337"
hostile = st.one_of(
    st.lists(st.one_of(st.sampled_from(ATOMS), st.text(max_size=6)), max_size=10).map("".join),
    st.builds(lambda a, b: f"{a}\n{MARK}{b}", st.text(max_size=20), st.text(max_size=20)),
    st.text(min_size=300, max_size=600),
    st.text(max_size=40),
)


#: ansible-core 2.21.5 refusing a node's Python 3.8, word for word: module_utils/basic.py's `_PY_MIN = (3, 9)` check
#: (PyPI ansible-core 2.21.5, ansible/module_utils/basic.py lines 14-22; a module result of its own, no traceback),
#: recorded with `ansible localhost -c local -m ping -e ansible_python_interpreter=/root/.pyenv/versions/3.8.18/bin/
#: python3.8` under ansible-core 2.21.5 (ansible-core 2.20 dropped Python 3.8 on targets: its CHANGELOG-v2.20.rst)
PYTHON_TOO_OLD = {
    "failed": True, "changed": False,
    "msg": "Ansible requires Python 3.9 or newer on the target. Current version: 3.8.18 (default, May  9 2026, "
           "07:33:04) [GCC 12.2.0]",
}
