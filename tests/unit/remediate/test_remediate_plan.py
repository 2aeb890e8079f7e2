"""build_plan and the pre-flight refusals on recorded facts with partial reads (--limit, a node down)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from unit_helpers import Sim

from ddpfix import clusterfile
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.remediate import (
    PREFLIGHT_STEP,
    HostPlan,
    build_plan,
    facts_preflight,
    preflight,
    preview,
    remediate_checked,
    remediate_extravars,
)
from ddpfix.rules import env as env_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import reachability as reachability_rules
from ddpfix.rules.context import Context, HostFacts
from ddpfix.rules.engine import run_checks


def _ctx(sim: Sim, read: list[str], down: tuple[str, ...] = ()) -> Context:
    hosts = {}
    for n in read:
        d = sim.docs[n]
        hosts[n] = (HostFacts(n, reachable=False, error="ssh: connection refused") if n in down
                    else HostFacts(n, node=d["node"], probe=d["probe"], collected_at=d["collected_at"]))
    return Context(sim.cluster(), hosts)


def test_limit_plans_env_for_read_nodes_with_whole_cluster_values(sim: Sim) -> None:
    ctx = _ctx(sim, ["node2"])
    _, refusals = build_plan(ctx, run_checks(ctx))
    assert any("the master node1 was not read" in r and "set ddp_cluster_cidr" in r for r in refusals), refusals
    sim.set_var(None, ddp_cluster_cidr="192.168.77.0/24")
    ctx = _ctx(sim, ["node2"])
    findings = run_checks(ctx)
    assert not [f for f in findings if f.id in (reachability_rules.UNREACHABLE.id, env_rules.INCONSISTENT.id)]
    plans, refusals = build_plan(ctx, findings)
    assert refusals == [] and set(plans) == {"node2"}
    env = plans["node2"].env
    assert env["NNODES"] == env["PET_NNODES"] == "3" and env["NODE_RANK"] == env["PET_NODE_RANK"] == "1"
    assert env["MASTER_ADDR"] == "192.168.77.11"


def test_master_limited_out_and_not_in_cidr_refuses_env(sim: Sim) -> None:
    sim.set_var("node1", ansible_host="node1.example")
    ctx = _ctx(sim, ["node2", "node3"])
    plans, refusals = build_plan(ctx, run_checks(ctx))
    assert not any(p.env for p in plans.values())
    assert any("MASTER_ADDR unknown: the master node1 was not read" in r for r in refusals), refusals


def test_down_node_keeps_its_hosts_line(sim: Sim) -> None:
    ctx = _ctx(sim, ["node1", "node2", "node3"], down=("node3",))
    sim_findings = run_checks(ctx)
    entries = remediate_extravars(ctx, {})["ddpfix_hosts"]
    assert {"address": "192.168.77.13", "names": ["node3"]} in entries
    assert [f.host for f in sim_findings if f.id == reachability_rules.UNREACHABLE.id] == ["node3"]


def test_hosts_fix_refused_when_an_unread_node_has_no_address(sim: Sim) -> None:
    sim.set_hosts_file("node1", "127.0.0.1 localhost\n198.51.100.7 node2\n")  # hosts_rules.PEER_MISMATCH on node1
    sim.probe("node1")["resolve"]["node2"] = ["198.51.100.7"]
    sim.set_var("node3", ansible_host="node3.example")
    ctx = _ctx(sim, ["node1", "node2"])
    findings = run_checks(ctx)
    assert any(f.id == hosts_rules.PEER_MISMATCH.id for f in findings)
    plans, refusals = build_plan(ctx, findings)
    assert not any(p.hosts for p in plans.values())
    assert any("/etc/hosts block not written: node3 not read" in r for r in refusals), refusals


def test_preflight_refuses_bad_facts_and_unacknowledged_broad_cidr(sim: Sim) -> None:
    from ddpfix.remediate import HostPlan

    sim.node("node2")["hostname"] = "bad name"
    with pytest.raises(DdpfixError) as exc:
        preflight(_ctx(sim, ["node1", "node2", "node3"]), {}, apply=True)
    assert exc.value.code == ExitCode.INVALID_INPUT and "node2 returned hostname 'bad name'" in str(exc.value)
    sim.node("node2")["hostname"] = "node2"
    sim.set_var(None, ddp_cluster_cidr="192.168.0.0/15")
    ctx = _ctx(sim, ["node1", "node2", "node3"])
    with pytest.raises(DdpfixError, match="ddp_cluster_cidr_ack_broad: true"):
        preflight(ctx, {"node1": HostPlan(firewall="iptables")}, apply=True)
    preflight(ctx, {"node1": HostPlan(firewall="iptables")}, apply=False)  # a dry run changes nothing: allowed
    preflight(ctx, {"node1": HostPlan(hosts=True)}, apply=True)  # no firewall opened: allowed
    sim.set_var(None, ddp_cluster_cidr_ack_broad=True)
    preflight(_ctx(sim, ["node1", "node2", "node3"]), {"node1": HostPlan(firewall="iptables")}, apply=True)
    sim.set_var(None, ddp_cluster_cidr="")
    with pytest.raises(DdpfixError, match=r"the master node1 was not read \(set ddp_cluster_cidr"):
        preflight(_ctx(sim, ["node2"]), {}, apply=True)


def _claim(sim: Sim, node: str, cidr: str, address: str | None = None) -> None:
    """`node` says the cluster network is `cidr`, its cluster interface carrying that prefix (a consistent lie),
    optionally with another address on it."""
    f = sim.node(node)
    net = ipaddress.ip_network(cidr)
    eth0 = sim.iface(node)
    for a in eth0["addrs"]:
        if a.get("family") == "inet":
            a["prefixlen"] = net.prefixlen
            a["local"] = address or a["local"]
    f["cluster"] = dict(f["cluster"], cidr=cidr, address=address or f["cluster"]["address"])


def test_a_master_claiming_a_wider_network_is_refused_and_the_controllers_network_used(sim: Sim) -> None:
    """Issue 36 item 4: without ddp_cluster_cidr the master says 192.168.0.0/16 for a /24 cluster. The controller's
    network (the inventory's addresses, the prefixes the nodes agree on) is the /24; the master's claim is
    INVALID for the master, and remediate refuses before anything runs."""
    _claim(sim, "node1", "192.168.0.0/16")
    ctx = _ctx(sim, ["node1", "node2", "node3"])
    assert ctx.cidr == "192.168.77.0/24" and remediate_extravars(ctx, {})["ddpfix_cidr"] == "192.168.77.0/24"
    assert [p[:2] for p in ctx.invalid["node1"]] == [("cluster.cidr", "192.168.0.0/16")] and set(ctx.invalid) == {"node1"}
    (bad,) = [f for f in run_checks(ctx) if f.id == reachability_rules.INVALID.id]
    assert bad.host == "node1" and "wider than 192.168.77.0/24" in bad.message, bad
    with pytest.raises(DdpfixError) as exc:
        preflight(ctx, {"node1": HostPlan(firewall="iptables")}, apply=False)
    assert exc.value.code == ExitCode.INVALID_INPUT and "node1 returned cluster.cidr '192.168.0.0/16'" in str(exc.value)
    # the inventory decides: with ddp_cluster_cidr the claims are not judged
    sim.set_var(None, ddp_cluster_cidr="192.168.77.0/24")
    assert _ctx(sim, ["node1", "node2", "node3"]).invalid == {}


def test_one_node_cannot_widen_or_narrow_the_derived_network(sim: Sim) -> None:
    """A worker on a far address of a /16 it claims, then a worker claiming a /30 around the master: outvoted, the
    network stays the /24 the others' prefixes and addresses agree on; only a wider claim is invalid."""
    sim.set_var("node3", ansible_host="192.168.200.13")
    _claim(sim, "node3", "192.168.0.0/16", "192.168.200.13")
    ctx = _ctx(sim, ["node1", "node2", "node3"])
    assert ctx.cidr == "192.168.77.0/24" and set(ctx.invalid) == {"node3"} and ctx.plan["node3"].address is None
    sim.set_var("node3", ansible_host="192.168.77.13")
    _claim(sim, "node3", "192.168.77.8/30", "192.168.77.13")
    ctx = _ctx(sim, ["node1", "node2", "node3"])
    assert ctx.cidr == "192.168.77.0/24" and ctx.invalid == {}
    # a single node decides for itself only; no vote without the master's facts
    assert _ctx(sim, ["node1"]).cidr == "192.168.77.0/24" and _ctx(sim, ["node2", "node3"]).cidr is None


def test_dry_run_preview_computes_env_and_cluster_file_diffs_from_the_facts(sim: Sim) -> None:
    """remediate's dry run without a second round trip: node1 has no env file, node2 one with a user line, a
    superseded key and a secret; node3's facts come from an older ddpfix (no text): only node3 is left to the play."""
    ef1 = sim.node("node1")["env_file"]
    ef1.update(exists=False, readable=False, text=None, values={}, managed={}, owner=None, outside_keys=[],
               cluster_file={"exists": False, "text": None}, unwritable={})
    sim.set_env_file("node2", "USER_OPT=1\nNODE_RANK=5\nDB_PASSWORD=s3cret-value\n")
    sim.node("node2")["env_file"].update(cluster_file={"exists": True, "text": "{}\n"}, unwritable={})
    sim.set_env_file("node3", "NODE_RANK=7\n")
    sim.node("node3")["env_file"].pop("text")
    ctx = sim.context()
    plans, refusals = build_plan(ctx, run_checks(ctx))
    todo = {h: p for h, p in plans.items() if not p.empty}
    assert refusals == [] and set(todo) == {"node1", "node2", "node3"} and all(p.env_only for p in todo.values())
    changes, failed, rest = preview(ctx, todo)
    assert failed == {} and set(rest) == {"node3"}
    assert [c.host for c in changes] == ["node1", "node1", "node2", "node2"]
    env1 = next(c.diff for c in changes if c.host == "node1" and "Managed block in" in c.task)
    assert env1.startswith("--- /dev/null") and "+MASTER_ADDR=192.168.77.11" in env1, env1
    cl1 = next(c.diff for c in changes if c.host == "node1" and "Cluster file" in c.task)
    assert '+    "schema": "ddpfix.cluster/v1",' in cl1, cl1
    env2 = next(c.diff for c in changes if c.host == "node2" and "Managed block in" in c.task)
    assert "+# ddpfix: superseded: NODE_RANK=5" in env2 and " DB_PASSWORD=***" in env2 and "s3cret" not in env2, env2
    assert " USER_OPT=1" in env2
    # a file the facts say cannot be written: every node goes to the play, whose pre-flight words it on every node
    ef1["unwritable"] = {"/etc/ddpfix": "read-only file system"}
    ctx = sim.context()
    assert facts_preflight(ctx, todo)[1]["node1"].startswith(
        PREFLIGHT_STEP + ": cannot write: /etc/ddpfix (read-only file system)")
    assert preview(ctx, todo) == ([], {}, todo) and remediate_checked(ctx, todo) == []


def test_cluster_file_text_is_what_the_play_writes() -> None:
    from ansible.plugins.filter.core import to_nice_json

    content = {"schema": "ddpfix.cluster/v1", "nodes": [{"name": "n\u00e9", "rank": 0}], "cidr": None}
    assert clusterfile.text(content) == to_nice_json(content, sort_keys=True) + "\n"


def test_apply_preflight_from_the_facts_covers_env_only_nodes_with_new_facts(sim: Sim) -> None:
    """The nodes whose only fix is the env file skip the play's lock-and-pre-flight call when their facts say
    whether the env file and cluster.json can be written; a node whose facts say not fails there, by name."""
    for n in ("node1", "node2", "node3"):
        sim.set_env_file(n, "NODE_RANK=9\n")
    sim.node("node1")["env_file"]["unwritable"] = {}
    sim.node("node2")["env_file"]["unwritable"] = {"/etc/ddpfix/ddp.env": "immutable (chattr +i)"}
    ctx = sim.context()
    plans, _ = build_plan(ctx, run_checks(ctx))
    checked, failed = facts_preflight(ctx, {h: p for h, p in plans.items() if not p.empty})
    assert checked == {"node1", "node2"} and set(failed) == {"node2"}  # node3: facts of an older ddpfix
    assert "cannot write: /etc/ddpfix/ddp.env (immutable (chattr +i))" in failed["node2"]
    extra = remediate_extravars(ctx, plans)
    assert extra["ddpfix_env_cluster"]["schema"] == clusterfile.SCHEMA
    # the cluster file's text, rendered once for every node: Ansible's to_nice_json(sort_keys=true) of the same
    # content (what the play rendered per node before), as the dry run's preview compares it
    from ansible.plugins.filter.core import to_nice_json

    text = extra["ddpfix_env_cluster_text"]
    assert text == clusterfile.text(extra["ddpfix_env_cluster"])
    assert text == to_nice_json(extra["ddpfix_env_cluster"], sort_keys=True) + "\n"


def test_changes_of_one_change_per_file_only_for_node_files_other_tasks_one_each(tmp_path: Path) -> None:
    """ddpfix_node_files reports one change per changed file; any other task with a `files` list (the firewall's
    persistence, ddpfix_fw_persist: paths) is one change with its whole diff, not dropped."""
    from ddpfix.ansible.results import HostResult, RunResult, TaskResult
    from ddpfix.remediate import changes_of

    persist = TaskResult(f"Fix {firewall_rules.PEER_PORTS_BLOCKED.id} | persisted", "changed",
                         {"files": ["/etc/nftables.conf", "/etc/ddpfix/firewall.nft"],
                          "diff": [{"before": "", "after": "x\n", "before_header": "/dev/null",
                                    "after_header": "/etc/ddpfix/firewall.nft"}]},
                         action="ddpfix.cluster.ddpfix_fw_persist")
    files = TaskResult("Cluster | files", "changed",
                       {"files": [{"what": f"Fix {env_rules.INCONSISTENT.id} | env", "changed": True,
                                   "diff": {"before": "", "after": "A=1\n", "after_header": "/etc/ddpfix/ddp.env"}},
                                  {"what": "hosts", "changed": False, "diff": {}}]},
                       action="ddpfix.cluster.ddpfix_node_files")
    run = RunResult("successful", 0, {}, {"n1": HostResult("n1", tasks=[persist, files])}, tmp_path, 1.0)
    got = changes_of(run)
    assert [c.task for c in got] == [f"Fix {firewall_rules.PEER_PORTS_BLOCKED.id} | persisted", f"Fix {env_rules.INCONSISTENT.id} | env"]
    assert "+++ /etc/ddpfix/firewall.nft" in got[0].diff


def _nofile_facts(sim: Sim, node: str, *, soft: int, pam_text: str | None, units: dict[str, str | None]) -> None:
    """`limits` as ddpfix_readers reads them: the session's soft limit, the units' and the drop-ins as they are."""
    unit_path = "/etc/systemd/system/{}.d/90-ddpfix-nofile.conf"
    sim.node(node)["limits"] = {
        "nofile": {"soft": soft, "hard": 524288, "source": "ssh session"},
        "nofile_units": {u: {"soft": soft, "hard": 524288, "source": f"systemd unit {u}"} for u in units},
        "nofile_dropins": {
            "pam": {"path": "/etc/security/limits.d/90-ddpfix-nofile.conf", "exists": pam_text is not None,
                    "text": pam_text},
            "units": {u: {"path": unit_path.format(u), "exists": t is not None, "text": t} for u, t in units.items()},
            "unwritable": {},
        },
    }


def test_dry_run_preview_computes_the_open_file_limit_drop_ins_from_the_facts(sim: Sim) -> None:
    """The open-file limit's fix (its finding fires on every node of a real fleet with the default 1024) is previewed
    from the audit's facts like the env file: node1 has neither drop-in, node2 an older unit drop-in and the pam file
    as ddpfix writes it, node3's facts come from an older ddpfix (no drop-ins read): only node3 goes to the play."""
    from ddpfix.remediate import nofile_files
    from ddpfix.rules import host as host_rules

    units = {"trainer.service": None}
    _nofile_facts(sim, "node1", soft=512, pam_text=None, units=units)
    _nofile_facts(sim, "node2", soft=512, pam_text=None, units={"trainer.service": "[Service]\nLimitNOFILE=4096\n"})
    _nofile_facts(sim, "node3", soft=512, pam_text=None, units=units)
    sim.node("node3")["limits"].pop("nofile_dropins")
    for n in ("node1", "node2", "node3"):
        sim.node(n)["env_file"].update(cluster_file={"exists": False, "text": None}, unwritable={}, text=None,
                                       exists=False)
    ctx = sim.context()
    plans, _ = build_plan(ctx, run_checks(ctx))
    todo = {h: p for h, p in plans.items() if not p.empty}
    assert all(p.nofile and p.env and p.previewable and not p.env_only for p in todo.values()), todo
    pam_text = nofile_files(todo["node2"].nofile, ctx.facts["node2"]["limits"]["nofile_dropins"])[0][2]  # type: ignore[index]
    sim.node("node2")["limits"]["nofile_dropins"]["pam"].update(exists=True, text=pam_text)
    ctx = sim.context()
    changes, failed, rest = preview(ctx, todo)
    assert failed == {} and set(rest) == {"node3"}
    got = [(c.host, c.task) for c in changes if c.rules == (host_rules.NOFILE_LOW.id,)]
    fix = f"Fix {host_rules.NOFILE_LOW.id} |"
    assert got == [("node1", f"{fix} Write /etc/security/limits.d/90-ddpfix-nofile.conf"),
                   ("node1", f"{fix} LimitNOFILE drop-in for launcher units (trainer.service)"),
                   ("node2", f"{fix} LimitNOFILE drop-in for launcher units (trainer.service)")], got
    pam1 = next(c.diff for c in changes if c.host == "node1" and "limits.d" in c.task)
    assert pam1.startswith("--- /dev/null") and "+*       soft    nofile     65536" in pam1, pam1
    unit2 = next(c.diff for c in changes if c.host == "node2" and "trainer" in c.task)
    assert "-LimitNOFILE=4096" in unit2 and "+LimitNOFILE=65536:" in unit2, unit2
    # the apply writes the drop-ins with the env file in the one ddpfix_node_files call: these nodes skip the
    # per-node play (the facts' pre-flight covered them); node3's facts do not tell its drop-ins
    assert remediate_checked(ctx, todo) == ["node1", "node2"]
    # a drop-in the facts say cannot be written (or a node lock held): every node to the play, which words it
    sim.node("node1")["limits"]["nofile_dropins"]["unwritable"] = {"/run/ddpfix.lock": "the node lock cannot be taken"}
    ctx = sim.context()
    assert facts_preflight(ctx, todo, nofile=True)[1]["node1"].startswith(
        PREFLIGHT_STEP + ": cannot write: /run/ddpfix.lock (the node lock cannot be taken)")
    assert preview(ctx, todo) == ([], {}, todo)


@pytest.mark.parametrize("hard,memlock", [("1048576", "unlimited"), ("0", "65536")])
def test_limits_drop_ins_render_as_the_roles_templates_through_ansibles_template_module(
        tmp_path: Path, hard: str, memlock: str) -> None:
    """The drop-ins' text is rendered once, on the controller (writes.nofile_texts, memlock_texts): the dry run's
    preview and --apply's ddpfix_node_files call both take it. The role ddpfix_limits (kept for running it on its own)
    renders the same bytes: its templates through Ansible's own template module (a local ad-hoc run, real Ansible, no
    hosts); a hard line only for a hard value above 0."""
    import subprocess
    import sys

    from ddpfix import paths
    from ddpfix.remediate import nofile_files
    from ddpfix.remediate.writes import memlock_texts

    nofile = {"soft": "65536", "hard": hard, "unit_hard": "infinity"}
    files = nofile_files(nofile, {"pam": {"path": "/p", "exists": False, "text": None},
                                  "units": {"a.service": {"path": "/u", "exists": False, "text": None}}})
    assert files is not None
    texts = [t for _, _, t in files] + list(memlock_texts(memlock))
    assert ("hard    nofile" in texts[0]) == (hard != "0")
    names = ("nofile.conf.j2", "unit-nofile.conf.j2", "memlock.conf.j2", "unit-memlock.conf.j2")
    for name, text in zip(names, texts, strict=True):
        dest = tmp_path / name
        src = paths.roles_dir() / "ddpfix_limits" / "templates" / name
        run = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
             "-m", "ansible.builtin.template", "-a", f"src={src} dest={dest} mode=0644",
             "-e", f"ansible_python_interpreter={sys.executable}", "-e", "ddpfix_limits_nofile=65536",
             "-e", f"ddpfix_limits_nofile_hard={hard}", "-e", "ddpfix_limits_nofile_unit_hard=infinity",
             "-e", f"ddpfix_limits_memlock={memlock}"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert dest.read_text() == text, name
    assert nofile_files({**nofile, "soft": "99"}, {}) is None  # out of range: the plan refuses it
    with pytest.raises(ValueError):
        memlock_texts("lots")


def _fwdpol(cidr: str, **changes: object) -> dict[str, object]:
    """The recorded firewalld 1.3.3 state of record-fwd-policy.sh (internal holds the network, policy
    egress-lockdown from HOST rejects), for the recorded cluster's network and interface."""
    import json

    st = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "firewall" / "fwdpol_cli.json").read_text())
    fw = json.loads(json.dumps(st["firewalld"]).replace("192.168.83.0/24", cidr))
    fw.update(changes)
    return {**st, "firewalld": fw, "iptables": "", "nft": None, "nft_text": None}


def test_plan_fixes_firewalld_in_the_bound_zone_and_the_egress_policy(sim: Sim) -> None:
    """Issue 34: node1's cluster network is a source of `internal` and a policy from HOST rejects what it sends: the
    plan puts a rich rule in each (no source in trusted); the role's pre-flight gets both permanent files."""
    sim.node("node1")["firewall"] = _fwdpol("192.168.77.0/24")
    ctx = _ctx(sim, ["node1", "node2", "node3"])
    findings = run_checks(ctx)
    got = {(f.id, f.host) for f in findings}
    assert {(firewall_rules.MASTER_PORT_BLOCKED.id, "node1"), (firewall_rules.EGRESS_BLOCKED.id, "node1")} <= got
    plans, refusals = build_plan(ctx, findings)
    assert refusals == []
    p = plans["node1"]
    assert p.firewall == "firewalld" and p.firewalld == [
        {"zone": "internal", "rich_rule": 'rule family="ipv4" source address="192.168.77.0/24" accept'},
        {"policy": "egress-lockdown", "rich_rule": 'rule family="ipv4" destination address="192.168.77.0/24" accept'}]
    assert p.to_vars()["firewalld_files"] == ["/etc/firewalld/policies/egress-lockdown.xml",
                                              "/etc/firewalld/zones/internal.xml"]
    # the peers node1 could not reach are not told to look at their security groups
    assert plans["node2"].firewall == "none" and not plans["node2"].notes


def test_plan_refuses_what_firewalld_must_keep(sim: Sim) -> None:
    deny = 'rule priority="-10" family="ipv4" source address="192.168.77.0/24" port port="29500" protocol="tcp" drop'
    st = _fwdpol("192.168.77.0/24")
    st["firewalld"]["zones"]["internal"]["rich_rules"] = [deny]  # type: ignore[index]
    st["firewalld"]["policies"] = {}  # type: ignore[index]
    sim.node("node1")["firewall"] = st
    ctx = _ctx(sim, ["node1", "node2", "node3"])
    plans, refusals = build_plan(ctx, run_checks(ctx))
    assert plans["node1"].firewall == "none" and plans["node1"].firewalld == []
    assert len(refusals) == 1 and deny in refusals[0] and "/etc/firewalld/zones/internal.xml" in refusals[0]
    assert "firewall-cmd --permanent --zone=internal --add-rich-rule=" in refusals[0]


def test_the_env_body_is_rendered_on_the_controller_with_one_template_compile_per_run(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """The play hands ddpfix_node_files the env block's body the controller rendered (`env_body`: no template lookup,
    so no template compile per node in the play), the text the dry run previews, and the controller compiles the
    template once for every node (jinja2's own cache behind one environment per directory)."""
    import jinja2

    from ddpfix import envtemplate
    from ddpfix.remediate.writes import limits_files

    compiles: list[str] = []
    compile_ = jinja2.Environment.compile

    def counted(self: jinja2.Environment, source: str, name: str | None = None, *a: object, **kw: object) -> object:
        compiles.append(str(name))
        return compile_(self, source, name, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(jinja2.Environment, "compile", counted)
    envtemplate._environment.cache_clear()
    ctx = _ctx(sim, ["node1", "node2", "node3"])
    plans, _ = build_plan(ctx, run_checks(ctx))
    assert all(p.env for p in plans.values()), plans
    got = remediate_extravars(ctx, plans)["ddpfix_plan"]
    for host, hv in got.items():
        assert hv["env_body"] == envtemplate.render_text(ctx.cluster.env_template, ctx.plan[host])
        lines, values = envtemplate.render_body(ctx.cluster.env_template, ctx.plan[host])
        assert values == plans[host].env and all(line in hv["env_body"].splitlines() for line in lines)
        assert hv["files"] == limits_files(plans[host], ctx.cluster.node(host)) == []  # no limits fix planned
    assert compiles == ["ddp.env.j2"], compiles
