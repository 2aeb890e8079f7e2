"""The playbooks' own analysis (action plugin ddpfix_analyze) reads what the CLI reads, the same way: the cluster
from the play's `groups`/`hostvars`, each node's facts through the one conversion (`audit.host_facts`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from unit_helpers import FACTS, PYTHON_TOO_OLD, ROOT

from ddpfix.audit import NOT_RUN, audit_report, failing, host_facts, hosts_from_vars
from ddpfix.errors import DdpfixError
from ddpfix.inventory.derive import cluster_from_hostvars, cluster_from_inventory_data
from ddpfix.rules import reachability as reachability_rules
from ddpfix.rules.context import Context
from ddpfix.rules.engine import run_checks

INV = {
    "all": {"children": ["ddp_nodes"]},
    "ddp_nodes": {"hosts": ["b"], "children": ["rack1"]},
    "rack1": {"hosts": ["c", "a"]},
    "_meta": {"hostvars": {
        "a": {"ansible_host": "10.0.0.3", "ddp_master": "c", "ddp_cluster_cidr": "10.0.0.0/24", "other": 1},
        "b": {"ansible_host": "10.0.0.1", "ddp_master": "c", "ddp_cluster_cidr": "10.0.0.0/24"},
        "c": {"ansible_host": "10.0.0.2", "ddp_master": "c", "ddp_cluster_cidr": "10.0.0.0/24"},
    }},
}


def test_cluster_from_hostvars_is_the_inventorys_cluster() -> None:
    want = cluster_from_inventory_data(INV, ["inv.yml"])
    hostvars = INV["_meta"]["hostvars"]
    tree = {g: v for g, v in INV.items() if g != "_meta"}
    assert cluster_from_hostvars(tree, hostvars, ["inv.yml"]) == want
    flat = {"all": ["b", "c", "a"], "ddp_nodes": ["b", "c", "a"], "rack1": ["c", "a"], "ungrouped": []}
    assert cluster_from_hostvars(flat, hostvars, ["inv.yml"]) == want
    assert want.master == "c" and want.names == ["c", "b", "a"]


def test_cluster_from_hostvars_validates_like_the_cli() -> None:
    hostvars = {h: {**v, "ddp_master_port": "http"} for h, v in INV["_meta"]["hostvars"].items()}
    with pytest.raises(DdpfixError, match="ddp_master_port must be an integer, got 'http'"):
        cluster_from_hostvars({"ddp_nodes": ["a", "b", "c"]}, hostvars)


def _recorded() -> tuple[Any, dict[str, Any]]:
    inv = json.loads((FACTS / "clean3" / "inventory.json").read_text())
    cluster = cluster_from_inventory_data(inv)
    nodes = {n: json.loads((FACTS / "clean3" / f"{n}.json").read_text()) for n in cluster.names}
    return cluster, nodes


def test_folded_probe_is_read_from_the_facts_else_the_registered_result() -> None:
    node = {"hostname": "x", "probe": {"pid": 1, "port": 40000}}
    assert host_facts("x", node, probe={"connects": [], "resolve": {}}).probe == {"connects": [], "resolve": {}}
    assert host_facts("x", node, probe={"skipped": True}).probe is None
    folded = {"hostname": "x", "probe": {"pid": 1, "connects": [{"ok": True}]}}
    assert host_facts("x", folded, probe={"connects": []}).probe == folded["probe"]
    assert not host_facts("x", None).reachable
    assert not host_facts("x", node, unreachable=True).reachable


def test_hosts_from_vars_follows_the_cli_on_nodes_without_facts() -> None:
    cluster, nodes = _recorded()
    n1, n2, n3 = cluster.names
    fresh = {n: {"ansible_facts": {"ddpfix_node": nodes[n]["node"]}, "ddpfix_audit_in_run": True,
                 "ddpfix_facts_result": {"ansible_facts": {"ddpfix_node": nodes[n]["node"]}}} for n in cluster.names}
    # this run: n2 unreachable at the facts task (its cached facts from an earlier run must not stand in), n3 not
    # matched by the play
    hv = {n1: fresh[n1],
          n2: {**fresh[n2], "ddpfix_facts_result": {"unreachable": True, "msg": "ssh: connect\n refused"}},
          n3: {"ansible_facts": {"ddpfix_node": nodes[n3]["node"]}}}
    hosts = hosts_from_vars(cluster, hv, from_run=True)
    assert hosts[n1].reachable and hosts[n1].node == nodes[n1]["node"]
    assert not hosts[n2].reachable and hosts[n2].error == "ssh: connect refused"
    assert not hosts[n3].reachable and hosts[n3].error == NOT_RUN
    assert set(hosts_from_vars(cluster, hv, from_run=True, limit=f"{n1},{n2}")) == {n1, n2}  # outside --limit: out
    # a fact cache: every cached node is read, one without facts is not
    cached = hosts_from_vars(cluster, {n1: fresh[n1], n3: hv[n3]}, from_run=False)
    assert cached[n1].reachable and cached[n3].reachable
    assert not cached[n2].reachable and cached[n2].error == "no facts in the fact cache"


def test_hosts_from_vars_names_a_module_failure_as_the_cli_does() -> None:
    """The standalone play's view of a node whose Python failed: failed (SSH worked), the module's own error; the
    analysis reports reachability_rules.MODULE_FAILED there, never reachability_rules.UNREACHABLE."""
    from ddpfix.rules.context import Context
    from ddpfix.rules.engine import run_checks

    cluster, nodes = _recorded()
    n1, n2, n3 = cluster.names
    hv: dict[str, Any] = {n: {"ansible_facts": {"ddpfix_node": nodes[n]["node"]}, "ddpfix_audit_in_run": True,
                              "ddpfix_facts_result": {"ansible_facts": {"ddpfix_node": nodes[n]["node"]}}}
                          for n in cluster.names}
    hv[n2]["ddpfix_facts_result"] = {
        "failed": True, "rc": 1, "module_stdout": "", "module_stderr": "broken python\n",
        "msg": "Module result deserialization failed: No start of json char found"}
    hosts = hosts_from_vars(cluster, hv, from_run=True)
    assert not hosts[n2].reachable and hosts[n2].failed
    assert hosts[n2].error == ("Module result deserialization failed: No start of json char found; rc=1; "
                               "stderr: broken python")
    ids = {(f.id, f.host) for f in run_checks(Context(cluster, hosts))}
    assert ((reachability_rules.MODULE_FAILED.id, n2) in ids and not any(i == reachability_rules.UNREACHABLE.id for i, _ in ids)
            and hosts[n1].reachable and hosts[n3].reachable)


def test_hosts_from_vars_names_a_python_the_ansible_core_dropped_as_the_cli_does() -> None:
    """The standalone play's view of a node whose Python ansible-core refused (2.21.5 on Python 3.8): the same one
    finding as the CLI's, reachability_rules.PYTHON_UNSUPPORTED, with ansible-core's message as its evidence."""
    from ddpfix.rules.context import Context
    from ddpfix.rules.engine import run_checks

    cluster, nodes = _recorded()
    n2 = cluster.names[1]
    hv: dict[str, Any] = {n: {"ansible_facts": {"ddpfix_node": nodes[n]["node"]}, "ddpfix_audit_in_run": True,
                              "ddpfix_facts_result": {"ansible_facts": {"ddpfix_node": nodes[n]["node"]}}}
                          for n in cluster.names}
    hv[n2]["ddpfix_facts_result"] = dict(PYTHON_TOO_OLD)
    hosts = hosts_from_vars(cluster, hv, from_run=True)
    assert hosts[n2].failed and hosts[n2].error.startswith("Ansible requires Python 3.9 or newer on the target.")
    found = [f for f in run_checks(Context(cluster, hosts)) if f.host == n2]
    assert [f.id for f in found] == [reachability_rules.PYTHON_UNSUPPORTED.id], found
    assert "Python 3.8.18" in found[0].message


def test_controller_window_of_the_facts_is_read_for_time_skew() -> None:
    cluster, nodes = _recorded()
    hv = {n: {"ansible_facts": {"ddpfix_node": nodes[n]["node"], "ddpfix_facts_window": [10.0, 12.5]}}
          for n in cluster.names}
    hosts = hosts_from_vars(cluster, hv, from_run=False)
    assert all(h.window == (10.0, 12.5) for h in hosts.values())


def test_report_and_threshold_of_the_playbook_path_are_the_clis() -> None:
    cluster, nodes = _recorded()
    hv = {n: {"ansible_facts": {"ddpfix_node": nodes[n]["node"]}} for n in cluster.names}
    ctx = Context(cluster, hosts_from_vars(cluster, hv, from_run=False))
    findings = run_checks(ctx)
    doc, kept = audit_report(ctx, findings)
    assert doc["schema"] == "ddpfix.report/v1" and set(doc["hosts"]) == set(cluster.names)
    assert failing(kept, "none") == []
    assert failing(kept, "info") == [f for f in kept if f.severity.label in ("info", "warning", "error")]


@pytest.mark.parametrize("group", ["ddp_nodes", "gpu"])
def test_every_play_targets_the_hosts_the_cluster_is_derived_from(tmp_path: Path, group: str) -> None:
    """The cluster is group `ddp_nodes`, or every host when the inventory has no such group (a user's INI file with
    its own group names): every play of every playbook targets those hosts, not an empty `ddp_nodes` pattern."""
    root = ROOT
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[{group}]\na ansible_host=192.0.2.1\nb ansible_host=192.0.2.2\n\n[other]\nc ansible_host=192.0.2.3\n")
    want = {"a", "b"} if group == "ddp_nodes" else {"a", "b", "c"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DDPFIX_"))}
    exe = Path(sys.executable).parent / "ansible-playbook"
    for playbook in ("audit.yml", "remediate.yml", "verify_torch.yml"):
        p = subprocess.run([str(exe), "-i", str(inv), str(root / "playbooks" / playbook), "--list-hosts"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path), check=False)
        assert p.returncode == 0, p.stdout + p.stderr
        plays = [play for play in p.stdout.split("play #")[1:] if "pattern: []" not in play]  # plays switched off
        assert plays, p.stdout
        for play in plays:
            hosts = {line.strip() for line in play.split("hosts (", 1)[1].splitlines()[1:] if line.strip()}
            assert hosts - {"localhost"} == want, (playbook, play)
