"""Launching jobs on real lab hosts: `ddpfix check --local` inside the nodes (healthy and planted faults, NHC output,
under 2 s) and the torchrun example run end to end with the lab's nodes as the Slurm allocation."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ddpfix import lab

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = os.path.dirname(sys.executable)
#: ddpfix inside a node: the checkout's package on PYTHONPATH, the controller's interpreter (the node sees /work).
NODE_DDPFIX = ["env", f"PYTHONPATH={ROOT / 'controller'}", sys.executable, "-c", "from ddpfix.cli import main; main()"]


def ddpfix(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from ddpfix.cli import main; main()", *args], capture_output=True,
                          text=True, timeout=900, env={**os.environ, **(env or {})})


def check_local(info, node: str, *extra: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = lab.node_exec(info.name, node, [*NODE_DDPFIX, "check", "--local", *extra], check=False, timeout=60)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0


def apply_env(info) -> None:
    r = ddpfix("-i", str(info.inventory), "env", "--apply")
    assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])


def test_healthy_nodes_pass_silently_in_under_2s(clean_lab) -> None:
    apply_env(clean_lab)
    doc = json.loads(lab.node_exec(clean_lab.name, "node2", ["cat", "/etc/ddpfix/cluster.json"]).stdout)
    assert [n["address"] for n in doc["nodes"]] == [n.address for n in clean_lab.nodes]
    mode = lab.node_exec(clean_lab.name, "node2", ["stat", "-c", "%a", "/etc/ddpfix/cluster.json"]).stdout.strip()
    assert mode == "644"
    for n in clean_lab.nodes:
        code, out, seconds = check_local(clean_lab, n.name)
        assert (code, out) == (0, ""), (n.name, out)
        assert seconds < 2.0, (n.name, seconds)
    code, out, _ = check_local(clean_lab, "node3", "-v")
    assert code == 0 and out.startswith("OK: ddpfix: node3: rank 2 of 3") and out.count("\n") == 1
    # the file as a launch script gets it without /etc: the same as the block written on the node
    r = ddpfix("-i", str(clean_lab.inventory), "env", "--stdout", "--node", "node3")
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout == lab.node_exec(clean_lab.name, "node3", ["cat", "/etc/ddpfix/ddp.env"]).stdout


#: A blackholed nameserver inside a node: a UDP socket on loopback that reads every query and never answers (it ends
#: by itself after 120 s; its pid is in /run/ddpfix-test-blackhole.pid)
BLACKHOLE = """
import os, socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.53", 53))
s.settimeout(1)
open("/run/ddpfix-test-blackhole.pid", "w").write(str(os.getpid()))
end = time.monotonic() + 120
while time.monotonic() < end:
    try:
        s.recv(4096)
    except socket.timeout:
        pass
"""


def test_blackholed_resolver_is_not_evaluated_within_the_deadline(clean_lab) -> None:
    """node2's only nameserver never answers and its peers' names are not in its /etc/hosts: `check --local
    --timeout 4` stops waiting at its deadline and says what it could not decide (exit 3), never a pass."""
    node = "node2"

    def sh(cmd: str) -> subprocess.CompletedProcess[str]:
        return lab.node_exec(clean_lab.name, node, ["sh", "-c", cmd], check=False)

    if sh("test -f /etc/ddpfix/cluster.json").returncode != 0:
        apply_env(clean_lab)
    peers = [n.hostname for n in clean_lab.nodes if n.name != node]
    assert sh("if [ -e /etc/resolv.conf ] || [ -L /etc/resolv.conf ]; then cp -P /etc/resolv.conf "
              "/etc/resolv.conf.ddpfix-test; fi; cp /etc/hosts /etc/hosts.ddpfix-test").returncode == 0
    hole = lab.node_popen(clean_lab.name, node, [sys.executable, "-c", BLACKHOLE], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    try:
        drop = " ".join(f"-e {p}" for p in peers)
        assert sh("rm -f /etc/resolv.conf && printf 'nameserver 127.0.0.53\\noptions timeout:30 attempts:1\\n' "
                  f"> /etc/resolv.conf && grep -v -w {drop} /etc/hosts.ddpfix-test > /etc/hosts").returncode == 0
        for _ in range(50):  # the blackhole is listening
            if sh("test -s /run/ddpfix-test-blackhole.pid").returncode == 0:
                break
            time.sleep(0.1)
        code, out, seconds = check_local(clean_lab, node, "--timeout", "4")
    finally:
        sh("kill $(cat /run/ddpfix-test-blackhole.pid) 2>/dev/null; rm -f /run/ddpfix-test-blackhole.pid; "
           "cat /etc/hosts.ddpfix-test > /etc/hosts && rm /etc/hosts.ddpfix-test; rm -f /etc/resolv.conf; "
           "if [ -e /etc/resolv.conf.ddpfix-test ] || [ -L /etc/resolv.conf.ddpfix-test ]; then "
           "mv -T /etc/resolv.conf.ddpfix-test /etc/resolv.conf; fi")
        hole.wait(timeout=30)
    assert code == 3, out
    assert out.startswith("ERROR: ddpfix: not-evaluated: peer name resolution not decided within 4 s") \
        and out.count("\n") == 1, out
    assert all(p in out for p in peers), out
    assert "peer-unresolvable:" not in out and "not a pass" in out, out
    assert seconds < 4 + 3, seconds  # the deadline, plus the interpreter's start inside the node
    code, out, _ = check_local(clean_lab, node)  # restored: healthy again
    assert (code, out) == (0, ""), out


def test_hostname_loopback_gives_the_nhc_line(lab_factory) -> None:
    info = lab_factory(nodes=3, scenario="hostname-loopback", wait_sync=False)
    apply_env(info)
    node = info.nodes[-1].name  # the scenario's highest-address node maps its hostname to 127.0.1.1
    code, out, seconds = check_local(info, node)
    assert code == 1 and out.count("\n") == 1, out
    assert out.startswith(f"ERROR: ddpfix: hosts.hostname-loopback: hostname {node} resolves to 127.0.1.1"), out
    assert seconds < 2.0
    code, out, _ = check_local(info, node, "-v")
    assert code == 1 and all(ln.startswith("ERROR: ddpfix: ") for ln in out.splitlines())
    code, out, _ = check_local(info, "node1")  # the scenario changes the last two nodes only
    assert (code, out) == (0, ""), out


def test_iptables_worker2_gives_the_nhc_line(lab_factory) -> None:
    info = lab_factory(nodes=3, scenario="iptables-worker2", wait_sync=False)
    apply_env(info)
    code, out, seconds = check_local(info, "node2")
    assert code == 1 and out.startswith("ERROR: ddpfix: firewall.peer-ports-blocked: TCP "), out
    assert seconds < 2.0
    # a node without the cluster file (never set up): passes with a note, unless the site requires the file
    code, out, _ = check_local(info, "node2", "--cluster-file", "/nonexistent/cluster.json")
    assert code == 0 and out.startswith("NOTE: ddpfix: no cluster file /nonexistent/cluster.json on "), out
    code, out, _ = check_local(info, "node2", "--cluster-file", "/nonexistent/cluster.json", "--require-cluster-file")
    assert code == 2 and out.startswith("ERROR: ddpfix: cluster-file: cluster file /nonexistent/cluster.json: ")


SRUN = '''#!{python}
"""srun for the test: one task per lab node (SLURM_JOB_NODELIST), started at once, the command after srun's options."""
import os, subprocess, sys
sys.path.insert(0, {controller!r})
from ddpfix import lab
args = sys.argv[1:]
while args and args[0].startswith("--"):
    args.pop(0)
env = ["env", "PATH={venv}:/usr/bin:/bin", "TORCHRUN={venv}/torchrun", "DDPFIX_PG_TIMEOUT=30"]
nodes = [n.name for n in lab.info({lab!r}).nodes]
procs = [lab.node_popen({lab!r}, n, env + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
         for n in nodes]
rc = 0
for n, p in zip(nodes, procs):
    out, _ = p.communicate(timeout=120)
    sys.stdout.write("".join(n + ": " + ln + "\\n" for ln in out.splitlines()))
    rc = rc or p.returncode
sys.exit(rc)
'''


def test_torchrun_example_runs_the_allreduce_from_the_env_files(clean_lab, tmp_path) -> None:
    info = clean_lab
    hand = yaml.safe_load(info.inventory.read_text())["all"]["children"]["ddp_nodes"]["vars"]
    site = {k: v for k, v in hand.items() if k not in ("ddp_master", "ansible_ssh_common_args")}
    site["ansible_ssh_common_args"] = f"-F {info.ssh_config}"
    (tmp_path / "site.yml").write_text(yaml.safe_dump({"ddp_nodes": {"vars": site}}))
    wrapper = tmp_path / "ddpfix"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'from ddpfix.cli import main; main()' \"$@\"\n")
    srun = tmp_path / "srun"
    srun.write_text(SRUN.format(python=sys.executable, controller=str(ROOT / "controller"), venv=VENV_BIN,
                                lab=info.name))
    for f in (wrapper, srun):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    # the env files must come from this run: no file from an earlier test
    for n in info.nodes:
        lab.node_exec(info.name, n.name, ["rm", "-f", "/etc/ddpfix/ddp.env", "/etc/ddpfix/cluster.json"])
    env = {"SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS_PER_NODE": "1",
           "DDPFIX": str(wrapper), "DDPFIX_INVENTORY": str(tmp_path / "site.yml"), "SRUN": str(srun)}
    script = str(ROOT / "roles" / "ddpfix_verify" / "files" / "ddpfix_allreduce.py")
    r = subprocess.run([str(ROOT / "examples" / "torchrun.sh"), script], capture_output=True, text=True, timeout=900,
                       env={**os.environ, **env})
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    results = [json.loads(ln.split("DDPFIX_RESULT ", 1)[1]) for ln in r.stdout.splitlines() if "DDPFIX_RESULT " in ln]
    assert sorted(x["rank"] for x in results) == [0, 1, 2] and all(x["ok"] and x["world_size"] == 3 for x in results)
    # the ranks are the env files' (node order of the allocation), read by torchrun from PET_* alone
    by_node = {ln.split(":", 1)[0]: json.loads(ln.split("DDPFIX_RESULT ", 1)[1])["rank"]
               for ln in r.stdout.splitlines() if "DDPFIX_RESULT " in ln}
    assert by_node == {"node1": 0, "node2": 1, "node3": 2}
    text = lab.node_exec(info.name, "node2", ["cat", "/etc/ddpfix/ddp.env"]).stdout
    assert "PET_NODE_RANK=1\n" in text and "\nRANK=" not in text and "WORLD_SIZE=" not in text
