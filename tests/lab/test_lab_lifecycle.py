"""`ddpfix lab up|down|status` end to end: real SSH hosts in namespaces, and nothing left behind."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers import invoke

from ddpfix import lab
from ddpfix.lab import lifecycle, prerequisites
from ddpfix.lab.scenarios.registry import SCENARIOS

CAP_SYS_TIME = 25


def leftovers(name: str, pids: list[dict]) -> list[str]:
    """Everything of lab `name` that still exists on this machine."""
    out = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [f"netns {ln.split()[0]}" for ln in netns.splitlines() if ln.startswith(f"ddpfix-{name}-")]
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    out += [f"link {ln['ifname']}" for ln in links if ln["ifname"] == lab.host_link(name)]
    sd = str(lab.state_dir(name))
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    out += [f"mount {m.split()[4]}" for m in mounts if sd in m.split()[4] or f"/run/netns/ddpfix-{name}-" in m]
    out += [f"pid {r['pid']}" for r in pids if lab.pid_alive(r)]
    if Path(sd).exists():
        out.append(f"dir {sd}")
    return out


def recorded_pids(name: str) -> list[dict]:
    state = json.loads((lab.state_dir(name) / "lab.json").read_text())
    recs = [state["supervisor"]] if state.get("supervisor") else []
    for node in state["nodes"].values():
        recs += list(node["pids"].values())
    return recs


@pytest.mark.lab
def test_up_ssh_status_down(tmp_path: Path, free_subnet) -> None:
    name = f"lc{os.getpid() % 100000}"
    subnet = free_subnet()
    ifnames = ["eth0", "ens5", "enp7s0"]
    t0 = time.monotonic()
    res = invoke("lab", "up", "--nodes", "4", "--ifnames", ",".join(ifnames), "--name", name, "--subnet", subnet,
                  "--format", "json", "--no-wait-sync", cwd=tmp_path)
    elapsed = time.monotonic() - t0
    try:
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        print(f"lab up, 4 nodes: {elapsed:.2f} s")  # reported, not asserted: speed is the benchmark's to measure
        inv = tmp_path / "inventories" / "lab" / "hosts.yml"
        assert Path(doc["inventory"]) == inv and inv.is_file()
        info = lab.info(name)
        assert [n.ifname for n in info.nodes] == ["eth0", "ens5", "enp7s0", "eth0"]

        # real ssh, strict host key checking against the lab's known_hosts
        for i, node in enumerate(info.nodes, 1):
            assert node.address == str(ipaddress.ip_network(subnet).network_address + 10 + i)
            out = subprocess.run(
                ["ssh", "-i", str(info.private_key), "-o", f"UserKnownHostsFile={info.known_hosts}",
                 "-o", "StrictHostKeyChecking=yes", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                 "-o", "IdentitiesOnly=yes", "-F", "/dev/null", f"root@{node.address}",
                 f"hostname; ip -j -4 addr show dev {node.ifname}; ls /sys/class/net; echo $TMPDIR"],
                capture_output=True, text=True, timeout=30,
            )
            assert out.returncode == 0, out.stderr
            lines = out.stdout.splitlines()
            assert lines[0] == node.name
            addr = json.loads(lines[1])[0]["addr_info"][0]
            assert addr["local"] == node.address and addr["prefixlen"] == 24
            assert sorted(lines[2:-1]) == sorted(["lo", node.ifname])
            assert lines[-1] == "/run/tmp"

        # a wrong host key is refused (strict checking really is on)
        bad_kh = tmp_path / "bad_known_hosts"
        first = info.known_hosts.read_text().splitlines()[0].split()
        second = info.known_hosts.read_text().splitlines()[1].split()
        bad_kh.write_text(f"{first[0]} {second[1]} {second[2]}\n")
        out = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(info.private_key), "-o", f"UserKnownHostsFile={bad_kh}",
                              "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{first[0]}", "true"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in out.stderr

        res = invoke("lab", "status", "--name", name, "--format", "json")
        assert res.exit_code == 0, res.output
        st = json.loads(res.stdout)
        assert st["healthy"] and [n["sshd"] for n in st["nodes"]] == [True] * 4
        res = invoke("lab", "status", "--name", name)
        assert res.exit_code == 0 and all(n.address in res.stdout for n in info.nodes)

        pids = recorded_pids(name)
        assert len(pids) >= 1 + 4 * 3 and all(lab.pid_alive(r) for r in pids)
    finally:
        res = invoke("lab", "down", "--name", name)
    assert res.exit_code == 0, res.output
    assert leftovers(name, pids) == []
    assert not inv.exists()
    res = invoke("lab", "down", "--name", name)
    assert res.exit_code == 0 and "nothing to remove" in res.output
    assert lab.down(name) is False


@pytest.mark.lab
def test_up_when_up_is_exit_2(clean_lab, free_subnet) -> None:
    res = invoke("lab", "up", "--name", clean_lab.name, "--subnet", free_subnet())
    assert res.exit_code == 2
    assert f"lab down --name {clean_lab.name}" in res.output
    assert lab.status(clean_lab.name).nodes[0].alive  # untouched


@pytest.mark.lab
def test_node_isolation_and_no_clock_control(clean_lab) -> None:
    name = clean_lab.name
    ids = set()
    for node in clean_lab.nodes:
        out = lab.node_exec(name, node.name, ["sh", "-c", "cat /etc/machine-id /var/lib/dbus/machine-id; hostname;"
                                              "grep -E ' /(etc|run|root|var/log|var/lib/chrony|etc/hosts) ' /proc/self/mountinfo"]).stdout
        lines = out.splitlines()
        assert lines[0] == lines[1] and lines[2] == node.name
        ids.add(lines[0])
        mounted = {ln.split()[4] for ln in lines[3:]}
        assert {"/etc", "/run", "/root", "/var/log", "/var/lib/chrony"} <= mounted
        assert "/etc/hosts" not in mounted  # the whole /etc is the node's, no single-file bind
        # PID 1 is neither init nor a shell (Ansible's service manager detection)
        comm = lab.node_exec(name, node.name, ["cat", "/proc/1/comm"]).stdout.strip()
        assert comm != "init" and not comm.endswith("sh")
        # no process of the node can set the clock; chronyd never tries (-x)
        state = json.loads((lab.state_dir(name) / "lab.json").read_text())
        for key, rec in state["nodes"][node.name]["pids"].items():
            if key == "launcher":
                continue
            bnd = int(re.search(r"CapBnd:\s*(\w+)", Path(f"/proc/{rec['pid']}/status").read_text()).group(1), 16)
            assert not bnd & (1 << CAP_SYS_TIME), f"{node.name} {key} may set the clock"
        chronyd = state["nodes"][node.name]["pids"]["chronyd"]["pid"]
        assert "-x" in Path(f"/proc/{chronyd}/cmdline").read_text().split("\0")
        session = lab.node_exec(name, node.name, ["grep", "CapBnd", "/proc/self/status"]).stdout.split()[1]
        assert not int(session, 16) & (1 << CAP_SYS_TIME)
        t = lab.chrony_tracking(name, node.name)
        assert t and t["leap_status"] == "Normal"
    assert len(ids) == len(clean_lab.nodes)
    # the host's own machine-id / hostname are untouched
    assert Path("/etc/machine-id").read_text().strip() not in ids


@pytest.mark.lab
def test_stop_and_start_sshd(clean_lab) -> None:
    name, node = clean_lab.name, clean_lab.nodes[-1]
    lab.stop_sshd(name, node.name)
    try:
        st = {n.name: n for n in lab.status(name).nodes}
        assert not st[node.name].sshd and st[node.name].alive and st["node1"].sshd
        res = invoke("lab", "status", "--name", name)
        assert res.exit_code == 1
    finally:
        lab.start_sshd(name, node.name)
    out = subprocess.run(clean_lab.ssh_argv(node.name, "hostname"), capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == node.name


@pytest.mark.lab
def test_failed_up_leaves_nothing(temp_lab, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(rt, node):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(lifecycle, "_start_chrony", boom)  # the name _build calls
    name = f"fail{os.getpid() % 100000}"
    with pytest.raises(lab.LabError, match=r"injected failure.*removed"):
        temp_lab(nodes=2, name=name)
    assert leftovers(name, []) == []


def test_up_help_lists_scenarios() -> None:
    res = invoke("lab", "up", "--help")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for s in SCENARIOS.values():
        assert s.name in res.output
        assert " ".join(s.summary.split())[:40] in text


@pytest.mark.parametrize("subnet", ["nonsense", "192.168.77.0/33", "192.168.77.5/24", "8.8.8.0/24", "127.0.0.0/24",
                                    "fd00::/64", "192.168.77.0/30"])
def test_bad_subnet_is_exit_2(subnet: str) -> None:
    res = invoke("lab", "up", "--subnet", subnet, "--name", "never")
    assert res.exit_code == 2, res.output
    assert "--subnet" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--scenario", "no-such"], ["--scenario", "iptables-worker", "--nodes", "1"],
                                  ["--name", "Bad_Name"], ["--ifnames", "eth0,this-name-is-too-long"]])
def test_bad_options_are_exit_2(args: list[str]) -> None:
    res = invoke("lab", "up", *args)
    assert res.exit_code == 2, res.output


def test_not_root_is_exit_4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    res = invoke("lab", "up", "--name", "never", "--subnet", "192.168.77.0/24")
    assert res.exit_code == 4 and "root" in res.output
    res = invoke("lab", "down", "--name", "never")
    assert res.exit_code == 4


def test_missing_package_is_exit_4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real = prerequisites.shutil.which
    monkeypatch.setattr(prerequisites.shutil, "which", lambda b, path=None: None if b == "firewalld" else real(b, path=path))
    with pytest.raises(lab.LabError) as exc:
        prerequisites.check_prerequisites(["firewalld-master"])
    assert exc.value.code == 4 and "apt-get install firewalld" in str(exc.value)
