"""The rule registry (ddpfix.rules) is the one source: role tags, the remediate playbook, the plan and the docs agree."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from unit_helpers import ROOT

from ddpfix.remediate import HostPlan
from ddpfix.rules import env as env_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import netif as netif_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import registry as rules
from ddpfix.rules import time as time_rules
from ddpfix.rules.registry import RULES

ID_TAG = re.compile(r"^[a-z]+\.[a-z0-9-]+$")  # a dotted finding id (role tags like `env` or `always` are not)


def _tasks(items: list[dict[str, Any]] | None, inherited: frozenset[str] = frozenset()) -> list[tuple[str, set[str]]]:
    """(task name, its tags with those of enclosing blocks) for every task, blocks' own entries included."""
    out: list[tuple[str, set[str]]] = []
    for t in items or []:
        tags = set(t.get("tags") or []) if isinstance(t.get("tags"), list) else {t["tags"]} if t.get("tags") else set()
        tags |= inherited
        out.append((str(t.get("name", "")), tags))
        for key in ("block", "rescue", "always"):
            out += _tasks(t.get(key), frozenset(tags))
    return out


def role_tasks(role: str) -> list[tuple[str, set[str]]]:
    out: list[tuple[str, set[str]]] = []
    for p in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
        out += _tasks(yaml.safe_load(p.read_text()))
    return out


def all_roles() -> list[str]:
    return sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())


def test_every_fixable_rule_tags_a_task_of_its_remedy_role() -> None:
    missing = [f"{r.id} -> {m.role}" for r in RULES.values() for m in r.remedies
               if not any(r.id in tags for _, tags in role_tasks(m.role))]
    assert not missing, f"no task of the remedy role is tagged with the rule id: {missing}"


def test_no_task_carries_an_id_tag_that_is_not_a_fixable_rule_of_its_role() -> None:
    bad = []
    for role in all_roles():
        for name, tags in role_tasks(role):
            for tag in sorted(t for t in tags if ID_TAG.match(t)):
                if tag not in RULES or role not in {m.role for m in RULES[tag].remedies}:
                    bad.append(f"{role}: {name!r} tagged {tag}")
    assert not bad, bad


def test_remediate_playbook_reaches_each_role_with_every_id_it_fixes() -> None:
    """`ansible-playbook playbooks/remediate.yml --tags ID` runs the include of ID's role (include_role passes the
    tag filter on to the role's tasks, which carry the id too), or, for the hosts, env and limits roles, the one task
    that writes their files (ddpfix_node_files, tagged with the three roles' ids)."""
    plays = yaml.safe_load((ROOT / "playbooks" / "remediate.yml").read_text())
    included: dict[str, set[str]] = {}
    for play in plays:
        stack = list(play.get("tasks") or [])
        while stack:
            t = stack.pop()
            for key in ("block", "rescue", "always"):
                stack += t.get(key) or []
            inc = t.get("ansible.builtin.include_role") or t.get("include_role")
            role = str((inc or {}).get("name", "")).split(".")[-1]  # ddpfix.cluster.ddpfix_hosts -> ddpfix_hosts
            if inc and role != "ddpfix_run":
                included.setdefault(role, set()).update(t.get("tags") or [])
            if "ddpfix.cluster.ddpfix_node_files" in t:  # the hosts, env and limits roles' files, in one task
                for role in ("ddpfix_hosts", "ddpfix_env", "ddpfix_limits"):
                    included.setdefault(role, set()).update(set(t.get("tags") or []) & (rules.role_ids(role)
                                                                                          | {role[7:]}))
    for role in {m.role for r in RULES.values() for m in r.remedies}:
        assert role in included, f"{role} is not included by playbooks/remediate.yml"
        assert rules.role_ids(role) <= included[role], (role, sorted(rules.role_ids(role) - included[role]))
    for role, tags in included.items():
        assert {t for t in tags if ID_TAG.match(t)} <= rules.role_ids(role), role


def test_every_remedy_names_a_role_and_a_plan_field() -> None:
    fields = {f.name for f in dataclasses.fields(HostPlan)}
    for r in RULES.values():
        for m in r.remedies:
            assert (ROOT / "roles" / m.role / "tasks" / "main.yml").is_file(), (r.id, m.role)
            assert m.plan in fields, (r.id, m.plan)


def test_registry_is_well_formed() -> None:
    assert len(set(RULES)) == len(list(RULES))
    for r in RULES.values():
        assert ID_TAG.match(r.id), r.id
        assert r.title and "\n" not in r.title and r.fix, r.id
        assert not re.search(r"\b(IF|NAME)\b|=N\b", r.fix), r.id  # placeholders are {fields}, filled per finding
    assert rules.fixable_ids() == [r.id for r in RULES.values() if r.fixable]
    assert set(rules.fixed_by("firewall")) == set(rules.role_ids("ddpfix_firewall"))


def test_docs_findings_table_is_the_registry() -> None:
    """docs/findings/index.md's table: one row per rule, in registry order, each linking the rule's own page."""
    from tools import docs

    text = (ROOT / "docs" / "findings" / "index.md").read_text()
    table = docs.current(text, "rules")
    assert table is not None, "docs/findings/index.md has no generated `rules` region"
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == list(RULES), (
        "docs/findings/index.md's findings table differs from the registry: regenerate it with "
        "`PYTHONPATH=controller .venv/bin/python -m tools.generate`")
    assert all(f"]({fid}.md)" in table and (ROOT / "docs" / "findings" / f"{fid}.md").is_file() for fid in RULES)


def test_docs_generated_regions_are_current() -> None:
    """Every generated docs region (the findings table, the lab's scenario list as `lab up --help` prints it, the
    failures explain names) and every finding's page."""
    from tools import docs

    assert not docs.stale(ROOT), (
        "a generated docs region or page is stale: `PYTHONPATH=controller .venv/bin/python -m tools.generate`")
    assert "fabric-memlock-low" in (docs.current((ROOT / "docs" / "lab.md").read_text(), "lab-scenarios") or "")


def test_markdown_generator_runs_as_a_module() -> None:
    import subprocess
    import sys

    env = {"PYTHONPATH": str(ROOT / "controller"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "ddpfix.rules", "--markdown"], capture_output=True, text=True,
                         env=env, check=True, cwd=str(ROOT)).stdout
    assert out == rules.markdown()


def test_a_check_reporting_an_undeclared_id_fails_loudly() -> None:
    from unit_helpers import Sim

    from ddpfix.rules import engine as checks
    from ddpfix.rules.registry import finding

    reg = rules.Registered(lambda ctx: iter([finding(time_rules.SKEW.id, None, "m", "e")]), (RULES[env_rules.MISSING.id],))
    rules._CHECKS.append(reg)
    try:
        try:
            checks.run_checks(Sim().context())
        except AssertionError as exc:
            assert time_rules.SKEW.id in str(exc)
        else:
            raise AssertionError("undeclared id accepted")
    finally:
        rules._CHECKS.remove(reg)


def test_only_accepts_fixable_ids(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ddpfix.cli import cli

    inv = tmp_path / "hosts.yml"
    inv.write_text("ddp_nodes:\n  hosts: {a: {}, b: {}}\n")
    r = CliRunner().invoke(cli, ["-i", str(inv), "remediate", "--only", net_rules.SOMAXCONN_LOW.id])
    assert r.exit_code == 2 and f"detect-only): {net_rules.SOMAXCONN_LOW.id}" in r.output, r.output
    r = CliRunner().invoke(cli, ["remediate", "--help"])
    assert hosts_rules.HOSTNAME_LOOPBACK.id in r.output


def test_causes_graph_is_declared_on_the_rules() -> None:
    """Rule.explains is the causes graph (ddpfix.causes reads it): each consequence's causes in precedence order."""
    assert rules.explained_by() == {
        probes_rules.MASTER_PORT_UNREACHABLE.id: [(firewall_rules.MASTER_PORT_BLOCKED.id, "master"),
                                                  (firewall_rules.EGRESS_BLOCKED.id, "dialler"),
                                                  (net_rules.VIA_GATEWAY.id, "host")],
        probes_rules.PEER_UNREACHABLE.id: [(firewall_rules.PEER_PORTS_BLOCKED.id, "target"),
                                           (firewall_rules.EGRESS_BLOCKED.id, "dialler"),
                                           (net_rules.VIA_GATEWAY.id, "dialler")],
        hosts_rules.PEER_UNRESOLVABLE.id: [(hosts_rules.PEER_UNRESOLVABLE.id, "host")],
        hosts_rules.PEER_MISMATCH.id: [(hosts_rules.PEER_MISMATCH.id, "host")],
        time_rules.SKEW.id: [(time_rules.NO_DAEMON.id, "any"), (time_rules.UNSYNCHRONIZED.id, "any")],
        netif_rules.MISSING.id: [(netif_rules.NAME_MISMATCH.id, "any")],
        env_rules.INCONSISTENT.id: [(env_rules.INCONSISTENT.id, "cluster")],
    }
    assert rules.unseen_if_unexplained() == {probes_rules.MASTER_PORT_UNREACHABLE.id, probes_rules.PEER_UNREACHABLE.id}


def test_check_local_leaves_out_the_rules_one_node_cannot_judge() -> None:
    """`check --local` reports node-scoped rules only: comparisons between nodes and the idle-only port check are out."""
    assert rules.scoped("cluster", "idle") == {
        probes_rules.PORT_IN_USE.id, time_rules.SKEW.id, netif_rules.MTU_MISMATCH.id, netif_rules.NAME_MISMATCH.id, hosts_rules.DUPLICATE_HOSTNAME.id,
        hosts_rules.DUPLICATE_MACHINE_ID.id, hosts_rules.FAMILY_MISMATCH.id}


def test_a_rule_with_an_unknown_scope_or_where_is_refused() -> None:
    with pytest.raises(ValueError, match="scope"):
        rules.Rule("x.y", rules.Severity.INFO, "t", "f", scope="everywhere")
    with pytest.raises(ValueError, match="where"):
        rules.Rule("x.y", rules.Severity.INFO, "t", "f", explains=(rules.Explains(time_rules.SKEW.id, "nearby"),))


def test_fix_task_tags_are_generated_from_the_registry() -> None:
    """The rule-id tags of the roles' fix tasks and of remediate.yml are the registry's (Remedy.tags)."""
    from tools import tags

    assert not tags.stale(ROOT), (
        "role or remediate.yml tags differ from the registry: `PYTHONPATH=controller .venv/bin/python -m tools.generate` "
        "regenerates them")


def test_run_tag_conditions_are_generated_from_the_registry() -> None:
    """remediate.yml's `intersect([...])` lists (was this group asked for by --tags) hold the group's ids, as its
    tag lists do; a list without an id (`ansible_skip_tags | intersect(['env'])`) is left alone."""
    from tools import tags

    text = ("  x: >-\n    {{ t | intersect(['hosts', 'hosts.gone']) | length > 0\n"
            "       and s | intersect(['hosts']) | length == 0 }}\n")
    got = tags.sync_text(text, None)
    lists = [[i.strip(" '\n") for i in m.group("items").split(",")] for m in tags._INTERSECT.finditer(got)]
    assert lists == [["hosts", *tags._ids(["hosts"], None)], ["hosts"]]
    assert "hosts.gone" not in got and all(len(line) <= tags.WIDTH for line in got.splitlines())
    assert tags.sync_text(got, None) == got
