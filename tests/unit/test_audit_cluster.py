"""The audit reads the inventory once, in ansible-playbook: its first task (action ddpfix_cluster) derives and
validates the cluster, and the CLI builds its own view from that task's result (`ddpfix.audit.cluster_of_run`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import ddpfix.audit as audit
from ddpfix.ansible.results import HostResult, RunResult, TaskResult
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.derive import cluster_from_hostvars, cluster_from_inventory_data, inventory_data_from_hostvars
from ddpfix.progress import Progress
from ddpfix.rules.context import unread_of

ROOT = Path(__file__).resolve().parents[2]
GROUPS = {"ddp_nodes": {"hosts": ["n1", "n2", "n3"]}, "all": {"children": ["ddp_nodes"]}}
HOSTVARS: dict[str, dict[str, Any]] = {
    "n1": {"ansible_host": "10.0.0.1", "ddp_master": "n2", "ddp_master_port": 29600, "ansible_user": "x"},
    "n2": {"ansible_host": "10.0.0.2", "ddp_master": "n2", "ddp_master_port": 29600, "ddp_cluster_cidr": "10.0.0.0/24"},
    "n3": {"ansible_host": "10.0.0.3", "ddp_master": "n2", "ddp_master_port": 29600},
}


def _run(*tasks: TaskResult, host: str = "n1") -> RunResult:
    return RunResult(status="successful", rc=0, stats={}, hosts={host: HostResult(name=host, tasks=list(tasks))},
                     run_dir=Path("/nonexistent"), seconds=0.0)


def _cluster_task(status: str, res: dict[str, Any]) -> TaskResult:
    return TaskResult("Cluster view", status, res, action="ddpfix.cluster.ddpfix_cluster")


def test_the_play_hands_the_cli_the_same_cluster() -> None:
    data = inventory_data_from_hostvars(GROUPS, HOSTVARS)
    assert data["_meta"]["hostvars"]["n1"] == {"ansible_host": "10.0.0.1", "ddp_master": "n2", "ddp_master_port": 29600}
    got = audit.cluster_of_run(_run(_cluster_task("ok", {"inventory": data})), ["inv.yml"])
    want = cluster_from_hostvars(GROUPS, HOSTVARS, ["inv.yml"])
    assert got == want and got.master == "n2" and got.names[0] == "n2" and got.inventories == ("inv.yml",)


def test_invalid_input_found_in_the_play_is_the_cli_error_with_its_exit_code() -> None:
    bad = {**HOSTVARS, "n1": {**HOSTVARS["n1"], "ddp_master": "nX"}}
    with pytest.raises(DdpfixError) as want:
        cluster_from_inventory_data(inventory_data_from_hostvars(GROUPS, dict.fromkeys(bad, bad["n1"])))
    res = {"failed": True, "msg": str(want.value), "ddpfix_exit_code": int(want.value.code)}
    with pytest.raises(DdpfixError) as got:
        audit.cluster_of_run(_run(_cluster_task("failed", res)), ["inv.yml"])
    assert str(got.value) == str(want.value) and got.value.code == ExitCode.INVALID_INPUT


def test_without_the_task_the_inventory_is_read_by_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[tuple[str, ...]] = []

    def load(inventories: Any) -> Any:
        read.append(tuple(inventories))
        raise DdpfixError("cannot read inventory inv.yml: broken")

    monkeypatch.setattr(audit, "load_cluster", load)
    skipped = _cluster_task("skipped", {"skipped": True})
    with pytest.raises(DdpfixError, match="cannot read inventory"):
        audit.cluster_of_run(_run(skipped), ["inv.yml"])
    assert read == [("inv.yml",)]


def test_cluster_passed_by_the_cli_skips_the_play_task() -> None:
    c = cluster_from_hostvars(GROUPS, HOSTVARS)
    given = audit.audit_extravars(c, True, 2, 2.0, 8, probe_port=45000)["ddpfix_audit_cluster"]
    assert given == {"master": "n2", "master_port": 29600, "cluster_cidr": "10.0.0.0/24", "env_path": c.env_path,
                     "order": ["n2", "n1", "n3"], "addresses": {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}}
    derived = audit.audit_extravars(None, True, 2, 2.0, None, probe_port=45000)
    assert "ddpfix_audit_cluster" not in derived and derived["ddpfix_facts_forks"] == audit.MAX_DEFAULT_FORKS
    playbook = (ROOT / "playbooks" / "audit.yml").read_text()
    assert "when: ddpfix_audit_cluster is not defined" in playbook


def test_the_collect_round_runs_only_where_a_prober_was_detached() -> None:
    """The facts role's second round (collect a detached prober) is skipped on a node that left none (every node ran
    at once); the CLI leaves the round's tag alone."""
    tasks = yaml.safe_load((ROOT / "roles" / "ddpfix_facts" / "tasks" / "collect.yml").read_text())
    (collect,) = [t for t in tasks if "ddpfix_facts_collect" in (t.get("tags") or [])]
    when = "(ansible_facts.ddpfix_node.probe.result_path | default(none)) is not none"
    assert collect["when"] == when
    assert "ddpfix_facts_collect" not in audit.CLI_SKIP_TAGS
    # more.yml (main.yml's second half) includes each file only where it is needed: a second probe round, or a
    # detached prober to collect
    main = yaml.safe_load((ROOT / "roles" / "ddpfix_facts" / "tasks" / "more.yml").read_text())
    includes = {t["ansible.builtin.include_tasks"]["file"]: t["when"] for t in main}
    assert includes["collect.yml"] == when and "ddpfix_facts_probe_from_facts" in includes["probe_cluster.yml"]


def test_facts_role_halves_run_in_the_role_and_in_the_audit_plays() -> None:
    """The facts role's main.yml runs both halves (facts.yml, then more.yml: second probe round or collect) for a
    direct user of the role; audit.yml runs them in two plays, the second one's hosts templated once by the filter
    ddpfix_facts_more (no host when the cluster needs neither), with the same view of the cluster as the first."""
    tasks = ROOT / "roles" / "ddpfix_facts" / "tasks"
    main = yaml.safe_load((tasks / "main.yml").read_text())
    assert [t["ansible.builtin.import_tasks"] for t in main] == ["facts.yml", "more.yml"]
    facts = yaml.safe_load((tasks / "facts.yml").read_text())
    assert any("ddpfix.cluster.ddpfix_node_facts" in t for t in facts)
    assert not any("ansible.builtin.include_tasks" in t for t in facts)  # no skipped round in the facts play
    plays = yaml.safe_load((ROOT / "playbooks" / "audit.yml").read_text())
    facts_play, cluster_play = plays[0], plays[1]
    assert facts_play["tasks"][-1]["ansible.builtin.import_role"]["tasks_from"] == "facts"
    # the second probe round a play of its own: a fleet (forks below the nodes, one network) pays no round of
    # skipped second-probe tasks over its nodes; no play collects probers (the rolling probe: one round per node)
    for play, part in ((cluster_play, "probe_cluster"),):
        # included: the role is loaded only when the play has hosts; `always`, so the CLI's --tags run it
        assert play["tasks"][0]["ansible.builtin.include_role"]["tasks_from"] == part
        assert _cli_runs(play["tasks"][0]["tags"])
        assert "ddpfix.cluster.ddpfix_facts_more(" in play["hosts"] and play["vars"] == facts_play["vars"]
        assert play["strategy"] == facts_play["strategy"] == "linear"
    assert "'cluster') else []" in cluster_play["hosts"]
    assert not any((t.get("ansible.builtin.import_role") or {}).get("tasks_from") == "collect"
                   for p in plays for t in p["tasks"])


def test_progress_adds_hosts_as_they_start_when_not_known_before() -> None:
    p = Progress(None, "t", enabled=True)
    p.on_event({"event": "runner_on_ok", "event_data": {"host": "n1", "res": {}}})
    assert p.rows == {}
    p.on_event({"event": "runner_on_start", "event_data": {"host": "n1", "task": "facts"}})
    p.on_event({"event": "runner_on_ok", "event_data": {"host": "n1", "res": {}}})
    assert p.rows == {"n1": {"state": "ok", "task": "facts", "done": 1}}
    known = Progress(["n1"], "t", enabled=True)
    known.on_event({"event": "runner_on_start", "event_data": {"host": "localhost", "task": "analysis"}})
    assert list(known.rows) == ["n1"]


def test_progress_draws_at_its_refresh_rate_not_at_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event updates its host's row only: the table (every host's row) is built when rich refreshes the screen
    (get_renderable), so a run's controller work per event does not grow with the number of hosts."""
    import io

    from rich.console import Console

    built: list[int] = []
    table = Progress._table

    def counted(self: Progress) -> Any:
        built.append(len(self.rows))
        return table(self)

    monkeypatch.setattr(Progress, "_table", counted)
    monkeypatch.setattr("rich.console.Console", lambda **kw: Console(file=io.StringIO(), force_terminal=True))
    hosts = [f"n{i}" for i in range(300)]
    with Progress(hosts, "t", enabled=True) as p:
        live = p._live
        assert live is not None and live.auto_refresh
        live.stop()  # no refresh thread: only the events draw, if anything does
        built.clear()
        for h in hosts:
            for kind in ("runner_on_start", "runner_on_ok"):
                p.on_event({"event": kind, "event_data": {"host": h, "task": "t", "res": {"changed": True}}})
        assert built == [] and all(r["state"] == "changed" for r in p.rows.values())
    assert p._table().row_count == 300


def test_closing_the_pty_of_an_exited_child_does_not_sleep() -> None:
    import ptyprocess

    from ddpfix.ansible.run import _no_close_delay_after_exit

    _no_close_delay_after_exit()
    _no_close_delay_after_exit()  # once only
    child = ptyprocess.PtyProcess.spawn(["true"])
    while child.isalive():
        time.sleep(0.01)
    t0 = time.monotonic()
    child.close()
    assert time.monotonic() - t0 < 0.05 and child.closed
    alive = ptyprocess.PtyProcess.spawn(["sleep", "30"])
    alive.close(force=True)  # a live child is still terminated
    assert not alive.isalive()


def _facts_task(probe: dict[str, Any]) -> TaskResult:
    return TaskResult("Lock | facts", "ok", {"ansible_facts": {"ddpfix_node": {"hostname": "n1", "probe": probe}}},
                      action="ddpfix.cluster.ddpfix_node_facts")


def _collect_task(status: str, probe: dict[str, Any]) -> TaskResult:
    return TaskResult("Lock | collect", status, {"probe": probe}, action="ddpfix.cluster.ddpfix_probe")


def test_cli_folds_the_collected_probe_as_the_roles_set_fact_does() -> None:
    """The CLI leaves the fold set_fact out (--skip-tags ddpfix_facts_fold) and folds the collect task's result into
    the facts itself: the same facts as with the set_fact, never folded twice, nothing from a failed collect."""
    role = (ROOT / "roles" / "ddpfix_facts" / "tasks" / "collect.yml").read_text()
    assert "ddpfix_facts_fold" in audit.CLI_SKIP_TAGS and "tags: [ddpfix_facts_fold]" in role
    detached = {"mode": "detached", "result_path": "/run/ddpfix-probe-x/result.json", "pid": 7}
    result = {"connects": [{"ok": True}], "inbound": {"peer": 2}}
    folded = {"hostname": "n1", "probe": {**detached, **result}}
    hr = HostResult("n1", tasks=[_facts_task(detached), _collect_task("ok", result)])
    assert audit.fold_collected(hr, hr.fact("ddpfix_node")) == folded
    assert audit.host_facts_of(hr).probe == folded["probe"]
    # with the set_fact (ansible-playbook, or a CLI that ran it): its facts are the last, taken as they are
    kept = TaskResult("Probe | Keep", "ok", {"ansible_facts": {"ddpfix_node": folded}}, action="set_fact")
    hr2 = HostResult("n1", tasks=[_facts_task(detached), _collect_task("ok", result), kept])
    assert audit.fold_collected(hr2, hr2.fact("ddpfix_node")) == folded
    # a collect that failed or was skipped, or none at all (one round): the facts as the node returned them
    for tasks in ([_facts_task(detached), _collect_task("failed", {"error": "x"})],
                  [_facts_task(detached), _collect_task("skipped", {})], [_facts_task(result)]):
        hr3 = HostResult("n1", tasks=list(tasks))
        assert audit.fold_collected(hr3, hr3.fact("ddpfix_node")) == tasks[0].res["ansible_facts"]["ddpfix_node"]
    assert audit.fold_collected(HostResult("n1"), None) is None




def _cli_runs(tags: list[str]) -> bool:
    """Whether ansible-playbook runs a task so tagged with the CLI's --tags and --skip-tags (Ansible's rules: a
    skipped tag wins, `always` runs unless skipped, `never` only when another of its tags is asked for)."""
    if set(tags) & set(audit.CLI_SKIP_TAGS):
        return False
    return bool(set(tags) & set(audit.CLI_TAGS)) or "always" in tags


def test_cli_runs_the_unregistered_facts_task_and_every_other_task_it_needs() -> None:
    """The facts task twice, the same call: registered for runs without the CLI (the analysis task reads the
    results from it), unregistered for the CLI (it reads them from its events: a registered result is templated once
    more in the worker). Exactly one runs in each; every other task the CLI's audit needs stays selected under its
    --tags (it is `always`)."""
    tasks = yaml.safe_load((ROOT / "roles" / "ddpfix_facts" / "tasks" / "facts.yml").read_text())
    calls = [t for t in tasks if "ddpfix.cluster.ddpfix_node_facts" in t]
    registered, events = calls
    assert registered["register"] == "ddpfix_facts_result" and "register" not in events
    for key in ("ddpfix.cluster.ddpfix_node_facts", "args", "check_mode", "changed_when", "name"):
        assert registered[key] == events[key], key
    assert _cli_runs(events["tags"]) and not _cli_runs(registered["tags"])
    # without the CLI (no --tags): `never` leaves the twin out, the registered task runs
    assert "never" in events["tags"] and "never" not in registered["tags"]
    # the CLI's audit: the cluster task, the probe round at cluster addresses, and nothing it reads from a fact
    # cache or a set_fact of its own
    plays = yaml.safe_load((ROOT / "playbooks" / "audit.yml").read_text())
    cluster = [t for t in plays[0]["tasks"] if "ddpfix.cluster.ddpfix_cluster" in t]
    assert [_cli_runs(t["tags"]) for t in cluster] == [True]
    probe = yaml.safe_load((ROOT / "roles" / "ddpfix_facts" / "tasks" / "probe_cluster.yml").read_text())
    assert all(_cli_runs(t["tags"]) for t in probe)
    assert [t["name"] for t in tasks if not _cli_runs(t.get("tags") or [])] == [
        "Facts | Controller clock before the facts (the start of the window the node reads its clock in)",
        registered["name"],
        "Facts | Controller clock window of the facts (kept with them in a fact cache, for the clock-skew check)"]


def test_a_nodes_packed_hosts_lines_become_its_hosts_file_entries() -> None:
    """The facts module sends /etc/hosts as one string (`hosts_lines`); the one conversion (`host_facts`, for the
    CLI's events and the analyze action's hostvars alike) gives the checks the entries, parsed on the controller,
    and no `hosts_lines`. Facts recorded or saved in the entries' form stay as they are."""
    entries = [{"line": 2, "addr": "10.0.0.2", "names": ["node2", "n2"], "text": "10.0.0.2\tnode2 n2  # x"}]
    wire = {"schema": 2, "hostname": "node1", "hosts_lines": "2\t10.0.0.2\tnode2 n2  # x\nbad row",
            "hosts_file_scope": "whole"}
    got = audit.host_facts("node1", wire)
    assert got.node is not None and got.node.get("hosts_file") == entries and "hosts_lines" not in got.node
    assert got.node.get("schema") == 1  # the form the checks read
    assert wire["hosts_lines"].startswith("2\t")  # the module's result itself is not changed
    old = audit.host_facts("node1", {"hostname": "node1", "hosts_file": entries})
    assert old.node is not None and old.node.get("hosts_file") == entries
    hostile = audit.host_facts("node1", {"hostname": "node1", "hosts_lines": {"2": "10.0.0.2 node2"}})
    assert hostile.node is not None and hostile.node.get("hosts_file") == []
    # ... and /etc/hosts reads as not read (its checks are not evaluated), never as an empty file that passes
    assert "hosts_file" in unread_of(hostile.node) and "dict" in unread_of(hostile.node)["hosts_file"]
    assert "hosts_file" not in unread_of(got.node)
