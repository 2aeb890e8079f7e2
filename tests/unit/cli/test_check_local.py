"""`ddpfix check --local` on recorded facts: the cluster file round trip, the audit's checks on one node, NHC output."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from unit_helpers import Sim

from ddpfix import clusterfile, local
from ddpfix.cli import cli
from ddpfix.rules import env as env_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules


def _cluster_file(sim: Sim, tmp_path: Path) -> Path:
    sim.write_planned_env_files()
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(clusterfile.build(sim.context()), indent=2))
    return path


def _local_findings(sim: Sim, path: Path, me: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    cluster, doc = clusterfile.load(str(path))
    answers = sim.probe(me)["resolve"]  # what getaddrinfo answered on that node
    monkeypatch.setattr(local.node_facts_module(), "resolve", lambda name: list(answers.get(name) or []))
    ctx = local.local_context(cluster, doc, me, copy.deepcopy(sim.node(me)))
    return local.run_local(ctx, me)


def test_cluster_file_round_trip(sim: Sim, tmp_path: Path) -> None:
    path = _cluster_file(sim, tmp_path)
    cluster, doc = clusterfile.load(str(path))
    want = sim.cluster()
    assert [(n.name, n.rank) for n in cluster.nodes] == [(n.name, n.rank) for n in want.nodes]
    assert (cluster.master, cluster.master_port, cluster.cluster_cidr) == (want.master, want.master_port, "192.168.77.0/24")
    assert [n["address"] for n in doc["nodes"]] == ["192.168.77.11", "192.168.77.12", "192.168.77.13"]
    assert doc["hosts_block"].startswith("sha256:") and doc["schema"] == clusterfile.SCHEMA


@pytest.mark.parametrize("me", ["node1", "node2", "node3"])
def test_healthy_node_passes(sim: Sim, tmp_path: Path, me: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    assert local.failures(_local_findings(sim, path, me, monkeypatch)) == []


def test_hostname_loopback_fails_with_the_audits_id(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    ids = [f.id for f in local.failures(_local_findings(sim, path, "node2", monkeypatch))]
    assert ids == [hosts_rules.HOSTNAME_LOOPBACK.id]


def test_the_claim_and_the_domains_travel_in_the_cluster_file(sim: Sim, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """check --local judges a node's hostname as the audit does: ddp_hosts_domains is in the cluster file, and a
    hostname the inventory does not vouch for is NAME_UNVOUCHED there too (the file names it nowhere)."""
    sim.set_var(None, ddp_hosts_domains=["cluster.example"])
    sim.node("node2")["hostname"] = "node2.cluster.example"
    path = _cluster_file(sim, tmp_path)
    cluster, doc = clusterfile.load(str(path))
    assert cluster.hosts_domains == ("cluster.example",) and doc["nodes"][1]["hostname"] == "node2.cluster.example"
    assert local.failures(_local_findings(sim, path, "node2", monkeypatch)) == []
    sim.node("node2")["hostname"] = "pypi.org"
    ids = [f.id for f in local.failures(_local_findings(sim, path, "node2", monkeypatch))]
    assert ids == [hosts_rules.NAME_UNVOUCHED.id]


def test_peer_resolution_and_env_drift_fail(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    sim.probe("node3")["resolve"]["node1"] = ["10.9.9.9"]
    sim.write_planned_env_files(node3={"PET_NODE_RANK": "1"})
    ids = {f.id for f in local.failures(_local_findings(sim, path, "node3", monkeypatch))}
    assert ids == {hosts_rules.PEER_MISMATCH.id, env_rules.INCONSISTENT.id}


def test_missing_env_file_fails(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    sim.node("node1")["env_file"] = {"path": "/etc/ddpfix/ddp.env", "exists": False, "readable": False, "values": {},
                                     "managed": {}, "owner": None, "outside_keys": []}
    ids = [f.id for f in local.failures(_local_findings(sim, path, "node1", monkeypatch))]
    assert ids == [env_rules.MISSING.id]


def test_skip_findings_from_the_inventory_are_accepted(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim.set_var(None, ddp_skip_findings=[f"{hosts_rules.HOSTNAME_LOOPBACK.id}@node2"])
    path = _cluster_file(sim, tmp_path)
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    assert local.failures(_local_findings(sim, path, "node2", monkeypatch)) == []


def test_no_cluster_file_passes_with_a_note_unless_required(tmp_path: Path) -> None:
    """A Prolog on every node: a node ddpfix never set up is not drained (exit 0, nothing on stdout, a note on
    stderr); --require-cluster-file restores the failure (one NHC line, exit 2)."""
    none = str(tmp_path / "none.json")
    r = CliRunner().invoke(cli, ["check", "--local", "--cluster-file", none])
    assert r.exit_code == 0 and r.stdout == "" and r.stderr.startswith("NOTE: ddpfix: no cluster file "), r.output
    r = CliRunner().invoke(cli, ["check", "--local", "--cluster-file", none, "--require-cluster-file"])
    assert r.exit_code == 2 and r.output.startswith("ERROR: ddpfix: cluster-file: ") and r.output.count("\n") == 1
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "gone.json")  # something is there: judged, never a silent pass
    r = CliRunner().invoke(cli, ["check", "--local", "--cluster-file", str(dangling)])
    assert r.exit_code == 2, r.output


def test_bad_cluster_file_is_one_nhc_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": clusterfile.SCHEMA, "nodes": [{"name": "a", "rank": "x"}]}))
    r = CliRunner().invoke(cli, ["check", "--local", "--cluster-file", str(bad)])
    assert r.exit_code == 2 and "nodes[0]" in r.output
    r = CliRunner().invoke(cli, ["check"])
    assert r.exit_code == 2


def test_node_facts_collector_loads_without_ansible_module_utils() -> None:
    mod = local.node_facts_module()
    assert callable(mod.collect) and callable(mod.resolve)
    import sys

    assert "ansible.module_utils.ddpfix_envfile" not in sys.modules  # the shims were only there while loading


# ------------------------------------------------------------ deadline: a blackholed resolver, a stuck collector

def _blackholed(answers: dict[str, list[str]], slow: set[str], hold: float = 30.0) -> Any:
    """A resolver like getaddrinfo behind a blackholed nameserver: the names in `slow` never answer in time."""
    import time

    def resolve(name: str) -> list[str]:
        if name in slow:
            time.sleep(hold)
        return list(answers.get(name) or [])

    return resolve


def test_resolve_all_is_parallel_and_never_calls_a_late_name_unresolvable() -> None:
    import time

    resolve = _blackholed({"a": ["10.0.0.1"], "b": ["10.0.0.2"]}, {"c", "d"})
    t0 = time.monotonic()
    answers, undecided = local.resolve_all(["a", "c", "b", "d"], resolve, local.Deadline(10), per_lookup=0.5)
    assert time.monotonic() - t0 < 2  # both stuck lookups ran at once, each given up after 0.5 s
    assert answers == {"a": ["10.0.0.1"], "b": ["10.0.0.2"]} and undecided == ["c", "d"]
    # more stuck names than workers: replacements start, the fast names behind them are still answered
    names = [f"s{i}" for i in range(4)] + ["a"]
    answers, undecided = local.resolve_all(names, _blackholed({"a": ["10.0.0.1"]}, set(names[:4])),
                                           local.Deadline(10), per_lookup=0.3, workers=2)
    assert answers == {"a": ["10.0.0.1"]} and undecided == names[:4]
    # the total deadline bounds everything, whatever the per-lookup timeout
    t0 = time.monotonic()
    answers, undecided = local.resolve_all(["c"], resolve, local.Deadline(0.4), per_lookup=5)
    assert time.monotonic() - t0 < 1.5 and answers == {} and undecided == ["c"]


def _check(tmp_path: Path, path: Path, *args: str) -> Any:
    import time

    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["check", "--local", "--cluster-file", str(path), *args])
    return r, time.monotonic() - t0


def test_check_local_with_a_blackholed_resolver_finishes_under_its_deadline(
        sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cluster_file(sim, tmp_path)
    facts = copy.deepcopy(sim.node("node2"))
    monkeypatch.setattr(local, "collect_local", lambda cluster, doc, node: ("node2", copy.deepcopy(facts)))
    answers = sim.probe("node2")["resolve"]
    # healthy, every peer answers: exit 0 (the same node, the same facts)
    monkeypatch.setattr(local.node_facts_module(), "resolve", _blackholed(answers, set()))
    r, _ = _check(tmp_path, path)
    assert r.exit_code == 0 and r.output == "", r.output
    # node3's name never answers: not evaluated (exit 3, one NHC line naming it), within --timeout; never a pass and
    # never "does not resolve"
    monkeypatch.setattr(local.node_facts_module(), "resolve", _blackholed(answers, {"node3"}))
    monkeypatch.setattr(local, "LOOKUP_TIMEOUT", 60.0)  # only the total deadline stops the wait here
    r, took = _check(tmp_path, path, "--timeout", "1.5")
    assert took < 3, took
    assert r.exit_code == 3, r.output
    assert r.output.startswith("ERROR: ddpfix: not-evaluated: peer name resolution not decided within 1.5 s")
    assert "node3" in r.output and "node1" not in r.output.split(":", 3)[3] and r.output.count("\n") == 1
    assert "peer-unresolvable:" not in r.output
    # a real failure is still reported first, exit 1; -v adds the undecided names
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    facts.update(resolve_self={"node2": ["127.0.1.1"]})
    r, took = _check(tmp_path, path, "--timeout", "1", "-v")
    assert took < 3 and r.exit_code == 1, r.output
    assert r.output.splitlines()[0].startswith(f"ERROR: ddpfix: {hosts_rules.HOSTNAME_LOOPBACK.id}: ")
    assert r.output.splitlines()[-1].startswith("ERROR: ddpfix: not-evaluated: ")


def test_check_local_stuck_reading_the_node_is_not_evaluated(
        sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    path = _cluster_file(sim, tmp_path)
    monkeypatch.setattr(local, "collect_local", lambda cluster, doc, node: time.sleep(30))
    r, took = _check(tmp_path, path, "--timeout", "1")
    assert took < 2.5 and r.exit_code == 3, (took, r.output)
    assert r.output.startswith("ERROR: ddpfix: not-evaluated: nothing decided within 1 s") and r.output.count("\n") == 1


# ------------------------------------------------------------ who may write the cluster file

@pytest.mark.parametrize(("target", "mode", "why"), [
    ("file", 0o664, "it is writable by its group (mode 0664)"),
    ("file", 0o646, "it is writable by others (mode 0646)"),
    ("dir", 0o777, "is writable by others (mode 0777)"),
    ("dir", 0o775, "is writable by its group (mode 0775)"),
])
def test_cluster_file_writable_by_others_is_refused_and_its_skips_ignored(
        sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, mode: int, why: str) -> None:
    # the file accepts node2's failure (skip_findings): obeyed from a trusted file only
    sim.set_var(None, ddp_skip_findings=[f"{hosts_rules.HOSTNAME_LOOPBACK.id}@node2"])
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    path = _cluster_file(sim, d)
    path.chmod(0o644)
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    facts = copy.deepcopy(sim.node("node2"))
    monkeypatch.setattr(local, "collect_local", lambda cluster, doc, node: ("node2", copy.deepcopy(facts)))
    monkeypatch.setattr(local.node_facts_module(), "resolve", _blackholed(sim.probe("node2")["resolve"], set()))
    r, _ = _check(tmp_path, path)
    assert r.exit_code == 0, r.output  # trusted: the accepted finding stays accepted
    (path if target == "file" else d).chmod(mode)
    try:
        r, _ = _check(tmp_path, path)
    finally:
        d.chmod(0o755)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"ERROR: ddpfix: cluster-file: cluster file {path}: refused: ") and why in r.output


def test_cluster_file_owned_by_another_user_is_refused() -> None:
    import os
    import stat

    def st(mode: int, uid: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))

    reg = stat.S_IFREG
    assert clusterfile.untrusted("it", st(reg | 0o644, 0)) is None
    assert clusterfile.untrusted("it", st(reg | 0o600, os.geteuid())) is None
    other = 4242 if os.geteuid() != 4242 else 4243
    assert clusterfile.untrusted("it", st(reg | 0o644, other)) == f"it is owned by uid {other}, not root"
    assert clusterfile.untrusted("it", st(reg | 0o666, 0)) == "it is writable by others (mode 0666)"


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="chown to another user needs root")
def test_cluster_file_chowned_to_a_user_is_refused(sim: Sim, tmp_path: Path) -> None:
    import os

    path = _cluster_file(sim, tmp_path)
    os.chown(path, 4242, 4242)
    r, _ = _check(tmp_path, path)
    assert r.exit_code == 2 and "refused: it is owned by uid 4242, not root" in r.output, r.output


def test_undecided_firewall_rule_fails_the_local_check(sim: Sim, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """check --local reads the same rules as the audit: an ipset DROP before the accept is a failure, never a pass."""
    path = _cluster_file(sim, tmp_path)
    rules = sim.node("node1")["firewall"]
    rules["iptables"] = ("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
                         "-A INPUT -p tcp -m tcp --dport 29500 -m set ! --match-set ok src -j DROP\nCOMMIT\n")
    got = local.failures(_local_findings(sim, path, "node1", monkeypatch))
    assert [f.id for f in got] == [firewall_rules.UNDECIDED.id]
    assert "--match-set ok src -j DROP" in got[0].evidence and got[0].severity.label == "error"


def test_node_scope_cluster_file_and_env_file_hold_per_node_values_only(sim: Sim, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """ddp_env_scope: node (a Slurm site's node-global files): the env file keeps the interfaces, no launch key; the
    cluster file carries the scope and the job port range; check --local passes on it, and flags a launch key left in
    the block (a job's values pinned in /etc)."""
    from ddpfix.plan import LAUNCH_KEYS

    sim.set_var(None, ddp_env_scope="node", ddp_job_port_range="21000-21999")
    path = _cluster_file(sim, tmp_path)
    cluster, doc = clusterfile.load(str(path))
    assert (cluster.env_scope, cluster.job_port_range) == ("node", "21000-21999")
    assert (doc["env_scope"], doc["job_port_range"]) == ("node", "21000-21999")
    managed = sim.node("node2")["env_file"]["managed"]
    assert managed["GLOO_SOCKET_IFNAME"] == "eth0" and not LAUNCH_KEYS & set(managed)
    assert [f.id for f in local.failures(_local_findings(sim, path, "node2", monkeypatch))] == []
    assert not [f for f in sim.findings() if f.id.startswith("env.")]
    # an old cluster-scope file on a node of a node-scope site: its per-job keys are reported
    sim.set_var(None, ddp_env_scope="cluster")
    sim.write_planned_env_files()
    sim.set_var(None, ddp_env_scope="node")
    found = [f for f in sim.findings() if f.id == env_rules.INCONSISTENT.id and f.host == "node2"]
    assert found and "MASTER_ADDR=" in found[0].evidence and "per job" in found[0].evidence


@pytest.mark.parametrize("var,value,needle", [
    ("ddp_env_scope", "job", "ddp_env_scope must be one of cluster, node, got 'job'"),
    ("ddp_job_port_range", "40000", "ddp_job_port_range must be a port range LO-HI"),
])
def test_node_scope_inputs_are_validated(sim: Sim, var: str, value: str, needle: str) -> None:
    from ddpfix.errors import DdpfixError

    sim.set_var(None, **{var: value})
    with pytest.raises(DdpfixError, match=needle):
        sim.cluster()
    sim.set_var(None, **{var: "node" if var == "ddp_env_scope" else "21000-21999"}, ddp_env_process_vars=True)
    if var == "ddp_env_scope":
        with pytest.raises(DdpfixError, match="ddp_env_scope: node keeps per node only"):
            sim.cluster()
