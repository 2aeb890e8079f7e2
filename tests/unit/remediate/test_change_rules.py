"""A change names the findings it fixes by its task's rule-id tags (read from the task's file: ansible-runner's events
carry the task's file and line, not its tags), never by parsing the task's name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddpfix.ansible.results import HostResult, RunResult, TaskResult, record_event
from ddpfix.ansible.tasktags import task_tags
from ddpfix.remediate import ENV_IDS, HOSTS_IDS, changes_of
from ddpfix.rules import host as host_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import registry as rules
from ddpfix.rules import time as time_rules

ROOT = Path(__file__).resolve().parents[3]
NOFILE = ROOT / "roles" / "ddpfix_limits" / "tasks" / "nofile.yml"
ARP = ROOT / "roles" / "ddpfix_sysctl" / "tasks" / "main.yml"


def _line(path: Path, what: str) -> int:
    """The line of the task whose name starts with `what`, or of the fix task whose name after its generated
    `Fix <ids> | ` does (where Ansible's task_path points)."""
    def name(ln: str) -> str:
        text = ln.lstrip("- ").removeprefix("name: ")
        return text.partition(" | ")[2] if text.startswith("Fix ") else text
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1)
                if ln.lstrip("- ").startswith("name: ") and name(ln).startswith(what))


def _event(host: str, task_path: str, res: dict[str, Any], *, task: str = "a task", kind: str = "runner_on_ok",
           action: str = "ansible.builtin.copy", role: str = "ddpfix_limits") -> dict[str, Any]:
    """An event as ansible-runner records it (the keys record_event reads; its display callback sets task_path)."""
    return {"event": kind, "created": "2026-12-02T12:00:00.000000", "uuid": "e1",
            "event_data": {"host": host, "task": task, "task_path": task_path, "task_action": action.rsplit(".", 1)[-1],
                           "resolved_action": action, "role": role, "res": res, "start": "", "end": ""}}


def test_a_recorded_event_carries_its_tasks_tags() -> None:
    hosts: dict[str, HostResult] = {}
    line = _line(NOFILE, "Write")
    record_event(hosts, _event("node2", f"{NOFILE}:{line}", {"changed": True}, task="Write the limits file"))
    assert hosts["node2"].tasks[0].tags == ("nofile", host_rules.NOFILE_LOW.id)
    # a task inside a block: the block's tags too
    record_event(hosts, _event("node2", f"{ROOT / 'roles/ddpfix_chrony/tasks/main.yml'}:"
                                        f"{_line(ROOT / 'roles/ddpfix_chrony/tasks/main.yml', 'Create')}",
                               {"changed": False}, kind="runner_on_skipped", role="ddpfix_chrony"))
    # (every id ddpfix_chrony fixes: its block carries them; the ids are generated from the registry)
    assert set(hosts["node2"].tasks[1].tags) == rules.role_ids("ddpfix_chrony") >= {time_rules.NO_DAEMON.id,
                                                                               time_rules.UNSYNCHRONIZED.id}


def test_changes_carry_rule_ids_from_tags_not_from_task_names(tmp_path: Path) -> None:
    hosts: dict[str, HostResult] = {}
    nofile = f"{NOFILE}:{_line(NOFILE, 'Write')}"
    arp = f"{ARP}:{_line(ARP, 'Write')}"
    record_event(hosts, _event("node2", nofile, {"changed": True, "diff": {"before": "", "after": "x\n"}},
                               task="a name that names no finding"))
    record_event(hosts, _event("node3", arp, {"changed": True}, task=f"Fix {hosts_rules.PEER_MISMATCH.id} | misleading name",
                               role="ddpfix_sysctl"))
    record_event(hosts, _event("node3", arp, {"changed": False}, role="ddpfix_sysctl"))  # not a change
    files = {"changed": True, "files": [{"what": "Managed /etc/hosts block", "key": "hosts", "changed": True, "diff": {}},
                       {"what": "Managed block in /etc/ddpfix/ddp.env", "key": "env", "changed": True, "diff": {}},
                       {"what": "cluster file", "key": "cluster_file", "changed": False, "diff": {}},
                       {"what": "something new", "key": ["not", "a", "key"], "changed": True, "diff": {}}]}
    record_event(hosts, _event("node1", "/nonexistent/remediate.yml:12", files,
                               action="ddpfix.cluster.ddpfix_node_files", role=""))
    got = [(c.host, c.task, c.rules) for c in changes_of(RunResult("successful", 0, {}, hosts, tmp_path, 1.0))]
    assert got == [
        ("node1", "Managed /etc/hosts block", tuple(sorted(HOSTS_IDS))),
        ("node1", "Managed block in /etc/ddpfix/ddp.env", tuple(sorted(ENV_IDS))),
        ("node1", "something new", ()),
        ("node2", "a name that names no finding", (host_rules.NOFILE_LOW.id,)),  # role tags (nofile) are no rule ids
        ("node3", f"Fix {hosts_rules.PEER_MISMATCH.id} | misleading name", (net_rules.ARP_FLUX.id,)),
    ]


def test_task_tags_of_a_file(tmp_path: Path) -> None:
    play = tmp_path / "play.yml"
    play.write_text("""---
- name: A play
  hosts: all
  tags: [play]
  tasks:
    - name: Own tags, a string
      ansible.builtin.debug:
      tags: one, two
    - name: A block
      tags: [blk, play]
      block:
        - name: Inside
          ansible.builtin.debug:
          tags: inner
      rescue:
        - name: Rescued
          ansible.builtin.debug:
    - name: Templated tags are not read
      ansible.builtin.debug:
      tags: ["{{ x }}", real]
""")
    want = {"A play": ("play",), "Own tags, a string": ("play", "one", "two"), "A block": ("play", "blk"),
            "Inside": ("play", "blk", "inner"), "Rescued": ("play", "blk"), "Templated tags are not read": ("play", "real")}
    assert {name: task_tags(f"{play}:{_line(play, name)}") for name in want} == want
    assert task_tags(f"{play}:3") == task_tags(f"{play}:999") == ()  # no task starts there
    for bad in ("", "no-line", f"{play}:x", f"{tmp_path}/missing.yml:2", f"{tmp_path}:2"):
        assert task_tags(bad) == ()
    broken = tmp_path / "broken.yml"
    broken.write_text("- name: [unclosed\n")
    assert task_tags(f"{broken}:1") == ()
    # a file rewritten is read again
    play.write_text("- name: Now\n  tags: [new]\n")
    assert task_tags(f"{play}:1") == ("new",)


def test_task_result_without_a_task_path_has_no_tags() -> None:
    hosts: dict[str, HostResult] = {}
    ev = _event("n1", "", {"changed": True})
    del ev["event_data"]["task_path"]
    record_event(hosts, ev)
    assert hosts["n1"].tasks == [TaskResult("a task", "changed", {"changed": True}, "2026-12-02T12:00:00.000000", "",
                                            "", "ansible.builtin.copy", "ddpfix_limits", ())]
