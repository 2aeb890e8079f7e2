"""Acceptance tests of `ddpfix audit` on lab hosts (real SSH, real firewalls, real resolvers).

Every finding id of `ddpfix.rules.registry.RULES` is produced by a lab scenario and asserted on the right
host (or `host: null` for cluster-wide ids) with the concrete value in its evidence, through the
real CLI (`ddpfix -i INV audit --format json`, a subprocess). To keep the run short the scenarios
that do not interfere share a lab, so there are four 3-node labs per module run:

- ``A``: firewalld on the master + iptables on node3 + broken /etc/hosts, MTU, route, port, sysctl,
  machine-id and Docker-like interfaces (also the "audit changes nothing" lab: firewalld and iptables);
- ``B``: iptables world-open rule on the master, missing peers in /etc/hosts, wrong env files, a down
  socket interface, an unsynchronised chronyd, IPv6-only peer names on one node;
- ``C``: per-node NIC names with one IFNAME everywhere, a cloned hostname, no time daemon, a skewed clock (also the
  unreachable-host lab);
- the shared clean lab (no finding at warning or above; `--limit`; master port in the ephemeral range;
  bad inputs on a copy of its inventory).

`time_rules.SKEW`: every lab node shares the one kernel clock of this machine and no lab process may set it,
so lab C's `clock-skew` scenario runs node3's Ansible interpreter under libfaketime (+5 s): its facts carry
a wall clock 5 s ahead, as a skewed node's would, while the kernel clock stays untouched.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ddpfix_proc, sh_out

from ddpfix import lab, schemas
from ddpfix.lab.scenarios.hosts import WRONG_PEER_ADDR
from ddpfix.lab.scenarios.registry import SCENARIOS
from ddpfix.rules import env as env_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import netif as netif_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import reachability as reachability_rules
from ddpfix.rules import time as time_rules
from ddpfix.rules.registry import RULES

pytestmark = pytest.mark.lab

LAB_A = ("firewalld-master,iptables-worker,peer-mismatch,hostname-loopback,mtu-mismatch,route-via-gateway,"
         "port-in-use,somaxconn-low,machine-id-clone,autoselect-wrong")
#: Scenarios that declare what the audit must report (`Scenario.expect`, e.g. rp-filter-strict) join lab B, so a new
#: finding's scenario adds no lab bring-up; their expectations join EXPECTED below.
DECLARED = [s for s in SCENARIOS.values() if s.expect]
LAB_B = ",".join(["world-open,peer-unresolvable,env-wrong,netif-down,chrony-unsynced,family-mismatch"]
                 + [s.name for s in DECLARED])
LAB_C = "ifname-mismatch,duplicate-hostname,chrony-absent,clock-skew"

#: ids no lab can produce, with the reason (asserted to be exactly the ids missing from EXPECTED)
NOT_IN_LAB: dict[str, str] = {}


# ------------------------------------------------------------------ running the CLI


@dataclass
class Audit:
    rc: int
    doc: dict[str, Any] | None
    stdout: str
    stderr: str
    args: tuple[str, ...] = ()

    def findings(self, id: str | None = None, host: Any = ...) -> list[dict[str, Any]]:
        out = (self.doc or {}).get("findings", [])
        return [f for f in out if (id is None or f["id"] == id) and (host is ... or f["host"] == host)]

    def ids(self) -> set[tuple[str, str | None]]:
        return {(f["id"], f["host"]) for f in self.findings()}

    def explain(self) -> str:
        lines = [f"ddpfix {' '.join(self.args)} -> rc {self.rc}", self.stderr.strip()[-2000:]]
        lines += [f"  {f['severity']:7} {f['id']:30} {f['host']}: {f['evidence']}" for f in self.findings()]
        return "\n".join(lines)


def run_audit(inventory: Path | str, *extra: str, state_dir: Path, global_args: tuple[str, ...] = ()) -> Audit:
    args = ("-i", str(inventory), *global_args, "audit", "--format", "json", *extra)
    res = ddpfix_proc(*args, state_dir=state_dir)
    doc = None
    if res.stdout.strip():
        doc = json.loads(res.stdout)
    return Audit(res.returncode, doc, res.stdout, res.stderr, args)


# ------------------------------------------------------------------ node state (audit must not change it)

SNAPSHOT = r"""
find /etc -printf '%y %m %u %g %s %p -> %l\n' | LC_ALL=C sort
find /etc -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
echo '--- iptables'
iptables-save 2>/dev/null | grep -v '^#' | sed -E 's/\[[0-9]+:[0-9]+\]/[-]/'
echo '--- nft'
nft list ruleset 2>/dev/null | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/'
"""


def listeners(info, node: str) -> set[str]:
    """TCP listeners of a node as 'address:port process' (pids left out: the set must not change)."""
    out = set()
    for line in sh_out(info, node, "ss -Hltnp").splitlines():
        cols = line.split()
        procs = sorted(set(re.findall(r'\("([^"]+)"', line)))
        out.add(f"{cols[3]} {','.join(procs)}")
    return out


def snapshot(info) -> dict[str, dict[str, Any]]:
    return {n.name: {"state": sh_out(info, n.name, SNAPSHOT), "listeners": listeners(info, n.name)} for n in info.nodes}


# ------------------------------------------------------------------ labs (module scope: built and audited once)


@dataclass
class Audited:
    info: Any
    audit: Audit
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)

    def addr(self, node: str) -> str:
        return self.info.node(node).address


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ddpfix-state")


@pytest.fixture(scope="module")
def lab_a(lab_factory, state: Path) -> Audited:
    info = lab_factory(nodes=3, scenario=LAB_A)
    before = snapshot(info)
    audit = run_audit(info.inventory, state_dir=state)
    return Audited(info, audit, before, snapshot(info))


@pytest.fixture(scope="module")
def lab_b(lab_factory, state: Path) -> Audited:
    info = lab_factory(nodes=3, scenario=LAB_B)
    before = snapshot(info)
    audit = run_audit(info.inventory, state_dir=state)
    return Audited(info, audit, before, snapshot(info))


@pytest.fixture(scope="module")
def lab_c(lab_factory, state: Path) -> Audited:
    info = lab_factory(nodes=3, scenario=LAB_C)
    return Audited(info, run_audit(info.inventory, state_dir=state))


@pytest.fixture(scope="module")
def clean(clean_lab, state: Path) -> Audited:
    return Audited(clean_lab, run_audit(clean_lab.inventory, state_dir=state))


def edited_inventory(info, dest: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of the lab's inventory with `edit` applied to the ddp_nodes group (dict)."""
    doc = yaml.safe_load(info.inventory.read_text())
    edit(doc["all"]["children"]["ddp_nodes"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


@pytest.fixture(scope="module")
def clean_ephemeral_port(clean_lab, state: Path, tmp_path_factory: pytest.TempPathFactory) -> Audited:
    """The clean lab audited with ddp_master_port 40000 (inside the ephemeral range 32768-60999)."""
    inv = edited_inventory(clean_lab, tmp_path_factory.mktemp("inv") / "hosts.yml",
                           lambda g: g["vars"].update(ddp_master_port=40000))
    return Audited(clean_lab, run_audit(inv, state_dir=state))


# ------------------------------------------------------------------ every finding id, on the right host, with evidence


def machine_id(a: Audited, node: str) -> str:
    return sh_out(a.info, node, "cat /etc/machine-id").strip()


def port_range(a: Audited, node: str) -> str:
    return " ".join(sh_out(a.info, node, "cat /proc/sys/net/ipv4/ip_local_port_range").split())


# (finding id, lab fixture, host (None: cluster-wide), evidence must contain each of these: fn(Audited) -> [str])
EXPECTED: list[tuple[str, str, str | None, Callable[[Audited], list[str]]]] = [
    (firewall_rules.MASTER_PORT_BLOCKED.id, "lab_a", "node1", lambda a: ["firewalld zone 'public'", "29500/tcp not in ports"]),
    (firewall_rules.PEER_PORTS_BLOCKED.id, "lab_a", "node1", lambda a: ["firewalld zone 'public'", "/tcp not in ports"]),
    (firewall_rules.PEER_PORTS_BLOCKED.id, "lab_a", "node3",
     lambda a: ["-A INPUT -p tcp -m tcp --dport 32768:60999 -j REJECT --reject-with tcp-reset"]),
    (firewall_rules.WORLD_OPEN.id, "lab_b", "node1",
     lambda a: ["29500/tcp from 203.0.113.", "-A INPUT -p tcp -m tcp --dport 29500 -j ACCEPT"]),
    (probes_rules.MASTER_PORT_UNREACHABLE.id, "lab_a", "node2",
     lambda a: [f"from {a.addr('node2')} (eth0) to node1 {a.addr('node1')}:29500", "no route to host"]),
    (probes_rules.MASTER_PORT_UNREACHABLE.id, "lab_a", "node3", lambda a: [f"to node1 {a.addr('node1')}:29500"]),
    (probes_rules.PEER_UNREACHABLE.id, "lab_a", "node1", lambda a: [f"to node3 {a.addr('node3')}:", "connection refused"]),
    (probes_rules.PEER_UNREACHABLE.id, "lab_a", "node2", lambda a: [f"to node1 {a.addr('node1')}:", "no route to host"]),
    (probes_rules.PORT_IN_USE.id, "lab_a", "node1", lambda a: ["LISTEN state on TCP port 29500"]),
    (hosts_rules.HOSTNAME_LOOPBACK.id, "lab_a", "node2", lambda a: ["/etc/hosts: 127.0.1.1\tnode2"]),
    (hosts_rules.HOSTNAME_LOOPBACK.id, "lab_a", "node3", lambda a: ["/etc/hosts: 127.0.1.1\tnode3"]),
    (hosts_rules.PEER_UNRESOLVABLE.id, "lab_b", "node2", lambda a: ["getaddrinfo('node1') on node2: no address"]),
    (hosts_rules.PEER_MISMATCH.id, "lab_a", "node1",
     lambda a: [f"getaddrinfo('node2') on node1 = {WRONG_PEER_ADDR}", f"/etc/hosts: {WRONG_PEER_ADDR}\tnode2"]),
    (hosts_rules.DUPLICATE_HOSTNAME.id, "lab_c", None, lambda a: ["node2: hostname=node2", "node3: hostname=node2"]),
    (hosts_rules.NAME_FORM_DIFFERS.id, "lab_c", "node3",
     lambda a: [f"hostname node2 -> {a.addr('node2')} (held by node2)", f"/etc/hosts: {a.addr('node2')}	node2"]),
    (hosts_rules.DUPLICATE_MACHINE_ID.id, "lab_a", None,
     lambda a: [f"/etc/machine-id = {machine_id(a, 'node3')} on node2, node3"]),
    (time_rules.NO_DAEMON.id, "lab_c", "node1", lambda a: ["no chronyd"]),
    (time_rules.NO_DAEMON.id, "lab_c", "node3", lambda a: ["no chronyd"]),
    (time_rules.SKEW.id, "lab_c", None, lambda a: ["node3: +", "s vs controller", "node1: "]),
    (time_rules.UNSYNCHRONIZED.id, "lab_b", "node3", lambda a: ["chronyc tracking: leap status 'Not synchronised'"]),
    (netif_rules.MISSING.id, "lab_b", "node3", lambda a: ["GLOO_SOCKET_IFNAME=eth1", "interfaces present: lo, eth0, ens6"]),
    (netif_rules.MISSING.id, "lab_c", "node2", lambda a: ["GLOO_SOCKET_IFNAME=eth0", "interfaces present: lo, ens5"]),
    (netif_rules.NAME_MISMATCH.id, "lab_c", None,
     lambda a: ["node1=eth0, node2=ens5, node3=eth0", "GLOO_SOCKET_IFNAME=eth0, NCCL_SOCKET_IFNAME=eth0"]),
    (netif_rules.AUTOSELECT_WRONG.id, "lab_a", "node2", lambda a: ["br-3f9a1c2b7d10=172.18.0.1", f"eth0={a.addr('node2')}"]),
    (netif_rules.MTU_MISMATCH.id, "lab_a", None, lambda a: ["node1: eth0 mtu 1500", "node3: eth0 mtu 1400"]),
    (netif_rules.DOWN.id, "lab_b", "node3", lambda a: ["ens6 flags=BROADCAST,MULTICAST operstate=DOWN"]),
    (net_rules.MASTER_NOT_PRIVATE.id, "lab_b", "node3", lambda a: [f"/etc/ddpfix/ddp.env: MASTER_ADDR={a.addr('node2')}"]),
    (hosts_rules.FAMILY_MISMATCH.id, "lab_b", None, lambda a: ["node1: IPv4", "node3: IPv6"]),
    (net_rules.VIA_GATEWAY.id, "lab_a", "node3", lambda a: [f"ip route get {a.addr('node1')}: dev eth0 via {a.addr('node2')}"]),
    (net_rules.MASTER_PORT_EPHEMERAL.id, "clean_ephemeral_port", "node1",
     lambda a: [f"net.ipv4.ip_local_port_range = {port_range(a, 'node1')}"]),
    (net_rules.SOMAXCONN_LOW.id, "lab_a", "node1", lambda a: ["net.core.somaxconn = 2"]),
    (env_rules.MISSING.id, "clean", "node1", lambda a: ["stat /etc/ddpfix/ddp.env: no such file"]),
    (env_rules.MISSING.id, "clean", "node3", lambda a: ["stat /etc/ddpfix/ddp.env: no such file"]),
    (env_rules.INCONSISTENT.id, "lab_b", None,
     lambda a: [f"node1: MASTER_ADDR={a.addr('node1')}", f"node3: MASTER_ADDR={a.addr('node2')}"]),
    (env_rules.INCONSISTENT.id, "lab_b", "node3", lambda a: [f"MASTER_ADDR={a.addr('node2')} (want {a.addr('node1')})"]),
] + [(e.id, "lab_b", e.host, lambda a, e=e: e.evidence(a.info)) for s in DECLARED for e in s.expect]


def lab_covered() -> set[str]:
    """The ids a lab test proves, derived from the registry and the scenarios: every id a lab test module names (the
    tests about one finding assert it by its rule object, `<area>_rules.<NAME>.id`: not a comment, not a docstring)
    and every id declared by a scenario a lab test module brings up (by name, alone or in a comma-separated list)."""
    strings: set[str] = set()
    named: set[str] = set()
    for path in Path(__file__).parent.glob("test_*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                strings.add(n.value)
            elif (isinstance(n, ast.Attribute) and n.attr == "id" and isinstance(n.value, ast.Attribute)
                  and isinstance(n.value.value, ast.Name) and n.value.value.id.endswith("_rules")):
                area = importlib.import_module(f"ddpfix.rules.{n.value.value.id.removesuffix('_rules')}")
                named.add(getattr(area, n.value.attr).id)
    run = {name for s in strings for name in s.split(",") if name in SCENARIOS}
    return named | {fid for name in run for fid in SCENARIOS[name].findings} | {e[0] for e in EXPECTED}


def test_every_finding_id_has_a_lab_test() -> None:
    covered = lab_covered()
    assert covered | set(NOT_IN_LAB) == set(RULES), sorted(set(RULES) - covered - set(NOT_IN_LAB))
    assert not covered & set(NOT_IN_LAB)


@pytest.mark.parametrize(("id", "fixture", "host", "evidence"), EXPECTED,
                         ids=[f"{e[0]}@{e[2] or 'cluster'}" for e in EXPECTED])
def test_finding_reported_with_evidence(id: str, fixture: str, host: str | None,
                                       evidence: Callable[[Audited], list[str]], request: pytest.FixtureRequest) -> None:
    a: Audited = request.getfixturevalue(fixture)
    got = a.audit.findings(id, host)
    assert got, f"{id} not reported on {host or 'cluster'}:\n{a.audit.explain()}"
    want = evidence(a)
    assert any(all(w in f["evidence"] for w in want) for f in got), (
        f"{id} on {host}: evidence lacks {want}: {[f['evidence'] for f in got]}")
    rule = RULES[id]
    for f in got:
        assert f["severity"] == rule.severity.label and f["fixable"] == rule.fixable
        assert f["message"] and f["fix"] and "{" not in f["fix"], f
    if rule.severity.label in ("error", "warning"):
        assert a.audit.rc == 1, a.audit.explain()


@pytest.mark.parametrize("fixture", ["lab_a", "lab_b", "lab_c"])
def test_broken_lab_report_is_complete(fixture: str, request: pytest.FixtureRequest) -> None:
    """Exit 1, schema v1, every node audited with its summary facts, the summary counts the findings."""
    a: Audited = request.getfixturevalue(fixture)
    doc = a.audit.doc
    assert a.audit.rc == 1 and doc, a.audit.explain()
    assert doc["schema"] == "ddpfix.report/v1" and doc["command"] == "audit"
    schemas.validate(doc)
    assert doc["inventory"] == [str(a.info.inventory)]
    assert set(doc["hosts"]) == {"node1", "node2", "node3"}
    for name, h in doc["hosts"].items():
        assert h["reachable"] is True and h["address"] == a.addr(name), h
        assert h["facts"]["hostname"] and h["facts"]["ephemeral_range"], h
    counts = {s: sum(1 for f in doc["findings"] if f["severity"] == s) for s in ("error", "warning", "info")}
    assert doc["summary"]["findings"] == counts
    assert doc["summary"]["hosts"] == 3 and doc["summary"]["reachable"] == 3 and doc["summary"]["unreachable"] == 0
    assert doc["cluster"]["master"] == "node1" and doc["cluster"]["cidr"] == a.info.subnet
    for f in doc["findings"]:
        assert f["id"] in RULES and f["host"] in (None, "node1", "node2", "node3")


def test_firewall_layers_in_host_facts(lab_a: Audited, clean: Audited) -> None:
    fw = {n: h["facts"]["firewall"] for n, h in lab_a.audit.doc["hosts"].items()}
    assert "firewalld" in fw["node1"] and "iptables" in fw["node3"] and fw["node2"] == [], fw
    assert all(h["facts"]["firewall"] == [] for h in clean.audit.doc["hosts"].values())


def test_world_open_lab_has_no_other_firewall_finding(lab_b: Audited) -> None:
    """The world-open master trusts the subnet: nothing is blocked, only the open rule is reported."""
    ids = lab_b.audit.ids()
    assert (firewall_rules.WORLD_OPEN.id, "node1") in ids
    assert not {i for i, _ in ids} & {firewall_rules.MASTER_PORT_BLOCKED.id, firewall_rules.PEER_PORTS_BLOCKED.id}
    assert not lab_b.audit.findings(probes_rules.MASTER_PORT_UNREACHABLE.id, "node2")


# ------------------------------------------------------------------ clean lab: no false positives


def test_clean_lab_no_finding_at_warning_or_above(clean: Audited) -> None:
    doc = clean.audit.doc
    assert clean.audit.rc == 0, clean.audit.explain()
    assert [f for f in doc["findings"] if f["severity"] != "info"] == []
    assert clean.audit.ids() == {(env_rules.MISSING.id, n) for n in ("node1", "node2", "node3")}
    assert doc["summary"]["findings"] == {"error": 0, "warning": 0, "info": 3}
    for name, h in doc["hosts"].items():
        assert h["reachable"] and h["facts"]["chrony_synchronised"] is True and h["facts"]["firewall"] == []
        assert h["facts"]["cluster_address"] == clean.addr(name) and h["facts"]["cluster_ifname"] == "eth0"


def test_clean_lab_probes_in_one_round(clean: Audited) -> None:
    """Every node runs at once (forks >= nodes): one task per node, every planned connect succeeded."""
    doc = clean.audit.doc
    assert doc["probe_rounds"] == {"rounds": 1, "detached": [], "rolling": [], "observed": 0, "unobserved": 0}
    cells = [c for row in doc["matrix"]["cells"].values() for c in row.values() if c["state"] != "self"]
    assert cells and all(c["state"] == "ok" for c in cells), doc["matrix"]


def test_clean_lab_forks_below_nodes_no_false_probe_finding(clean_lab, state: Path) -> None:
    """--forks 1 (nodes run one after another): one task per node, the probers rolling (node1's dials to node2 and
    node3 and node2's to node3 seen by the later nodes' listeners), said in the report; no false probe finding,
    and no probe listener is left on any node."""
    before = {n.name: listeners(clean_lab, n.name) for n in clean_lab.nodes}
    a = run_audit(clean_lab.inventory, "--forks", "1", state_dir=state)
    assert a.rc == 0, a.explain()
    assert not [f for f in a.findings() if f["id"].startswith("probe.")], a.explain()
    # one round: every node's prober rolling, the dials to later nodes read from their listeners (none missing)
    assert a.doc["probe_rounds"] == {"rounds": 1, "detached": [], "rolling": ["node1", "node2", "node3"],
                                     "observed": 3, "unobserved": 0}
    cells = [c for row in a.doc["matrix"]["cells"].values() for c in row.values() if c["state"] != "self"]
    assert cells and all(c["state"] == "ok" for c in cells), a.doc["matrix"]
    assert {n.name: listeners(clean_lab, n.name) for n in clean_lab.nodes} == before
    assert not locks_held(clean_lab, within=5.0)  # each rolling prober gave its node's lock back


def locks_held(info: Any, within: float) -> list[str]:
    """The nodes whose ddpfix node lock still exists after `within` seconds of waiting for them all to go."""
    deadline = time.time() + within
    while True:
        held = [n.name for n in info.nodes
                if sh_out(info, n.name, "test -e /run/ddpfix.lock && echo held || true").strip()]
        if not held or time.time() >= deadline:
            return held
        time.sleep(0.5)


def test_clean_lab_fail_on_info_is_exit_1(clean: Audited, state: Path) -> None:
    """--fail-on info counts the info findings (env_rules.MISSING); the default (warning) does not."""
    a = run_audit(clean.info.inventory, "--fail-on", "info", "--no-probe", state_dir=state)
    assert a.rc == 1, a.explain()
    assert {i for i, _ in a.ids()} == {env_rules.MISSING.id}


# ------------------------------------------------------------------ the audit changes nothing


@pytest.mark.parametrize("fixture", ["lab_a", "lab_b"])
def test_audit_leaves_every_node_unchanged(fixture: str, request: pytest.FixtureRequest) -> None:
    """/etc (names, modes, owners, sizes, symlinks, sha256 of every file), iptables and nft rule sets, and the
    TCP listeners of every node are the same before and after the audit (no probe listener left)."""
    a: Audited = request.getfixturevalue(fixture)
    assert a.audit.rc == 1, a.audit.explain()
    for n in a.info.nodes:
        before, after = a.before[n.name], a.after[n.name]
        assert before["state"] == after["state"], f"{n.name} changed by the audit"
        assert before["listeners"] == after["listeners"], f"{n.name}: listeners {after['listeners'] - before['listeners']} left"
    if fixture == "lab_a":  # really a lab with firewalld and iptables rule sets to compare
        assert "table inet firewalld" in a.before["node1"]["state"]
        assert "--dport 32768:60999 -j REJECT" in a.before["node3"]["state"]
        assert any(":29500 python3" in x for x in a.before["node1"]["listeners"])  # port-in-use survived


# ------------------------------------------------------------------ unreachable node, --limit, --no-probe


def test_unreachable_node_others_fully_audited(lab_c: Audited, state: Path) -> None:
    full = lab_c.audit  # audited with every node up first (fixture), for comparison
    lab.stop_sshd(lab_c.info.name, "node3")
    try:
        a = run_audit(lab_c.info.inventory, state_dir=state)
    finally:
        lab.start_sshd(lab_c.info.name, "node3")
    assert a.rc == 1, a.explain()
    doc = a.doc
    un = a.findings(reachability_rules.UNREACHABLE.id)
    assert [f["host"] for f in un] == ["node3"] and un[0]["severity"] == "error", a.explain()
    assert lab_c.addr("node3") in un[0]["message"] and un[0]["evidence"]
    assert doc["hosts"]["node3"]["reachable"] is False and doc["hosts"]["node3"]["facts"] == {}
    assert doc["summary"]["reachable"] == 2 and doc["summary"]["unreachable"] == 1
    for name in ("node1", "node2"):
        h = doc["hosts"][name]
        assert h["reachable"] is True and h["facts"] == full.doc["hosts"][name]["facts"]
        # every finding of the full audit on node1/node2 is still reported
        assert {i for i, host in full.ids() if host == name} <= {i for i, host in a.ids() if host == name}
    assert (netif_rules.MISSING.id, "node2") in a.ids() and (time_rules.NO_DAEMON.id, "node1") in a.ids()
    assert not a.findings(host="node3") or {f["id"] for f in a.findings(host="node3")} == {reachability_rules.UNREACHABLE.id}


def test_node_whose_python_fails_is_not_unreachable(lab_c: Audited, state: Path, tmp_path: Path) -> None:
    """node2's ansible_python_interpreter is a script that exits 1: SSH works, so the node is reported as
    reachability_rules.MODULE_FAILED with the module's own error (never reachability_rules.UNREACHABLE and its SSH fix), the others fully."""
    full = lab_c.audit
    broken = "/etc/ddpfix-lab/python3-broken"
    sh_out(lab_c.info, "node2", f"mkdir -p /etc/ddpfix-lab && printf '#!/bin/sh\\necho ddpfix-lab: broken python >&2\\n"
                            f"exit 1\\n' > {broken} && chmod 755 {broken}")
    inv = edited_inventory(lab_c.info, tmp_path / "hosts.yml",
                           lambda g: g["hosts"]["node2"].update(ansible_python_interpreter=broken))
    try:
        a = run_audit(inv, "--no-probe", state_dir=state)  # the facts task is what fails; probes add nothing here
    finally:
        sh_out(lab_c.info, "node2", f"rm -f {broken}")
    assert a.rc == 1, a.explain()
    assert not a.findings(reachability_rules.UNREACHABLE.id), a.explain()
    mf = a.findings(reachability_rules.MODULE_FAILED.id)
    assert [f["host"] for f in mf] == ["node2"] and mf[0]["severity"] == "error", a.explain()
    assert "ddpfix_node_facts: " in mf[0]["evidence"] and "rc=1" in mf[0]["evidence"], mf[0]
    assert "stderr: ddpfix-lab: broken python" in mf[0]["evidence"] and "SSH (sshd" not in mf[0]["fix"], mf[0]
    doc = a.doc or {}
    assert doc["summary"]["unreachable"] == 0 and doc["summary"]["module_failed"] == 1, doc["summary"]
    assert doc["hosts"]["node2"]["module_failed"] is True and doc["hosts"]["node2"]["facts"] == {}
    for name in ("node1", "node3"):
        assert doc["hosts"][name]["reachable"] is True and doc["hosts"][name]["facts"] == full.doc["hosts"][name]["facts"]


def test_limit_one_node(lab_a: Audited, state: Path) -> None:
    """--limit node3: only node3 is audited (no unreachable finding for the others), its own faults reported."""
    a = run_audit(lab_a.info.inventory, state_dir=state, global_args=("--limit", "node3"))
    assert a.rc == 1, a.explain()
    assert set(a.doc["hosts"]) == {"node3"} and a.doc["hosts"]["node3"]["reachable"]
    assert a.doc["summary"]["hosts"] == 1
    assert {h for _, h in a.ids()} <= {"node3", None}
    assert not a.findings(reachability_rules.UNREACHABLE.id)
    ev = a.findings(firewall_rules.PEER_PORTS_BLOCKED.id, "node3")
    assert ev and "--dport 32768:60999 -j REJECT" in ev[0]["evidence"], a.explain()
    assert a.findings(hosts_rules.HOSTNAME_LOOPBACK.id, "node3")


def test_limit_one_node_clean(clean: Audited, state: Path) -> None:
    a = run_audit(clean.info.inventory, state_dir=state, global_args=("--limit", "node2"))
    assert a.rc == 0, a.explain()
    assert set(a.doc["hosts"]) == {"node2"} and a.ids() == {(env_rules.MISSING.id, "node2")}
    assert a.doc["hosts"]["node2"]["facts"]["cluster_address"] == clean.addr("node2")


def test_no_probe(lab_a: Audited, state: Path) -> None:
    """--no-probe: no connects and no listener, but every node's facts and the rule-set findings remain."""
    before = {n.name: listeners(lab_a.info, n.name) for n in lab_a.info.nodes}
    a = run_audit(lab_a.info.inventory, "--no-probe", state_dir=state)
    assert a.rc == 1, a.explain()
    assert all(h["reachable"] for h in a.doc["hosts"].values()) and len(a.doc["hosts"]) == 3
    ids = a.ids()
    assert not {i for i, _ in ids} & {probes_rules.MASTER_PORT_UNREACHABLE.id, probes_rules.PEER_UNREACHABLE.id}
    for want in [(firewall_rules.MASTER_PORT_BLOCKED.id, "node1"), (firewall_rules.PEER_PORTS_BLOCKED.id, "node3"),
                 (probes_rules.PORT_IN_USE.id, "node1"), (hosts_rules.HOSTNAME_LOOPBACK.id, "node2"),
                 (net_rules.SOMAXCONN_LOW.id, "node1"), (netif_rules.MTU_MISMATCH.id, None)]:
        assert want in ids, a.explain()
    assert {n.name: listeners(lab_a.info, n.name) for n in lab_a.info.nodes} == before


def test_forks_below_nodes_finds_the_same_probe_faults_in_one_round(lab_a: Audited, tmp_path: Path) -> None:
    """--forks 1 on lab A: node3's iptables refuses the ephemeral range, so node1's dial to node3 (node1 first in
    play order: its prober dials node3 after node1's task returned) is seen missing at node3's listener and reported
    on node1, the dialer, as the default run reports it; every probe finding of the default run, on the same
    node, and no other. One facts task per node and no collect task (the run's events), and each node's lock is
    given back by its rolling prober within its hold (node1's waits for connects its firewall drops)."""
    a = run_audit(lab_a.info.inventory, "--forks", "1", state_dir=tmp_path)
    assert a.rc == 1, a.explain()
    probe_ids = {(i, h) for i, h in a.ids() if i.startswith("probe.")}
    assert probe_ids == {(i, h) for i, h in lab_a.audit.ids() if i.startswith("probe.")}, a.explain()
    (to3,) = a.findings(probes_rules.PEER_UNREACHABLE.id, "node1")
    assert f"to node3 {lab_a.addr('node3')}:" in to3["evidence"], to3
    assert "observed at the listener" in to3["evidence"], to3
    rounds = a.doc["probe_rounds"]
    assert rounds["rounds"] == 1 and rounds["rolling"] == ["node1", "node2", "node3"] and rounds["unobserved"] == 0
    calls: dict[tuple[str, str], int] = {}
    for ev in tmp_path.glob("runs/*-audit/artifacts/*/job_events/*.json"):
        e = json.loads(ev.read_text())
        d = e.get("event_data") or {}
        action = str(d.get("task_action", "")).rsplit(".", 1)[-1]
        if e.get("event") == "runner_on_start" and action in ("ddpfix_node_facts", "ddpfix_probe"):
            calls[(action, d.get("host"))] = calls.get((action, d.get("host")), 0) + 1
    assert calls == {("ddpfix_node_facts", n.name): 1 for n in lab_a.info.nodes}, calls
    # node1's and node2's probers still wait, holding their node's lock (lent to them), until their hold (the dial
    # window, a connect timeout, 3 s and 6 s per batch of forks nodes: 31 s here): node1 for node2's and node3's
    # connects (its firewalld drops them), node2 redialling node3 (its iptables refuses). The next run (as
    # remediate --apply's own audit would) is not refused: it waits for them, takes the locks, leaves none behind
    lent = {n.name: sh_out(lab_a.info, n.name, "cat /run/ddpfix.lock 2>/dev/null || true") for n in lab_a.info.nodes}
    t0 = time.time()
    nxt = run_audit(lab_a.info.inventory, "--no-probe", state_dir=tmp_path)
    print(f"the next run took {time.time() - t0:.1f} s")
    assert nxt.rc == 1 and all(h["reachable"] for h in nxt.doc["hosts"].values()), nxt.explain()
    assert "node lock" not in nxt.stderr, nxt.stderr[-2000:]
    assert not locks_held(lab_a.info, within=5.0), lent


# ------------------------------------------------------------------ bad inputs: exit 2, one line, nothing run


def _set_master(g: dict, v: object) -> None:
    g["vars"]["ddp_master"] = v


BAD_INVENTORIES = {
    "unknown-master": (lambda g: _set_master(g, "node9"), "ddp_master 'node9' is not a host of group 'ddp_nodes'"),
    "cidr-garbage": (lambda g: g["vars"].update(ddp_cluster_cidr="192.168.1.0/33"), "ddp_cluster_cidr is not a valid CIDR"),
    "cidr-word": (lambda g: g["vars"].update(ddp_cluster_cidr="cluster-net"), "ddp_cluster_cidr is not a valid CIDR"),
    "port-zero": (lambda g: g["vars"].update(ddp_master_port=0), "ddp_master_port must be between 1 and 65535, got 0"),
    "port-high": (lambda g: g["vars"].update(ddp_master_port=65536), "ddp_master_port must be between 1 and 65535, got 65536"),
    "empty-group": (lambda g: g.update(hosts={}), "has no hosts"),
    "duplicate-rank": (lambda g: (g["hosts"]["node2"].update(ddp_node_rank=1), g["hosts"]["node3"].update(ddp_node_rank=1)),
                       "duplicate ddp_node_rank 1: node2 and node3"),
}


def assert_one_line_exit_2(res: subprocess.CompletedProcess[str], message: str, state_dir: Path) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddpfix: error: ") and message in lines[0], res.stderr
    assert res.stdout.strip() == ""
    assert not (state_dir / "runs").exists() or not any((state_dir / "runs").iterdir()), "something was run"


@pytest.mark.parametrize("case", list(BAD_INVENTORIES))
def test_bad_lab_inventory_is_exit_2_one_line(case: str, clean_lab, tmp_path: Path) -> None:
    """A real lab inventory with one variable changed (the unit tests cover the parsing on synthetic data)."""
    edit, message = BAD_INVENTORIES[case]
    inv = edited_inventory(clean_lab, tmp_path / "inv" / "hosts.yml", edit)
    res = ddpfix_proc("-i", str(inv), "audit", "--format", "json", state_dir=tmp_path / "state")
    assert_one_line_exit_2(res, message, tmp_path / "state")


@pytest.mark.parametrize(("args", "message"), [
    (("audit", "--fail-on", "critical"), "'critical' is not one of 'error', 'warning', 'info'"),
    (("audit", "--format", "xml"), "'xml' is not one of"),
    (("audit", "--probe-timeout", "0"), "--probe-timeout"),
])
def test_bad_option_is_exit_2_one_line(args: tuple[str, ...], message: str, clean_lab, tmp_path: Path) -> None:
    res = ddpfix_proc("-i", str(clean_lab.inventory), *args, state_dir=tmp_path / "state")
    assert_one_line_exit_2(res, message, tmp_path / "state")


def test_missing_inventory_is_exit_2_one_line(tmp_path: Path) -> None:
    res = ddpfix_proc("-i", str(tmp_path / "nope" / "hosts.yml"), "audit", state_dir=tmp_path / "state")
    assert_one_line_exit_2(res, "inventory not found", tmp_path / "state")
