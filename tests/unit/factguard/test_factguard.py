"""The trust boundary (ddpfix.factguard, ddpfix.ansible.rundirs.as_data): what a node returns is hostile input.

Table-driven: a template expression, shell metacharacters and a line break are planted in every string field of the
node facts (the recorded clean cluster, with the RDMA facts of the recorded InfiniBand and RoCE trees), one field at
a time. For each: the value never reaches what ddpfix writes or hands a play (the remediation plan's variables, the
env files, the hosts block), and where it is a field ddpfix uses it is reported as reachability_rules.INVALID naming the field.
Then the same variables as the run's extra-vars file: every string is data that ansible-core will not template.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from unit_helpers import Sim, fabric_facts

from ddpfix.ansible.rundirs import write_extravars
from ddpfix.factguard.facts import sanitize_facts, validate_facts
from ddpfix.plan import hosts_block, render_env
from ddpfix.remediate import build_plan, remediate_extravars
from ddpfix.rules import reachability as reachability_rules
from ddpfix.rules.engine import run_checks

HOSTILE = "{{ 7*191 }}$(id)`id`;\n1337"

#: fields that are free text a node reports about itself (errors, rule text, its own /etc/hosts lines, tool output):
#: shown to the operator as data, never used as a value; they need no grammar, only to stay out of what is written
FREE_TEXT = ("errors", "unread", "firewall", "hosts_file", "time.chrony_tracking", "time.daemons", "resolve_self",
             "env_file.path", "env_file.target", "env_file.error", "fabric.nccl_error", "fabric.sysfs_root",
             "fabric.efa.fi_info.path", "fabric.efa.fi_info.error", "fabric.memlock", "machine_id", "probe.error",
             "probe.resolve", "probe.routes", "probe.connects", "probe.result_path", "probe.start", "probe.mode",
             "cluster.source", "interfaces[].flags", "interfaces[].operstate", "env_file.owner", "hosts_file_scope",
             "fabric.memlock_units", "limits.nofile.source", "limits.nofile_units",
             # a file's text for the dry run's diff: shown only (never written, templated or run)
             "env_file.text", "env_file.cluster_file.text",
             # what the dry run previews the open-file limit's drop-ins from: ill-formed, the whole entry is left out
             # and the dry run asks the node (test_a_hostile_nofile_drop_in_is_left_to_the_play)
             "limits.nofile_dropins")


def _sim_with_fabric(tree: str) -> Sim:
    """The clean cluster with every field a node can return filled in: RDMA facts of a recorded tree, MACs and
    permanent MACs on the interfaces, and the env files ddpfix would write (plus a key of the user's)."""
    sim = Sim()
    sim.write_planned_env_files(node2={"MY_KEY": "keepme"})
    for n in sim.docs:
        for i, iface in enumerate(sim.node(n)["interfaces"]):
            if iface["name"] != "lo":
                iface.update(mac=f"52:54:00:00:0{i}:1{n[-1]}", permaddr=f"52:54:00:00:0{i}:1{n[-1]}", physical=True)
    for n in sim.docs:
        fb = copy.deepcopy(fabric_facts(tree))
        fb["memlock"] = {"soft": -1, "hard": -1, "source": "ssh session"}
        sim.node(n)["fabric"] = fb
        # the launch-path facts (ddpfix_hostenv), with a low limit so that its fix is planned too
        sim.node(n)["limits"] = {"nofile": {"soft": 512, "hard": 524288, "source": "ssh session"},
                                 "nofile_units": {"torchrun.service": {"soft": 1024, "hard": 524288,
                                                                       "source": "systemd unit torchrun.service"}},
                                 "nofile_dropins": copy.deepcopy(NOFILE_DROPINS)}
        sim.node(n)["sysctl"]["arp"] = {"all": {"arp_ignore": 0, "arp_announce": 0},
                                        "eth0": {"arp_ignore": 0, "arp_announce": 0}}
        sim.node(n)["torch"] = {"python": "/opt/venv/bin/python", "version": "2.5.1+cu124", "cuda": "12.4",
                                "hip": "6.2.41133-dd7f95766", "nccl": "2.21.5", "cached": False}
        sim.node(n).update(copy.deepcopy(HOSTENV))
    return sim


#: the open-file limit's drop-ins as ddpfix_readers.nofile_dropins reads them (the unit's written by an older ddpfix)
NOFILE_DROPINS = {
    "pam": {"path": "/etc/security/limits.d/90-ddpfix-nofile.conf", "exists": False, "text": None},
    "units": {"torchrun.service": {"path": "/etc/systemd/system/torchrun.service.d/90-ddpfix-nofile.conf",
                                   "exists": True, "text": "# old\n[Service]\nLimitNOFILE=4096\n"}},
    "unwritable": {},
}


#: the launch-path facts (ddpfix_launchenv): /dev/shm and a stray launcher variable in a profile.d script
HOSTENV = {
    "shm": {"path": "/dev/shm", "size_bytes": 67108864, "avail_bytes": 67108864, "fstype": "tmpfs",
            "options": "rw,size=65536k", "gpus": 8, "gpus_source": "/proc/driver/nvidia/gpus"},
    "shell_env": {"users": ["root", "ops"], "files": ["/etc/environment", "/etc/profile.d/site.sh"],
                  "assignments": [{"file": "/etc/profile.d/site.sh", "line": 3, "key": "MASTER_ADDR",
                                   "value": "10.0.0.5", "dynamic": False, "conditional": False, "exported": True,
                                   "secret": False}]},
}


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, list[Any]]]:
    """(readable path, key path) of every string leaf, dict keys included as ('<key>', ...)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from ((p, [k, *kp]) for p, kp in _leaves(v, f"{path}.{k}" if path else str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from ((p, [i, *kp]) for p, kp in _leaves(v, f"{path}[]"))
    elif isinstance(value, str):
        yield path, []


def _set(doc: Any, keys: list[Any], value: Any) -> None:
    for k in keys[:-1]:
        doc = doc[k]
    doc[keys[-1]] = value


def _cases() -> list[tuple[str, str, list[Any]]]:
    out: dict[str, tuple[str, str, list[Any]]] = {}
    for tree in ("ib_hdr", "roce"):
        node = _sim_with_fabric(tree).node("node2")
        for path, keys in _leaves(node):
            out.setdefault(path, (tree, path, keys))
    return sorted(out.values(), key=lambda c: c[1])


CASES = _cases()


def _written(sim: Sim) -> str:
    """Everything ddpfix would write or hand a play for this cluster, as one text."""
    ctx = sim.context()
    findings = run_checks(ctx)
    plans, refusals = build_plan(ctx, findings, pin_ifnames=True)
    parts = [json.dumps(remediate_extravars(ctx, plans)), hosts_block(ctx.plan), *refusals]
    parts += [render_env(p) for p in ctx.plan.values()]
    return "\n".join(parts)


def test_the_table_covers_the_fabric_and_interface_fields() -> None:
    paths = {p for _, p, _ in CASES}
    for want in ("fabric.devices[].name", "fabric.devices[].ports[].link_layer", "fabric.devices[].ports[].gids[].gid",
                 "fabric.devices[].ports[].pkey0", "fabric.devices[].netdevs[]", "interfaces[].name",
                 "interfaces[].mac", "hostname", "cluster.address", "env_file.values.MASTER_ADDR"):
        assert want in paths, sorted(paths)
    assert len(CASES) > 40


@pytest.mark.parametrize(("tree", "path", "keys"), CASES, ids=[c[1] for c in CASES])
def test_a_hostile_value_in_any_field_is_never_written(tree: str, path: str, keys: list[Any]) -> None:
    sim = _sim_with_fabric(tree)
    _set(sim.node("node2"), keys, HOSTILE)
    written = _written(sim)
    assert "{{ 7*191 }}" not in written and "$(id)" not in written and "1337" not in written, path
    problems = validate_facts(sim.node("node2"))
    if not path.startswith(FREE_TEXT):
        assert problems, f"{path}: not reported as {reachability_rules.INVALID.id}"
        assert any(v.startswith("{{ 7*191 }}") for _, v, _ in problems)
        ids = {f.id for f in sim.findings() if f.host == "node2"}
        assert reachability_rules.INVALID.id in ids


def test_a_hostile_rdma_device_name_is_reported_and_dropped() -> None:
    sim = _sim_with_fabric("ib_hdr")
    fb = sim.node("node2")["fabric"]
    fb["devices"][1]["name"] = "{{ lookup('pipe', 'touch marker') }}"
    problems = validate_facts(sim.node("node2"))
    assert [(f, v) for f, v, _ in problems] == [("fabric.devices[1].name", "{{ lookup('pipe', 'touch marker') }}")]
    clean = sanitize_facts(sim.node("node2"))
    assert [d["name"] for d in clean["fabric"]["devices"]] == ["mlx5_0"]
    finding = next(f for f in sim.findings() if f.id == reachability_rules.INVALID.id)
    assert finding.host == "node2" and "fabric.devices[1].name" in finding.message
    assert "lookup" not in _written(sim)


def test_a_hostile_permanent_mac_is_never_pinned() -> None:
    sim = Sim()
    iface = sim.iface("node2")
    iface.update(physical=True, permaddr="aa:bb:cc:dd:ee:ff\nName=evil")
    assert ("interfaces[eth0].permaddr", "aa:bb:cc:dd:ee:ff\nName=evil") in [(f, v) for f, v, _ in
                                                                          validate_facts(sim.node("node2"))]
    assert "evil" not in _written(sim)


def test_clean_facts_pass() -> None:
    for tree in ("ib_hdr", "roce", "efa"):
        sim = _sim_with_fabric(tree)
        for n in sim.docs:
            assert validate_facts(sim.node(n)) == [], (tree, n)


def test_extravars_are_data_never_templates(tmp_path: Path) -> None:
    """Every string in the extra-vars file is `{"__ansible_unsafe": ...}`: ansible-core's JSON decoder makes it a
    value it never templates (checked against ansible-playbook in the lab tests)."""
    nested = {"ddpfix_plan": {"node2": {"env": {"NCCL_IB_HCA": "={{ 7*191 }}:1"}, "ports": [29500, "x"]}},
              "ddpfix_master": "node1", "ok": True, "n": None}
    path = write_extravars(tmp_path, nested)
    doc = json.loads(path.read_text())
    assert doc["ddpfix_plan"]["node2"]["env"]["NCCL_IB_HCA"] == {"__ansible_unsafe": "={{ 7*191 }}:1"}
    assert doc["ddpfix_plan"]["node2"]["ports"] == [29500, {"__ansible_unsafe": "x"}]
    assert doc["ddpfix_master"] == {"__ansible_unsafe": "node1"} and doc["ok"] is True and doc["n"] is None
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_ansible_playbook_reads_the_extravars_as_literal_data(tmp_path: Path) -> None:
    """The installed ansible-core, on the controller alone (connection local): a value of the extra-vars file that
    looks like a template reaches a module unevaluated, also after set_fact re-templates it and inside a nested
    dict the roles index (`ddpfix_plan[inventory_hostname].env`)."""
    import subprocess
    import sys

    marker = tmp_path / "pwned"
    hostile = f"{{{{ lookup('pipe', 'touch {marker}') }}}}={{{{ 7*191 }}}}"
    write_extravars(tmp_path, {"ddpfix_plan": {"localhost": {"env": {"X": hostile}}}, "ddpfix_x": hostile})
    out = tmp_path / "out.txt"
    (tmp_path / "pb.yml").write_text(f"""
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.set_fact:
        __copy: "{{{{ ddpfix_plan[inventory_hostname].env }}}}"
    - ansible.builtin.copy:
        content: "{{{{ __copy.X }}}}|{{{{ ddpfix_x }}}}\\n"
        dest: {out}
        mode: "0600"
""")
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'env' / 'extravars'}",
                        str(tmp_path / "pb.yml")], capture_output=True, text=True, timeout=120, check=False,
                       cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_NOCOLOR": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert out.read_text() == f"{hostile}|{hostile}\n"
    assert not marker.exists()


@pytest.mark.parametrize(("where", "value"), [
    (["pam", "path"], "/etc/security/limits.d/{{ 7*191 }}.conf"),
    (["pam", "path"], "/etc/../root/.ssh/authorized_keys"),
    (["units", "torchrun.service", "path"], "/etc/passwd"),
    (["units", "torchrun.service", "text"], "[Service]\x1b]0;owned\x07\n"),
    (["unwritable"], {"/etc/x": "line\nbreak"}),
    (["units"], {}),
])
def test_a_hostile_nofile_drop_in_is_left_to_the_play(where: list[str], value: Any) -> None:
    """A drop-in entry the dry run cannot trust (a path other than the one the role writes, a control character in
    the text or a reason, units other than those read) drops the whole entry: the dry run then asks the node."""
    sim = _sim_with_fabric("roce")
    assert sanitize_facts(sim.node("node2"))["limits"]["nofile_dropins"] == NOFILE_DROPINS
    _set(sim.node("node2")["limits"]["nofile_dropins"], where, value)
    assert "nofile_dropins" not in sanitize_facts(sim.node("node2"))["limits"]


@pytest.mark.parametrize("bad", [["a", "b"], [1, 2, 3], "32768 60999", [0, 70000], [60999, 32768], [True, 2]])
def test_a_hostile_ephemeral_range_is_reported_and_never_reaches_a_peers_plan(bad: Any) -> None:
    """Every node's net.ipv4.ip_local_port_range goes into its peers' egress accepts (`egressfix.egress_fix`) and into
    the audit's port arithmetic: an ill-formed one used to raise out of the audit and the plan for the whole cluster
    (one node's facts stopping every node's fix), or to send its peers a port spec their module refuses. It is now an
    invalid fact of that node, left out, and its peers' plans stay the cluster's range."""
    sim = Sim()
    ifname = sim.node("node3")["cluster"]["ifname"]
    sim.node("node3")["firewall"] = {**sim.node("node3")["firewall"], "nft_text": None, "nft": {"nftables": [
        {"table": {"family": "inet", "name": "t"}},
        {"chain": {"family": "inet", "table": "t", "name": "out", "type": "filter", "hook": "output", "prio": 0,
                   "policy": "accept"}},
        {"rule": {"family": "inet", "table": "t", "chain": "out", "handle": 2, "expr": [
            {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": ifname}}, {"drop": None}]}}]}}
    sim.node("node2")["sysctl"]["ip_local_port_range"] = bad
    assert [p[0] for p in validate_facts(sim.node("node2"))] == ["sysctl.ip_local_port_range"]
    ctx = sim.context()
    findings = run_checks(ctx)
    assert any(f.id == reachability_rules.INVALID.id and f.host == "node2" for f in findings)
    plans, refusals = build_plan(ctx, findings)
    assert refusals == [] and [c["ports"] for c in plans["node3"].egress] == ["29500,32768-60999"]
    sim.node("node2")["sysctl"]["somaxconn"] = "4096; id"
    assert [p[0] for p in validate_facts(sim.node("node2"))] == ["sysctl.ip_local_port_range", "sysctl.somaxconn"]
    run_checks(sim.context())
