"""Faults during remediation on real lab hosts (issue 9, items 4-6): two runs at once, Ctrl-C in the middle of
`--apply`, a node with a read-only /etc, --pin-ifnames next to bridges and veths.

Every test asserts that nothing was lost or half-written: file checksums on every node, no lock or probe listener
left behind, and that the same command run again converges.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import DDPFIX, cli_env, ids, run_cli, sh_out

from ddpfix.rules import probes as probes_rules

pytestmark = pytest.mark.lab


#: The installed console script, run on this checkout's code (as a user runs it, in its own process).

CLUSTER_FILES = "/etc/hosts /etc/ddpfix/ddp.env"


def checksums(info: Any, files: str = CLUSTER_FILES) -> dict[str, str]:
    return {n.name: sh_out(info, n.name, f"sha256sum {files} 2>&1", check=False) for n in info.nodes}


def leftovers(info: Any, port: int = 29500) -> dict[str, str]:
    """Per node: a ddpfix lock, a process listening on the master port or a prober's result directory (nothing may
    be left after a run)."""
    out = {}
    for n in info.nodes:
        s = sh_out(info, n.name, f"ls -d /run/ddpfix.lock /run/ddpfix-probe* /tmp/ddpfix-probe* 2>/dev/null; "
                                  f"ss -Hltn 'sport = :{port}'", check=False).strip()
        if s:
            out[n.name] = s
    return out


# ---------------------------------------------------------------- item 5: one run at a time


def test_two_audits_at_once_one_waits_no_false_findings(clean_lab: Any, tmp_path: Path) -> None:
    inv = clean_lab.inventory
    copy = tmp_path / "copy.yml"  # the same nodes through another inventory file: the same controller lock
    shutil.copy(inv, copy)
    state = tmp_path / "state"
    for second in (inv, copy):
        procs = [subprocess.Popen([DDPFIX, "-i", str(i), "audit", "--format", "json"], env=cli_env(state),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (inv, second)]
        results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
        codes = sorted(r[0] for r in results)
        # the cluster's controller lock (keyed on the node addresses, taken by the audit's ansible-playbook once its
        # first task derived the cluster): the second exits 5 before any node lock; runs that happen not to overlap
        # both succeed (read-only, each saw only its own listener). Never both 5, never a false finding.
        assert codes in ([0, 0], [0, 5]), results
        for code, out, err in results:
            if code == 5:  # ... and names the holder: PID, command, start time
                assert "holds the lock for this cluster" in err and "no node was contacted" in err, err
                assert "pid " in err and "started " in err and "audit" in err, err
            else:
                assert code == 0 and probes_rules.PORT_IN_USE.id not in ids(json.loads(out), "info"), (code, out[-2000:], err)
        assert leftovers(clean_lab) == {}


def test_two_adhoc_remediations_at_once_one_runs_the_other_exits_5_at_once(clean_lab: Any, tmp_path: Path) -> None:
    """`remediate --apply -i ip1,ip2,ip3,` twice at once (each writes its own ad-hoc inventory file): the controller
    lock is keyed on the cluster's node addresses, so the second exits 5 before any playbook (no node lock taken)
    and the first runs to its end (exit 0: it met no node lock of the other). Round 1 with --forks 2: detached
    probers, and still no lock or listener on the master port once the run returned."""
    addrs = ",".join(n.address for n in clean_lab.nodes) + ","
    env = {**cli_env(tmp_path / "state"), "ANSIBLE_REMOTE_USER": "root",
           "ANSIBLE_PRIVATE_KEY_FILE": str(Path(clean_lab.ssh_config).parent / "id_ed25519"),
           "ANSIBLE_SSH_COMMON_ARGS": f"-o UserKnownHostsFile={clean_lab.known_hosts} -o StrictHostKeyChecking=yes "
                                      "-o IdentitiesOnly=yes"}
    for extra in (["--forks", "2"], []):
        argv = [DDPFIX, "-i", addrs, "remediate", "--apply", *extra, "--format", "json"]
        procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
        assert sorted(r[0] for r in results) == [0, 5], [(c, e[-1500:]) for c, _, e in results]
        _, out, err = next(r for r in results if r[0] == 5)
        assert "holds the lock for this cluster (3 nodes:" in err and "remediate" in err, err
        assert "node lock" not in err and out.strip() == "", (out, err)
        assert leftovers(clean_lab) == {}  # no node lock, nothing on the master port


def test_audit_meets_the_cluster_lock_before_it_contacts_any_node(clean_lab: Any, tmp_path: Path) -> None:
    """Another process holds the controller lock of these nodes (as `-i ip1,ip2,ip3,` would): `ddpfix audit -i
    INV` (whose ansible-playbook reads the inventory) exits 5 from its first task, naming the holder; no node was
    contacted (no node lock taken, no listener)."""
    state = tmp_path / "state"
    addrs = [n.address for n in clean_lab.nodes]
    code = ("import sys, time; from ddpfix import lock; lock.controller_lock(sys.argv[1:]); print('held', flush=True); "
            "time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, *reversed(addrs)], stdout=subprocess.PIPE, text=True,
                              env=cli_env(state))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        rc, doc, err = run_cli(clean_lab.inventory, state, "audit")
        assert rc == 5 and doc == {}, (rc, err[-2000:])
        assert "holds the lock for this cluster (3 nodes:" in err and f"pid {holder.pid}" in err, err
        assert "no node was contacted" in err, err
        assert leftovers(clean_lab) == {}
    finally:
        holder.kill()
        holder.wait()


def test_stale_node_lock_is_taken_over_a_live_one_refuses(clean_lab: Any, tmp_path: Path) -> None:
    node = clean_lab.nodes[1].name
    holder = json.dumps({"run_id": "otherrun", "pid": 999999, "controller": "elsewhere",
                         "command": "ddpfix remediate --apply", "started": "2026-01-01T00:00:00+0000"})
    sh_out(clean_lab, node, f"echo '{holder}' > /run/ddpfix.lock")
    before = checksums(clean_lab)
    code, _, err = run_cli(clean_lab.inventory, tmp_path / "state", "remediate", "--apply")
    assert code == 5 and "run otherrun (pid 999999 on elsewhere" in err and node in err, err
    assert checksums(clean_lab) == before
    assert json.loads(sh_out(clean_lab, node, "cat /run/ddpfix.lock"))["run_id"] == "otherrun"  # not removed
    assert list(leftovers(clean_lab)) == [node]  # the others released theirs
    sh_out(clean_lab, node, "touch -d '-21 minutes' /run/ddpfix.lock")  # its run died 21 minutes ago
    code, doc, err = run_cli(clean_lab.inventory, tmp_path / "state", "audit")
    assert code == 0 and probes_rules.PORT_IN_USE.id not in ids(doc, "info"), (doc.get("findings"), err)
    assert leftovers(clean_lab) == {}


def test_master_port_taken_by_a_job_is_never_bound(temp_lab: Any, tmp_path: Path) -> None:
    info = temp_lab(nodes=2, scenario="port-in-use", wait_sync=False)
    _code, doc, err = run_cli(info.inventory, tmp_path / "state", "audit")
    assert probes_rules.PORT_IN_USE.id in ids(doc, "info"), err
    master = info.nodes[0].name
    # only the job's listener holds the port (ddpfix never bound it), and ddpfix left nothing when the audit returned
    job = sh_out(info, master, "cat /run/ddpfix-port-in-use.pid").strip()
    holders = sh_out(info, master, "ss -Hltnp 'sport = :29500'").strip().splitlines()
    assert len(holders) == 1 and f"pid={job}," in holders[0], holders
    assert sh_out(info, master, "ls /run/ddpfix.lock 2>/dev/null || true").strip() == ""


# ---------------------------------------------------------------- item 4: all nodes or none


@pytest.fixture(scope="module")
def broken(lab_factory: Any) -> Any:
    # hosts block (hostname-loopback) and env files (env-wrong) are needed on every node; a firewall and time fix too
    return lab_factory(nodes=3, scenario="iptables-worker2,hostname-loopback,chrony-absent,env-wrong", wait_sync=False)


def test_node_lock_that_cannot_be_taken_refuses_the_run_before_any_change(broken: Any, tmp_path: Path) -> None:
    """/run read-only on one node (its node lock cannot be written): the facts are still read (read-only), then
    `env --apply` stops on every node at the lock task: no env file written anywhere (all were due)."""
    ro = broken.nodes[2].name
    before = checksums(broken)
    sh_out(broken, ro, "mount --bind /run /run && mount -o remount,ro,bind /run")
    try:
        p = subprocess.run([DDPFIX, "-i", str(broken.inventory), "env", "--apply"], env=cli_env(tmp_path / "state"),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 1, p.stderr
        assert checksums(broken) == before
        lines = {ln.split(":", 1)[0]: ln for ln in p.stderr.splitlines() if ln.startswith("node")}
        assert "node lock /run/ddpfix.lock cannot be taken: Read-only file system" in lines[ro], p.stderr
        assert "this node is refused" in lines[ro], p.stderr
        assert all(f"cannot be taken on {ro}" in lines[n.name] for n in broken.nodes if n.name != ro), p.stderr
    finally:
        sh_out(broken, ro, "umount /run")
    assert leftovers(broken) == {}


def firewall_state(info: Any) -> dict[str, str]:
    """Per node: the iptables rule set (no counters, no comments): a firewall fix changes it."""
    return {n.name: sh_out(info, n.name, "iptables-save 2>&1 | grep -v '^#' | sed 's/\\[[0-9:]*\\]//'", check=False)
            for n in info.nodes}


ALL_WRITTEN = CLUSTER_FILES + " /etc/ddpfix/cluster.json /etc/chrony/conf.d/ddpfix.conf"


def test_read_only_etc_and_append_only_env_file_no_node_gets_cluster_files(broken: Any, tmp_path: Path) -> None:
    """One node has a read-only /etc, another an append-only (chattr +a) env file, which passed the pre-flight
    before (the issue saw the healthy nodes get new env files and cluster.json): both fail the pre-flight, and no node
    gets an env file, cluster.json or a hosts block, and no firewall or chrony change (one run checks both: lab time
    stays flat)."""
    ro, ao = broken.nodes[2].name, broken.nodes[1].name
    before, fw_before = checksums(broken, ALL_WRITTEN), firewall_state(broken)
    sh_out(broken, ro, "mount -o remount,ro,bind /etc")
    sh_out(broken, ao, "chattr +a /etc/ddpfix/ddp.env")
    try:
        assert "Read-only" in sh_out(broken, ro, "touch /etc/x 2>&1 || true")
        assert "a" in sh_out(broken, ao, "lsattr /etc/ddpfix/ddp.env").split()[0]
        code, doc, err = run_cli(broken.inventory, tmp_path / "state", "remediate", "--apply")
        assert code == 1, err
        assert checksums(broken, ALL_WRITTEN) == before  # no node got a new env file, cluster.json or hosts block
        assert firewall_state(broken) == fw_before  # and no firewall change (worker2's fix was pending)
        assert sorted(doc["failed_hosts"]) == sorted([ro, ao]), doc["failed_hosts"]
        assert all("preflight" in doc["failed_hosts"][h].lower() for h in (ro, ao)), doc["failed_hosts"]
        assert "read-only file system" in doc["failed_hosts"][ro]
        assert "append-only (chattr +a)" in doc["failed_hosts"][ao] and "chattr -a" in doc["failed_hosts"][ao]
        assert any("written on no node" in r and ro in r and "preflight" in r.lower() for r in doc["refused"]), doc["refused"]
        assert leftovers(broken) == {}
    finally:
        sh_out(broken, ao, "chattr -a /etc/ddpfix/ddp.env")
        sh_out(broken, ro, "mount -o remount,rw,bind /etc")


def test_step_failing_on_one_node_keeps_cluster_files_everywhere(broken: Any, tmp_path: Path) -> None:
    """The pre-flight passes, then one node fails a per-node step (its chrony role refuses a main configuration that
    does not exist, ddpfix_chrony_conf_path naming a missing file: nothing the pre-flight can see, since every file
    is writable): the hosts block and env files are still written on no node."""
    import yaml

    bad = broken.nodes[1].name
    doc = yaml.safe_load(Path(broken.inventory).read_text())
    doc["all"]["children"]["ddp_nodes"]["hosts"][bad]["ddpfix_chrony_conf_path"] = "/etc/chrony/missing.conf"
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc))
    before = checksums(broken)
    code, doc, err = run_cli(inv, tmp_path / "state", "remediate", "--apply")
    assert code == 1, err
    assert bad in doc["failed_hosts"] and "preflight" not in doc["failed_hosts"][bad].lower(), (doc["failed_hosts"], err)
    assert "missing.conf" in doc["failed_hosts"][bad], doc["failed_hosts"]
    assert checksums(broken) == before
    assert any("written on no node" in r and bad in r for r in doc["refused"]), doc["refused"]


def test_unquotable_env_extra_with_a_firewall_fix_pending_exit_2_nothing_changed(broken: Any, tmp_path: Path) -> None:
    """Item 4: `ddp_env_extra: {NOTE: "a b"}` is refused by the inventory check, before any node is contacted: exit
    2, one line naming the host, key and value, and no firewall, chrony or file change (the issue saw firewalld and
    chrony changed, then every env write refused, exit 1)."""
    import yaml

    doc = yaml.safe_load(Path(broken.inventory).read_text())
    group = doc["all"]["children"]["ddp_nodes"] if "all" in doc else doc["ddp_nodes"]
    group.setdefault("vars", {})["ddp_env_extra"] = {"NOTE": "a b"}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc))
    before, fw_before = checksums(broken, ALL_WRITTEN), firewall_state(broken)
    state = tmp_path / "state"
    for args in (["remediate", "--apply"], ["env", "--apply"], ["audit"]):
        p = subprocess.run([DDPFIX, "-i", str(inv), *args], env=cli_env(state), capture_output=True, text=True,
                           timeout=300)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1, (args, p.returncode, p.stdout[-2000:], p.stderr)
        assert "ddp_env_extra of " in lines[0] and "NOTE='a b' would need quoting" in lines[0], lines
    assert checksums(broken, ALL_WRITTEN) == before
    assert firewall_state(broken) == fw_before
    events = [e for e in state.rglob("job_events/*.json") if '"runner_on_' in e.read_text()]
    assert not events, events  # no task ran on any node
    assert leftovers(broken) == {}


def test_sigint_during_apply_then_rerun_converges(broken: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen([DDPFIX, "-i", str(broken.inventory), "remediate", "--apply", "--format", "json"],
                            env=cli_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    started = False
    while time.time() < deadline and proc.poll() is None and not started:  # wait until a fix role is running
        for ev in state.glob("runs/*-remediate/artifacts/*/job_events/*.json"):
            try:
                text = ev.read_text()
            except OSError:
                continue
            if '"runner_on_start"' in text and ("ddpfix_firewall" in text or "ddpfix_chrony" in text):
                started = True
                break
        time.sleep(0.1)
    assert started, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 6, (out[-2000:], err[-2000:])
    doc = json.loads(out)
    assert doc["interrupted"] is True and "interrupted" in err
    for c in doc["changes"]:  # what was changed, on which host, is reported
        assert c["host"] in err and c["task"] in err
    assert leftovers(broken) == {}
    code, doc, err = run_cli(broken.inventory, state, "remediate", "--apply")
    assert code == 0, (doc.get("failed_hosts"), doc.get("refused"), doc.get("remaining_fixable"), err)
    code, doc, err = run_cli(broken.inventory, state, "remediate", "--apply")
    assert code == 0 and sum(doc["changed"].values()) == 0, doc["changes"]


# ---------------------------------------------------------------- item 6: --pin-ifnames, physical NICs only


def test_pin_ifnames_skips_bridges_and_veths(temp_lab: Any, tmp_path: Path) -> None:
    # node2 has docker0 and a bridge with a veth; every lab NIC (the cluster NICs too) is a veth: nothing is pinned
    info = temp_lab(nodes=2, scenario="autoselect-wrong", wait_sync=False)
    _code, doc, err = run_cli(info.inventory, tmp_path / "state", "remediate", "--apply", "--pin-ifnames")
    for node in info.nodes:
        notes = doc["notes"].get(node.name, [])
        assert any("not pinned" in n and "veth interface, not a physical NIC" in n for n in notes), (notes, err)
        assert sh_out(info, node.name, "ls /etc/systemd/network/10-ddpfix-cluster.link 2>&1 || true").startswith("ls:")
