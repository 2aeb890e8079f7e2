"""Remediation, env files and verify on real lab hosts (issue: remediate/env/verify acceptance).

The end-to-end cycle: hand-written env files (no interface names, as people write them), `audit` finds every fault,
`verify --torch` fails, `remediate --apply` exits 0 and changes something, `audit` is clean, `verify --torch`
passes, a second `--apply` changes nothing (Ansible's stats, not text). It runs on two labs whose nodes carry
several faults at once (one audit, one remediation, two torch runs per lab instead of one lab per fault):
`test_scenario_fixed_end_to_end[nftables-worker2,env-wrong]` (one torch run: the failing one, with its causes, is
the `broken` lab's, kept for CI's time), and the module's `broken` lab
(firewalld-master, iptables-worker2, hostname-loopback, chrony-absent, hosts-bindmount), whose cycle is spread over
the `broken` tests below in file order (these were `test_scenario_fixed_end_to_end[firewalld-master]`,
`[iptables-worker2]`, `[hostname-loopback]` and `[chrony-absent]`, one lab each).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

import pytest
from helpers import FAST_TORCH, add_inventory_vars, ddpfix, ddpfix_json, handmade_env, ids, need_node_torch, snapshot

from ddpfix import lab
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import host as host_rules
from ddpfix.rules import net as net_rules
from ddpfix.rules import reachability as reachability_rules

pytestmark = pytest.mark.lab

# Short torch timeouts for the lab (role defaults are overridable inventory variables).


def audit_finds(inv: str, scenarios: str) -> dict[str, Any]:
    """`audit` exits 1 and reports every finding each of the lab's scenarios declares."""
    code, doc = ddpfix_json(inv, "audit")
    assert code == 1 and ids(doc), doc["findings"]
    for s in scenarios.split(","):
        missing = set(lab.SCENARIOS[s].findings) - ids(doc, "info")
        assert not missing, (s, missing, doc["findings"])
    return doc


def torch_fails_with_causes(inv: str) -> None:
    """`verify --torch` (no end-state checks) fails, and every failed node names an error and a likely cause."""
    code, v = ddpfix_json(inv, "verify", "--torch", "--no-checks")
    assert code == 1, v
    assert not all(r["ok"] for r in v["torch"]), v["torch"]
    failed = [r for r in v["torch"] if not r["ok"]]
    assert all(r.get("error") and r.get("cause") for r in failed), failed


def audit_clean_and_torch_passes(inv: str) -> None:
    code, after = ddpfix_json(inv, "audit")
    assert code == 0, after["findings"]
    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (v["checks"], v["torch"])
    assert all(r["ok"] and r["result"]["sum"] == 6.0 for r in v["torch"]), v["torch"]


def second_apply_changes_nothing(inv: str, info: Any) -> None:
    code, again = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and again["changed"] == {n.name: 0 for n in info.nodes}, again["changes"]


#: Labs for the whole cycle in one test, several faults each (each of these breaks a Gloo all-reduce on its own);
#: env-wrong keeps its own (wrong) env files. The `broken` lab below runs the same cycle over several tests.
SCENARIOS = ["nftables-worker2,env-wrong"]


@pytest.mark.torch
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_fixed_end_to_end(temp_lab: Any, scenario: str) -> None:
    need_node_torch()
    info = temp_lab(nodes=3, scenario=scenario, wait_sync=False)
    add_inventory_vars(info, FAST_TORCH)
    inv = str(info.inventory)
    if "env-wrong" not in scenario.split(","):
        handmade_env(info)

    audit_finds(inv, scenario)

    code, applied = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (applied["remaining_fixable"], applied["failed_hosts"], applied["refused"])
    assert any(applied["changed"].values())

    audit_clean_and_torch_passes(inv)
    second_apply_changes_nothing(inv, info)


BROKEN = "firewalld-master,iptables-worker2,hostname-loopback,chrony-absent,hosts-bindmount,nofile-low,arp-flux"


@pytest.fixture(scope="module")
def broken(lab_factory: Any) -> Any:
    """One lab with several faults at once, incl. a bind-mounted /etc/hosts on node2, a symlinked /etc/hosts on node3
    (managed elsewhere: hosts.d/cluster), a low open-file limit on node2 (nofile-low) and ARP flux on node3
    (arp-flux)."""
    info = lab_factory(nodes=3, scenario=BROKEN, wait_sync=False)
    add_inventory_vars(info, FAST_TORCH)
    handmade_env(info)
    lab.node_exec(info.name, "node3", ["sh", "-c", "mkdir -p /etc/hosts.d && mv /etc/hosts /etc/hosts.d/cluster"
                                                   " && ln -s hosts.d/cluster /etc/hosts"])
    return info


@pytest.mark.torch
def test_broken_lab_audit_finds_every_fault_and_torch_fails(broken: Any) -> None:
    """The start of the `broken` lab's end-to-end cycle (before any test below changes it)."""
    need_node_torch()
    inv = str(broken.inventory)
    audit_finds(inv, BROKEN)
    torch_fails_with_causes(inv)


def test_dry_run_changes_nothing_and_shows_diffs(broken: Any) -> None:
    inv = str(broken.inventory)
    before = snapshot(broken)
    code, doc = ddpfix_json(inv, "remediate")
    assert code == 1 and doc["apply"] is False
    after = snapshot(broken)
    for node, text in before.items():
        assert after[node] == text, "\n".join(difflib.unified_diff(text.splitlines(), after[node].splitlines(), lineterm=""))
    # each change names the findings it fixes (its task's rule-id tags)
    tasks = {(c["host"], rule) for c in doc["changes"] for rule in c["rules"]}
    assert ("node1", firewall_rules.PEER_PORTS_BLOCKED.id) in tasks and ("node2", firewall_rules.PEER_PORTS_BLOCKED.id) in tasks
    assert ("node2", host_rules.NOFILE_LOW.id) in tasks and ("node3", net_rules.ARP_FLUX.id) in tasks, sorted(tasks)
    nofile_diff = next(c["diff"] for c in doc["changes"] if c["host"] == "node2" and "90-ddpfix-nofile" in c["task"])
    assert re.search(r"^\+\*\s+soft\s+nofile\s+\d+", nofile_diff, re.M), nofile_diff
    hosts_diff = next(c["diff"] for c in doc["changes"] if c["host"] == "node3" and "hosts" in c["task"])
    assert re.search(r"^-127\.0\.1\.1\s+node3", hosts_diff, re.M) and "+# BEGIN ddpfix managed block" in hosts_diff


def test_apply_keeps_ssh_never_opens_to_world_and_backs_up(broken: Any) -> None:
    inv = str(broken.inventory)
    code, doc = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (doc["remaining_fixable"], doc["failed_hosts"], doc["refused"])
    assert any(doc["changed"].values())
    cidr = broken.subnet
    for node in broken.nodes:
        r = lab.node_exec(broken.name, node.name, ["true"])  # namespace alive
        assert r.returncode == 0
    # SSH still works on every node (a new connection, not a reused one)
    import subprocess

    for node in broken.nodes:
        out = subprocess.run(broken.ssh_argv(node.name, "hostname"), capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == node.hostname, out.stderr
    # only the cluster CIDR was admitted; nothing admits 0.0.0.0/0
    srcs = lab.node_exec(broken.name, "node1", ["firewall-cmd", "--zone=trusted", "--list-sources"]).stdout.split()
    assert srcs == [cidr]
    perm = lab.node_exec(broken.name, "node1", ["firewall-cmd", "--permanent", "--zone=trusted", "--list-sources"]).stdout.split()
    assert perm == [cidr]
    for node in broken.nodes:
        rules = lab.node_exec(broken.name, node.name, ["sh", "-c", "iptables-save 2>/dev/null; nft list ruleset 2>/dev/null"]).stdout
        assert "0.0.0.0/0" not in rules
        for line in rules.splitlines():
            if "ddpfix" in line:
                assert f"-s {cidr}" in line, line
    saved = lab.node_exec(broken.name, "node2", ["cat", "/etc/iptables/rules.v4"]).stdout
    assert f"-A INPUT -s {cidr}" in saved and "-j ACCEPT" in saved
    # backups of the files it edited (node3's /etc/hosts is a symlink: next to its target)
    for node, hosts in (("node2", "/etc/hosts"), ("node3", "/etc/hosts.d/cluster")):
        ls = lab.node_exec(broken.name, node, ["sh", "-c", f"ls {hosts}.*~ 2>/dev/null || true"]).stdout
        assert ls.strip(), f"no {hosts} backup on {node}"
    # env file: the hand-written lines kept (ddpfix's keys among them commented out), the managed block, mode 0644
    st = lab.node_exec(broken.name, "node2", ["stat", "-c", "%a", "/etc/ddpfix/ddp.env"]).stdout.strip()
    env = lab.node_exec(broken.name, "node2", ["cat", "/etc/ddpfix/ddp.env"]).stdout
    assert st == "644" and "# BEGIN ddpfix managed block" in env and "NCCL_SOCKET_IFNAME==" in env
    assert f"# ddpfix: superseded: MASTER_ADDR={broken.nodes[0].address}" in env
    # host_rules.NOFILE_LOW and net_rules.ARP_FLUX: fixed (the re-audit after the apply reports neither), the values reported
    assert not {host_rules.NOFILE_LOW.id, net_rules.ARP_FLUX.id} & {f["id"] for f in doc["remaining_fixable"]}, doc["remaining_fixable"]
    soft = subprocess.run(broken.ssh_argv("node2", "ulimit -Sn"), capture_output=True, text=True, timeout=30).stdout
    assert int(soft.strip()) > 896, soft
    nic = broken.nodes[2].ifname
    arp = lab.node_exec(broken.name, "node3", ["sh", "-c", "cat /etc/sysctl.d/90-ddpfix-arp.conf; sysctl -n "
                                                           "net.ipv4.conf.arp0.arp_ignore net.ipv4.conf.arp0.arp_announce "
                                                           f"net.ipv4.conf.{nic}.arp_ignore net.ipv4.conf.{nic}.arp_announce"]).stdout
    assert "net.ipv4.conf.arp0.arp_ignore = 1" in arp and f"net.ipv4.conf.{nic}.arp_announce = 2" in arp, arp
    assert arp.split()[-4:] == ["1", "2", "1", "2"], arp


def test_bind_mounted_hosts_file_remediated(broken: Any) -> None:
    # node2's /etc/hosts is a single-file bind mount (like Docker): still a mount, now with the block.
    mounted = lab.node_exec(broken.name, "node2", ["sh", "-c", "grep -c ' /etc/hosts ' /proc/self/mountinfo"]).stdout
    assert int(mounted.strip()) >= 1
    hosts = lab.node_exec(broken.name, "node2", ["cat", "/etc/hosts"]).stdout
    assert "# BEGIN ddpfix managed block" in hosts and not re.search(r"^127\.0\.1\.1\s+node2", hosts, re.M)
    got = lab.node_exec(broken.name, "node2", ["getent", "ahostsv4", "node2"]).stdout.split()[0]
    assert got == broken.nodes[1].address


def test_symlinked_hosts_file_is_edited_at_its_target(broken: Any) -> None:
    """node3's /etc/hosts is a symlink (managed elsewhere): the block went into the target (by the apply above), the
    link stays a link; test_second_apply_changes_nothing_and_torch_passes shows a second apply changes nothing. (Its
    own lab until issue 25: merged into this one to pay for the nofile-low and arp-flux scenarios.)"""
    link = lab.node_exec(broken.name, "node3", ["readlink", "/etc/hosts"]).stdout.strip()
    assert link == "hosts.d/cluster"
    target = lab.node_exec(broken.name, "node3", ["cat", "/etc/hosts.d/cluster"]).stdout
    assert "# BEGIN ddpfix managed block" in target and not re.search(r"^127\.0\.1\.1\s+node3", target, re.M)


@pytest.mark.torch
def test_second_apply_changes_nothing_and_torch_passes(broken: Any) -> None:
    """The end of the `broken` lab's end-to-end cycle: a clean audit, torch passes, a second apply changes nothing."""
    need_node_torch()
    inv = str(broken.inventory)
    audit_clean_and_torch_passes(inv)
    second_apply_changes_nothing(inv, broken)


def test_unreachable_node_env_apply_refuses_and_ranks_stay(temp_lab: Any) -> None:
    info = temp_lab(nodes=3, scenario="clean")
    inv = str(info.inventory)
    code, _, _ = ddpfix(inv, "env", "--apply")
    assert code == 0
    before = {n.name: lab.node_exec(info.name, n.name, ["cat", "/etc/ddpfix/ddp.env"]).stdout for n in info.nodes}
    lab.stop_sshd(info.name, "node2")
    code, out, err = ddpfix(inv, "env", "--apply")
    assert code == 1 and "node2 unreachable" in err and "--allow-partial" in err
    after = {n.name: lab.node_exec(info.name, n.name, ["cat", "/etc/ddpfix/ddp.env"]).stdout for n in info.nodes}
    assert after == before
    # --allow-partial writes the reachable nodes without renumbering them
    code, out, err = ddpfix(inv, "env", "--allow-partial", "--format", "json")
    files = json.loads(out)["files"]
    assert set(files) == {"node1", "node3"} and "NODE_RANK=2" in files["node3"]
    # remediate: the unreachable node is reported, the others complete
    code, doc = ddpfix_json(inv, "remediate", "--apply")
    assert code == 1 and reachability_rules.UNREACHABLE.id in ids(doc, "error")
    assert doc["refused"] and "node2" in doc["refused"][0]


def test_env_print_and_local_dir(clean_lab: Any, tmp_path: Any) -> None:
    inv = str(clean_lab.inventory)
    code, out, _ = ddpfix(inv, "env", "--local-dir", str(tmp_path))
    assert code == 0 and "==> node1:/etc/ddpfix/ddp.env <==" in out
    text = (tmp_path / "node3.env").read_text()
    m = clean_lab.nodes[0].address
    assert f"MASTER_ADDR={m}\n" in text and "NODE_RANK=2\n" in text and "PET_NODE_RANK=2\n" in text
    assert not re.search(r"^(RANK|WORLD_SIZE|LOCAL_RANK)=", text, re.M)  # no ddp_env_process_vars
    assert f"GLOO_SOCKET_IFNAME={clean_lab.nodes[2].ifname}\n" in text
    assert f"NCCL_SOCKET_IFNAME=={clean_lab.nodes[2].ifname}\n" in text


def test_pin_ifnames_pins_no_veth_and_says_so(clean_lab: Any) -> None:
    """Every lab NIC is a veth: --pin-ifnames pins only physical NICs (issue 9 item 6), so it writes no .link file
    and says why on each node (tests/unit/test_locks.py covers the physical case on recorded `ip -j -d` output)."""
    inv = str(clean_lab.inventory)
    code, doc = ddpfix_json(inv, "remediate", "--apply", "--pin-ifnames")
    assert code == 0, doc["remaining_fixable"]
    assert all(any("not a physical NIC" in n for n in doc["notes"].get(node.name, [])) for node in clean_lab.nodes), doc["notes"]
    for node in clean_lab.nodes:
        r = lab.node_exec(clean_lab.name, node.name, ["test", "-e", "/etc/systemd/network/10-ddpfix-cluster.link"], check=False)
        assert r.returncode == 1
    code, again = ddpfix_json(inv, "remediate", "--apply", "--pin-ifnames")
    assert code == 0 and sum(again["changed"].values()) == 0, again["changes"]
