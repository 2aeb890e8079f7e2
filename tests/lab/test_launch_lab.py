"""Launching jobs on real lab hosts: `ddpfix check --local` inside the nodes (healthy and planted faults, NHC output,
under 2 s) and the torchrun example run end to end with the lab's nodes as the Slurm allocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import NODE_DDPFIX, NODE_PYTHON, ddpfix_proc

from ddpfix import lab
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = os.path.dirname(NODE_PYTHON)  # the nodes' venv: ddpfix and torchrun run inside the nodes


def check_local(info, node: str, *extra: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = lab.node_exec(info.name, node, [*NODE_DDPFIX, "check", "--local", *extra], check=False, timeout=60)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0


def apply_env(info) -> None:
    r = ddpfix_proc("-i", str(info.inventory), "env", "--apply", timeout=900)
    assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])


def test_healthy_nodes_pass_silently(clean_lab) -> None:
    apply_env(clean_lab)
    doc = json.loads(lab.node_exec(clean_lab.name, "node2", ["cat", "/etc/ddpfix/cluster.json"]).stdout)
    assert [n["address"] for n in doc["nodes"]] == [n.address for n in clean_lab.nodes]
    mode = lab.node_exec(clean_lab.name, "node2", ["stat", "-c", "%a", "/etc/ddpfix/cluster.json"]).stdout.strip()
    assert mode == "644"
    for n in clean_lab.nodes:
        code, out, _ = check_local(clean_lab, n.name)  # speed: benchmarks, not a timed assertion
        assert (code, out) == (0, ""), (n.name, out)
    code, out, _ = check_local(clean_lab, "node3", "-v")
    assert code == 0 and out.startswith("OK: ddpfix: node3: rank 2 of 3") and out.count("\n") == 1
    # the file as a launch script gets it without /etc: the same as the block written on the node
    r = ddpfix_proc("-i", str(clean_lab.inventory), "env", "--stdout", "--node", "node3", timeout=900)
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
    hole = lab.node_popen(clean_lab.name, node, [NODE_PYTHON, "-c", BLACKHOLE], stdout=subprocess.DEVNULL,
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
    assert seconds < 4 + 15, seconds  # the deadline holds (plus the interpreter's start inside a loaded node)
    code, out, _ = check_local(clean_lab, node)  # restored: healthy again
    assert (code, out) == (0, ""), out


def test_hostname_loopback_gives_the_nhc_line(lab_factory) -> None:
    info = lab_factory(nodes=3, scenario="hostname-loopback", wait_sync=False)
    apply_env(info)
    node = info.nodes[-1].name  # the scenario's highest-address node maps its hostname to 127.0.1.1
    code, out, _ = check_local(info, node)
    assert code == 1 and out.count("\n") == 1, out
    assert out.startswith(f"ERROR: ddpfix: {hosts_rules.HOSTNAME_LOOPBACK.id}: hostname {node} resolves to 127.0.1.1"), out
    code, out, _ = check_local(info, node, "-v")
    assert code == 1 and all(ln.startswith("ERROR: ddpfix: ") for ln in out.splitlines())
    code, out, _ = check_local(info, "node1")  # the scenario changes the last two nodes only
    assert (code, out) == (0, ""), out


def test_iptables_worker2_gives_the_nhc_line(lab_factory) -> None:
    info = lab_factory(nodes=3, scenario="iptables-worker2", wait_sync=False)
    apply_env(info)
    code, out, _ = check_local(info, "node2")
    assert code == 1 and out.startswith(f"ERROR: ddpfix: {firewall_rules.PEER_PORTS_BLOCKED.id}: TCP "), out
    # a node without the cluster file (never set up): passes with a note, unless the site requires the file
    code, out, _ = check_local(info, "node2", "--cluster-file", "/nonexistent/cluster.json")
    assert code == 0 and out.startswith("NOTE: ddpfix: no cluster file /nonexistent/cluster.json on "), out
    code, out, _ = check_local(info, "node2", "--cluster-file", "/nonexistent/cluster.json", "--require-cluster-file")
    assert code == 2 and out.startswith("ERROR: ddpfix: cluster-file: cluster file /nonexistent/cluster.json: ")


#: A job step's task as the job's user: uid/gid 65534 (nobody: no sudo, cannot write /etc).
AS_USER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
#: The variables srun gives a task of a one-task-per-node step over the lab's 3 nodes (no slurmd: set per node).
STEP_VARS = {"SLURM_JOB_ID": "880042", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_STEP_NODELIST": "node[1-3]",
             "SLURM_JOB_NUM_NODES": "3", "SLURM_STEP_NUM_NODES": "3", "SLURM_NTASKS_PER_NODE": "1"}

SRUN = '''#!{python}
"""srun for the test: one task per lab node, all at once, as an unprivileged user, with the step's SLURM_* variables
(SLURM_NODEID, SLURMD_NODENAME per node) and what srun propagates of the batch script's environment."""
import os, subprocess, sys
from ddpfix import lab
args = sys.argv[1:]
while args and args[0].startswith("--"):
    args.pop(0)
keep = {{k: os.environ[k] for k in ("DDPFIX", "TORCHRUN", "DDPFIX_NPROC_PER_NODE") if k in os.environ}}
base = {{**{step!r}, **keep, "PATH": "{venv}:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp",
        "DDPFIX_PG_TIMEOUT": "120"}}  # 6 workers import torch on 2 shared cores before they meet: not a host test
nodes = [n.name for n in lab.info({lab!r}).nodes]
procs = [lab.node_popen({lab!r}, n, {as_user!r} + ["env"] + [k + "=" + v for k, v in base.items()]
                        + ["SLURM_NODEID=%d" % i, "SLURMD_NODENAME=" + n] + args,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i, n in enumerate(nodes)]
rc = 0
for n, p in zip(nodes, procs):
    out, _ = p.communicate(timeout=180)
    sys.stdout.write("".join(n + ": " + ln + "\\n" for ln in out.splitlines()))
    rc = rc or p.returncode
sys.exit(rc)
'''


def test_slurm_batch_script_exports_per_job_values_as_a_user_and_torch_allreduces(clean_lab, tmp_path) -> None:
    """The Slurm flow of examples/slurm: the operator's one-time `env --apply` (ddp_env_scope: node: per-node keys
    only), the Prolog's `check --local`, then examples/slurm/train.sbatch of a task-based job without GPUs (2 tasks
    per node) whose srun starts examples/slurm/ddp-step.sh on every node at once as an unprivileged user: `ddpfix env
    --slurm --export` from the step's SLURM_* variables and a real torch all-reduce over 6 processes from those
    values; the job writes nothing in /etc."""
    info = clean_lab
    r = ddpfix_proc("-i", str(info.inventory), "-e", "ddp_env_scope=node", "-e", "ddp_job_port_range=21000-21999",
                    "env", "--apply", timeout=900)
    assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])
    etc = ["sh", "-c", "cat /etc/ddpfix/ddp.env /etc/ddpfix/cluster.json"]
    before = lab.node_exec(info.name, "node2", etc).stdout
    env_file = lab.node_exec(info.name, "node2", ["cat", "/etc/ddpfix/ddp.env"]).stdout
    assert "GLOO_SOCKET_IFNAME=" in env_file and "MASTER_ADDR" not in env_file and "NODE_RANK" not in env_file
    code, out, _ = check_local(info, "node2")  # the Prolog on a node-scope site
    assert (code, out) == (0, ""), out
    srun = tmp_path / "srun"
    srun.write_text(SRUN.format(python=sys.executable, venv=VENV_BIN, lab=info.name, step=STEP_VARS,
                                as_user=AS_USER))
    srun.chmod(0o755)
    job = {"SLURM_JOB_ID": "880042", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3",
           "SLURM_NTASKS_PER_NODE": "2", "SLURM_SUBMIT_DIR": str(ROOT), "DDPFIX": f"{VENV_BIN}/ddpfix",
           "TORCHRUN": f"{VENV_BIN}/torchrun", "PATH": f"{tmp_path}:/usr/bin:/bin"}
    batch = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DDPFIX"))}
    r = subprocess.run([str(ROOT / "examples" / "slurm" / "train.sbatch"),
                        str(ROOT / "roles" / "ddpfix_verify" / "files" / "ddpfix_allreduce.py")],
                       capture_output=True, text=True, timeout=600, env={**batch, **job})
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    results = [(ln.split(":", 1)[0], json.loads(ln.split("DDPFIX_RESULT ", 1)[1]))
               for ln in r.stdout.splitlines() if "DDPFIX_RESULT " in ln]
    assert all(x["ok"] and x["world_size"] == 6 for _, x in results), results
    by_node = {n: sorted(x["rank"] for m, x in results if m == n) for n in ("node1", "node2", "node3")}
    assert by_node == {"node1": [0, 1], "node2": [2, 3], "node3": [4, 5]}, results
    # the export itself, as that user on node3: the master's cluster address, the job's port in the site's range
    r3 = lab.node_exec(info.name, "node3", [*AS_USER, "env", *(f"{k}={v}" for k, v in STEP_VARS.items()),
                                            "SLURM_NODEID=2", "SLURMD_NODENAME=node3", f"{VENV_BIN}/ddpfix", "env",
                                            "--slurm", "--export"])
    assert f"export MASTER_ADDR={info.nodes[0].address}\n" in r3.stdout and "export MASTER_PORT=21042\n" in r3.stdout
    assert "export NODE_RANK=2\n" in r3.stdout and "export NNODES=3\n" in r3.stdout
    assert lab.node_exec(info.name, "node2", etc).stdout == before  # the job wrote nothing in /etc
