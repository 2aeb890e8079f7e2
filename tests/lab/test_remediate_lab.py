"""Remediation, env files and verify on real lab hosts (issue: remediate/env/verify acceptance).

Each scenario: hand-written env files (no interface names, as people write them), `verify --torch` fails where the
fault breaks torch, `remediate --apply` exits 0, `audit` is clean, `verify --torch` passes, a second `--apply`
changes nothing (Ansible's stats, not text).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

import pytest
from click.testing import CliRunner

from ddpfix import lab
from ddpfix.cli import cli

pytestmark = pytest.mark.lab

# Short torch timeouts for the lab (role defaults are overridable inventory variables).
FAST_TORCH = {"ddpfix_verify_pg_timeout": 10, "ddpfix_verify_rdzv_timeout": 15, "ddpfix_verify_deadline": 45}


def ddpfix(inv: str, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["-i", inv, *args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def ddpfix_json(inv: str, *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = ddpfix(inv, *args, "--format", "json")
    try:
        return code, json.loads(out)
    except ValueError:
        raise AssertionError(f"no JSON (exit {code}): {out[-2000:]} {err[-2000:]}") from None


def add_inventory_vars(info: Any, extra: dict[str, Any]) -> None:
    import yaml

    doc = yaml.safe_load(info.inventory.read_text())
    doc["all"]["children"]["ddp_nodes"]["vars"].update(extra)
    info.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))


def handmade_env(info: Any) -> None:
    """Env files as people write them by hand: right master and ranks, no socket interface names."""
    master = info.nodes[0].address
    n = len(info.nodes)
    for rank, node in enumerate(info.nodes):
        text = (f"MASTER_ADDR={master}\nMASTER_PORT=29500\nNNODES={n}\nNODE_RANK={rank}\n"
                f"NPROC_PER_NODE=1\nWORLD_SIZE={n}\n")
        lab.node_exec(info.name, node.name, ["sh", "-c", "mkdir -p /etc/ddpfix && cat > /etc/ddpfix/ddp.env"], input=text)


def snapshot(info: Any) -> dict[str, str]:
    """Checksums of every node's /etc and its live firewall ruleset."""
    out = {}
    script = ("find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum; "
              "iptables-save 2>/dev/null | grep -v '^#' | sed 's/\\[[0-9:]*\\]//'; "
              "nft list ruleset 2>/dev/null | sed 's/counter packets [0-9]* bytes [0-9]*/counter/'")
    for node in info.nodes:
        out[node.name] = lab.node_exec(info.name, node.name, ["sh", "-c", script]).stdout
    return out


def ids(doc: dict[str, Any], min_severity: str = "warning") -> set[str]:
    order = {"info": 1, "warning": 2, "error": 3}
    return {f["id"] for f in doc["findings"] if order[f["severity"]] >= order[min_severity]}


SCENARIOS = [
    # (scenario, whether the fault breaks a Gloo all-reduce). Native nftables and iptables blocking: fixed end to end
    # (remediate, torch, a second apply) on 12 nodes at forks = 1 in test_firewall_faults_lab.py, persisted and
    # re-audited in its docker_lab test.
    ("firewalld-master", True),
    ("hostname-loopback", True),
    ("chrony-absent", False),
    ("env-wrong", True),
]


@pytest.mark.torch
@pytest.mark.parametrize(("scenario", "breaks_torch"), SCENARIOS, ids=[s for s, _ in SCENARIOS])
def test_scenario_fixed_end_to_end(temp_lab: Any, scenario: str, breaks_torch: bool) -> None:
    pytest.importorskip("torch")
    info = temp_lab(nodes=3, scenario=scenario, wait_sync=False)
    add_inventory_vars(info, FAST_TORCH)
    inv = str(info.inventory)
    if scenario != "env-wrong":
        handmade_env(info)

    code, before = ddpfix_json(inv, "audit")
    assert code == 1 and ids(before), before["findings"]
    if breaks_torch:
        code, v = ddpfix_json(inv, "verify", "--torch", "--no-checks")
        assert code == 1, v
        assert not all(r["ok"] for r in v["torch"]), v["torch"]
        failed = [r for r in v["torch"] if not r["ok"]]
        assert all(r.get("error") and r.get("cause") for r in failed), failed

    code, applied = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (applied["remaining_fixable"], applied["failed_hosts"], applied["refused"])
    assert any(applied["changed"].values())

    code, after = ddpfix_json(inv, "audit")
    assert code == 0, after["findings"]

    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (v["checks"], v["torch"])
    assert all(r["ok"] and r["result"]["sum"] == 6.0 for r in v["torch"]), v["torch"]

    code, again = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and again["changed"] == {n.name: 0 for n in info.nodes}, again["changes"]


@pytest.fixture(scope="module")
def broken(lab_factory: Any) -> Any:
    """One lab with several faults at once, incl. a bind-mounted /etc/hosts on node2."""
    info = lab_factory(nodes=3, scenario="firewalld-master,iptables-worker2,hostname-loopback,chrony-absent,hosts-bindmount",
                       wait_sync=False)
    handmade_env(info)
    return info


def test_dry_run_changes_nothing_and_shows_diffs(broken: Any) -> None:
    inv = str(broken.inventory)
    before = snapshot(broken)
    code, doc = ddpfix_json(inv, "remediate")
    assert code == 1 and doc["apply"] is False
    after = snapshot(broken)
    for node, text in before.items():
        assert after[node] == text, "\n".join(difflib.unified_diff(text.splitlines(), after[node].splitlines(), lineterm=""))
    # fix tasks are named `Fix <finding id> | <what>`
    tasks = {(c["host"], m.group(1)) for c in doc["changes"] if (m := re.match(r"Fix (\S+) \| ", c["task"]))}
    assert ("node1", "firewall.peer-ports-blocked") in tasks and ("node2", "firewall.peer-ports-blocked") in tasks
    hosts_diff = next(c["diff"] for c in doc["changes"] if c["host"] == "node3" and "hosts" in c["task"])
    assert re.search(r"^-127\.0\.1\.1\s+node3", hosts_diff, re.M) and "+# BEGIN ddpfix managed block" in hosts_diff


def test_apply_keeps_ssh_never_opens_to_world_and_backs_up(broken: Any) -> None:
    inv = str(broken.inventory)
    code, doc = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (doc["remaining_fixable"], doc["failed_hosts"])
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
    # backups of the files it edited
    for node in ("node2", "node3"):
        ls = lab.node_exec(broken.name, node, ["sh", "-c", "ls /etc/hosts.*~ 2>/dev/null || true"]).stdout
        assert ls.strip(), f"no /etc/hosts backup on {node}"
    # env file: the hand-written lines kept (ddpfix's keys among them commented out), the managed block, mode 0644
    st = lab.node_exec(broken.name, "node2", ["stat", "-c", "%a", "/etc/ddpfix/ddp.env"]).stdout.strip()
    env = lab.node_exec(broken.name, "node2", ["cat", "/etc/ddpfix/ddp.env"]).stdout
    assert st == "644" and "# BEGIN ddpfix managed block" in env and "NCCL_SOCKET_IFNAME==" in env
    assert f"# ddpfix: superseded: MASTER_ADDR={broken.nodes[0].address}" in env


def test_bind_mounted_hosts_file_remediated(broken: Any) -> None:
    # node2's /etc/hosts is a single-file bind mount (like Docker): still a mount, now with the block.
    mounted = lab.node_exec(broken.name, "node2", ["sh", "-c", "grep -c ' /etc/hosts ' /proc/self/mountinfo"]).stdout
    assert int(mounted.strip()) >= 1
    hosts = lab.node_exec(broken.name, "node2", ["cat", "/etc/hosts"]).stdout
    assert "# BEGIN ddpfix managed block" in hosts and not re.search(r"^127\.0\.1\.1\s+node2", hosts, re.M)
    got = lab.node_exec(broken.name, "node2", ["getent", "ahostsv4", "node2"]).stdout.split()[0]
    assert got == broken.nodes[1].address


def test_symlinked_hosts_file_is_edited_at_its_target(temp_lab: Any) -> None:
    """node3's /etc/hosts is a symlink (managed elsewhere): the block goes into the target, the link stays a link;
    a second apply changes nothing."""
    info = temp_lab(nodes=3, scenario="hostname-loopback", wait_sync=False)
    inv = str(info.inventory)
    lab.node_exec(info.name, "node3", ["sh", "-c", "mkdir -p /etc/hosts.d && mv /etc/hosts /etc/hosts.d/cluster"
                                                   " && ln -s hosts.d/cluster /etc/hosts"])
    code, doc = ddpfix_json(inv, "remediate", "--apply", "--only", "hosts.hostname-loopback")
    assert code == 0, (doc.get("failed_hosts"), doc.get("refused"))
    link = lab.node_exec(info.name, "node3", ["readlink", "/etc/hosts"]).stdout.strip()
    assert link == "hosts.d/cluster"
    target = lab.node_exec(info.name, "node3", ["cat", "/etc/hosts.d/cluster"]).stdout
    assert "# BEGIN ddpfix managed block" in target and not re.search(r"^127\.0\.1\.1\s+node3", target, re.M)
    code, again = ddpfix_json(inv, "remediate", "--apply", "--only", "hosts.hostname-loopback")
    assert code == 0 and again["changed"] == {n.name: 0 for n in info.nodes}, again["changes"]


@pytest.mark.torch
def test_second_apply_changes_nothing_and_torch_passes(broken: Any) -> None:
    pytest.importorskip("torch")
    inv = str(broken.inventory)
    code, doc = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and sum(doc["changed"].values()) == 0, doc["changes"]
    code, v = ddpfix_json(inv, "verify", "--torch")
    assert code == 0, (v["checks"], v["torch"])


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
    assert code == 1 and "host.unreachable" in ids(doc, "error")
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
