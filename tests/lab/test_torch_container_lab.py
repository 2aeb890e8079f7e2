"""Issue 34 item 4 on real lab hosts: torch not on the host is not a host fault, and ddp_python may name the jobs'
interpreter inside a container image.

One clean 2-node lab. The nodes' /usr/bin/python3 has no torch (the lab's venv has it). `fakectr` stands in for a
container runtime (`fakectr run --rm --network host IMAGE python3 ARGS...`, docker's form): it starts "the image's"
python3, the lab's venv interpreter, with an empty environment (as docker does: nothing of the caller's environment
reaches the container), and logs each start on the node. Image lab/pytorch:old reports torch 2.4.1 (a stand-in that
prints what ddpfix's torch reader prints for a CUDA 12.1 build), any other image is not found (exit 125).

- A: no ddp_python (python3, no torch): the audit exits 0, no incomplete-facts finding, the torch comparison is listed as
  not evaluated on every node with how to point ddp_python at the jobs' interpreter.
- B: ddp_python the container argv (a YAML list): the audit reads torch's version through it (node2's older image
  is told apart by the torch-version finding, each node's evidence naming the argv), and `verify --torch` runs its
  all-reduce through it (the env file's values reach the container as arguments).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ddpfix_json

from ddpfix import lab
from ddpfix.rules import env as env_rules
from ddpfix.rules import reachability

pytestmark = pytest.mark.lab

IMAGE, OLD = "lab/pytorch:24.05", "lab/pytorch:old"
OLD_TORCH = '{"version": "2.4.1+cu121", "cuda": "12.1", "hip": null, "nccl": "2.20.5", "error": null}'


def _fakectr(path: Path, log: Path) -> None:
    path.write_text(f"""#!/bin/sh
# ddpfix lab stand-in for a container runtime (docker's form): fakectr run [--rm] [--network MODE] IMAGE CMD ARGS...
[ "$1" = run ] || {{ echo "fakectr: unknown command $1" >&2; exit 125; }}
shift
while [ $# -gt 0 ]; do
  case $1 in --rm) shift ;; --network) shift 2 ;; -*) echo "fakectr: unknown flag $1" >&2; exit 125 ;; *) break ;; esac
done
image=$1; shift
[ "$1" = python3 ] || {{ echo "fakectr: $1: not found in $image" >&2; exit 127; }}
shift
echo "$(hostname) $image $(printf '%s' "$2" | head -n 1)" >> {shlex.quote(str(log))}
case $image in
  {IMAGE}) exec env -i PATH=/usr/bin:/bin {shlex.quote(sys.executable)} "$@" ;;
  {OLD}) echo '{OLD_TORCH}'; exit 0 ;;
esac
echo "Unable to find image '$image' locally" >&2
exit 125
""")
    path.chmod(0o755)


@pytest.fixture(scope="module")
def ctr_lab(lab_factory, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """The lab, fakectr (in a directory the nodes share with this machine: /tmp) and its log."""
    info = lab_factory(nodes=2, scenario="clean")
    d = tmp_path_factory.mktemp("fakectr")
    log = d / "fakectr.log"
    _fakectr(d / "fakectr", log)
    return info, d / "fakectr", log


def _inventory(info: Any, path: Path, node2: Any = None, **groupvars: Any) -> str:
    doc = yaml.safe_load(info.inventory.read_text())
    g = doc["all"]["children"]["ddp_nodes"]
    g["vars"].pop("ddp_python", None)  # the lab's default: its venv's interpreter
    g["vars"].update(groupvars)
    if node2 is not None:
        g["hosts"]["node2"]["ddp_python"] = node2
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_a_no_torch_on_the_host_audits_clean_torch_not_evaluated(ctr_lab, tmp_path: Path) -> None:
    info, _, _ = ctr_lab
    assert lab.node_exec(info.name, "node1", ["python3", "-c", "import torch"], check=False).returncode != 0
    code, doc = ddpfix_json(_inventory(info, tmp_path / "hosts.yml"), "audit")
    assert code == 0, [(f["id"], f["host"], f["evidence"]) for f in doc["findings"]]
    assert not [f for f in doc["findings"] if f["id"] == reachability.INCOMPLETE.id]
    for node in ("node1", "node2"):
        ne = {i["id"]: i["reason"] for i in doc["hosts"][node]["not_evaluated"]}
        why = ne[env_rules.TORCH_VERSION_MISMATCH.id]
        assert why.startswith("torch not read: no torch in ddp_python (python3), not a host fault: set ddp_python"), why
        assert "[docker, run, --rm, --network, host, IMAGE, python3]" in why, why


def test_b_container_argv_reads_torch_and_runs_the_all_reduce(ctr_lab, tmp_path: Path) -> None:
    info, ctr, log = ctr_lab
    argv = [str(ctr), "run", "--rm", "--network", "host", IMAGE, "python3"]
    old = [str(ctr), "run", "--rm", "--network", "host", OLD, "python3"]
    log.unlink(missing_ok=True)

    # the audit reads each node's torch through its runtime: node2's older image is told apart
    code, doc = ddpfix_json(_inventory(info, tmp_path / "mixed.yml", node2=old, ddp_python=argv), "audit")
    (f,) = [f for f in doc["findings"] if f["id"] == env_rules.TORCH_VERSION_MISMATCH.id]
    assert code == 1 and f["host"] == "node2", doc["findings"]
    assert f"{shlex.join(old)} on node2: torch 2.4.1+cu121 (CUDA 12.1, NCCL 2.20.5)" in f["evidence"], f
    assert "node1: torch 2.13" in f["evidence"] and "run an image with torch==2.13" in f["fix"], f
    assert not [x for x in doc["findings"] if x["id"] == reachability.INCOMPLETE.id], doc["findings"]
    starts = log.read_text().splitlines()
    assert {ln for ln in starts if "# ddpfix torch-info" in ln} == {
        f"{info.node('node1').hostname} {IMAGE} # ddpfix torch-info",
        f"{info.node('node2').hostname} {OLD} # ddpfix torch-info"}, starts

    # verify --torch: torchrun and its workers inside "the image", the env file's values passed in as arguments
    inv = _inventory(info, tmp_path / "hosts.yml", ddp_python=argv)
    code, env = ddpfix_json(inv, "env", "--apply")
    assert code == 0, env
    log.unlink()
    code, v = ddpfix_json(inv, "verify", "--torch", "--no-checks")
    assert code == 0, v["torch"]
    assert all(r["ok"] and r["result"]["sum"] == 3.0 for r in v["torch"]), v["torch"]
    boots = [ln for ln in log.read_text().splitlines() if "torchrun inside ddp_python" in ln]
    assert sorted(ln.split()[0] for ln in boots) == sorted(n.hostname for n in info.nodes), boots
