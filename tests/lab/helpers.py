"""What the lab tests share, once: running ddpfix (in-process through click, or as its own process), running
commands on a lab node, and editing the lab's inventory. Imported by the lab test modules as `helpers` (pytest puts
tests/lab on sys.path)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from ddpfix import lab
from ddpfix.cli import cli

ROOT = Path(__file__).resolve().parents[2]

#: Short torch timeouts for the lab (role defaults are overridable inventory variables).
FAST_TORCH = {"ddpfix_verify_pg_timeout": 10, "ddpfix_verify_rdzv_timeout": 15, "ddpfix_verify_deadline": 45}

#: The installed console script, run on this checkout's code (as a user runs it, in its own process).
DDPFIX = str(Path(sys.executable).parent / "ddpfix")

#: The interpreter the lab's nodes run (the lab inventory's ddp_python, with torch): DDPFIX_LAB_PYTHON (scripts/test.sh
#: sets it to .venv-node's, on Python 3.11 outside /root), else the controller's (the node sees /usr and /work).
NODE_PYTHON = os.environ.get("DDPFIX_LAB_PYTHON") or sys.executable

#: ddpfix inside a node: the checkout's package on PYTHONPATH, the nodes' interpreter.
NODE_DDPFIX = ["env", f"PYTHONPATH={ROOT / 'controller'}", NODE_PYTHON, "-c", "from ddpfix.cli import main; main()"]


def need_node_torch() -> None:
    """Skip the test when the nodes' interpreter has no torch (the controller's need not have it)."""
    r = subprocess.run([NODE_PYTHON, "-c", "import torch"], capture_output=True, text=True, check=False, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"no torch in the lab nodes' interpreter {NODE_PYTHON} (DDPFIX_LAB_PYTHON)")


def node_cuda() -> bool:
    """Whether torch in the nodes' interpreter sees a GPU."""
    r = subprocess.run([NODE_PYTHON, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True,
                       text=True, check=False, timeout=120)
    return r.stdout.strip() == "True"

# ------------------------------------------------------------------ ddpfix in this process (click's runner)


def invoke(*args: str, cwd: Path | None = None) -> Result:
    """`ddpfix ARGS` through click's runner, from `cwd` when given."""
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(cli, list(args), catch_exceptions=False)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(cli, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def ddpfix(inv: str, *args: str) -> tuple[int, str, str]:
    """`ddpfix -i INV ARGS`: exit code, stdout, stderr."""
    r = invoke("-i", inv, *args)
    return r.exit_code, r.stdout, r.stderr


def ddpfix_json(inv: str, *args: str) -> tuple[int, dict[str, Any]]:
    """`ddpfix -i INV ARGS --format json`: exit code and the document (no document fails the test)."""
    code, out, err = ddpfix(inv, *args, "--format", "json")
    try:
        return code, json.loads(out)
    except ValueError:
        raise AssertionError(f"no JSON (exit {code}): {out[-2000:]} {err[-2000:]}") from None


def ids(doc: dict[str, Any], min_severity: str = "warning") -> set[str]:
    """The finding ids of a JSON document at `min_severity` or above."""
    order = {"info": 1, "warning": 2, "error": 3}
    return {f["id"] for f in doc.get("findings", []) if order[f["severity"]] >= order[min_severity]}


# ------------------------------------------------------------------ ddpfix as its own process


def clean_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """This environment without the user's DDPFIX_* settings, with its own state directory and no colours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPFIX_")}
    return {**env, "DDPFIX_STATE_DIR": str(state_dir), "NO_COLOR": "1", **extra}


def ddpfix_proc(*args: str, state_dir: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`ddpfix ARGS` in its own Python process (with `state_dir`: in `clean_env`, else in this environment)."""
    full = clean_env(state_dir, **(env or {})) if state_dir is not None else {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", "from ddpfix.cli import main; main()", *args], check=False,
                          capture_output=True, text=True, timeout=timeout, env=full)


def cli_env(state: Path) -> dict[str, str]:
    """The console script's environment: this checkout's package, its own state directory."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "controller"), "DDPFIX_STATE_DIR": str(state)}


def run_cli(inv: Path | str, state: Path, *args: str, timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    """The console script `ddpfix -i INV ARGS --format json`: exit code, the document ({} when none), stderr."""
    p = subprocess.run([DDPFIX, "-i", str(inv), *args, "--format", "json"], env=cli_env(state), capture_output=True,
                       text=True, timeout=timeout)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else {}
    except ValueError:
        doc = {}
    return p.returncode, doc, p.stderr


# ------------------------------------------------------------------ ansible-playbook without the CLI


def playbook_env(tmp: Path, **extra: str) -> dict[str, str]:
    """ansible-playbook's environment: its own state directory under `tmp`, the checkout's ddpfix package (as the
    action plugin finds it in a checkout without an install), no DDPFIX_INVENTORY/LIMIT or fact cache settings."""
    e = {**os.environ, "DDPFIX_STATE_DIR": str(tmp / "state"), "NO_COLOR": "1", "ANSIBLE_NOCOLOR": "1",
         "PYTHONPATH": os.pathsep.join([str(ROOT / "controller"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for k in ("DDPFIX_INVENTORY", "DDPFIX_LIMIT", "ANSIBLE_CACHE_PLUGIN", "ANSIBLE_CACHE_PLUGIN_CONNECTION"):
        e.pop(k, None)
    e.update(extra)
    return e


def ansible_playbook(playbook: Path, inventory: Path, *args: str, tmp: Path,
                     **extra_env: str) -> subprocess.CompletedProcess[str]:
    """`ansible-playbook -i INVENTORY PLAYBOOK ARGS` from `tmp`, in `playbook_env`."""
    exe = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run([str(exe), "-i", str(inventory), str(playbook), *args], capture_output=True,
                          text=True, timeout=600, env=playbook_env(tmp, **extra_env), cwd=str(tmp), check=False)


# ------------------------------------------------------------------ lab nodes


def sh(info: Any, node: str, cmd: str, *, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`sh -c CMD` on a lab node."""
    return lab.node_exec(info.name, node, ["sh", "-c", cmd], input=input, check=check)


def sh_out(info: Any, node: str, cmd: str, *, check: bool = True) -> str:
    """The stdout of `sh -c CMD` on a lab node."""
    return sh(info, node, cmd, check=check).stdout


def put(info: Any, node: str, path: str, text: str) -> None:
    """Write a file on a node (its directory made)."""
    lab.node_exec(info.name, node, ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "put", path], input=text)


def handmade_env(info: Any) -> None:
    """Env files as people write them by hand: right master and ranks, no socket interface names."""
    master, n = info.nodes[0].address, len(info.nodes)
    for rank, node in enumerate(info.nodes):
        text = (f"MASTER_ADDR={master}\nMASTER_PORT=29500\nNNODES={n}\nNODE_RANK={rank}\n"
                f"NPROC_PER_NODE=1\nWORLD_SIZE={n}\n")
        put(info, node.name, "/etc/ddpfix/ddp.env", text)


def snapshot(info: Any) -> dict[str, str]:
    """Checksums of every node's /etc and its live firewall ruleset."""
    script = ("find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum; "
              "iptables-save 2>/dev/null | grep -v '^#' | sed 's/\\[[0-9:]*\\]//'; "
              "nft list ruleset 2>/dev/null | sed 's/counter packets [0-9]* bytes [0-9]*/counter/'")
    return {n.name: sh_out(info, n.name, script) for n in info.nodes}


# ------------------------------------------------------------------ the lab inventory


def edit_inventory(info: Any, edit: Callable[[dict[str, Any]], None]) -> None:
    """Apply `edit` to the ddp_nodes group of the lab's YAML inventory, in place."""
    doc = yaml.safe_load(info.inventory.read_text())
    edit(doc["all"]["children"]["ddp_nodes"])
    info.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))


def add_inventory_vars(info: Any, extra: dict[str, Any]) -> None:
    """Set cluster (group) variables in the lab inventory."""
    edit_inventory(info, lambda g: g["vars"].update(extra))


def set_host_vars(info: Any, node: str, extra: dict[str, Any]) -> None:
    """Set variables of one host in the lab inventory."""
    def edit(g: dict[str, Any]) -> None:
        g["hosts"][node] = {**(g["hosts"].get(node) or {}), **extra}
    edit_inventory(info, edit)


@contextlib.contextmanager
def inventory_vars(info: Any, host_vars: dict[str, Any] | None = None, **extra: Any) -> Iterator[None]:
    """Set cluster vars (and `host_vars` on every host) in the lab inventory for the block; the inventory is
    restored afterwards."""
    original = info.inventory.read_text()

    def edit(g: dict[str, Any]) -> None:
        g["vars"].update(extra)
        for hv in g["hosts"].values():
            hv.update(host_vars or {})
    edit_inventory(info, edit)
    try:
        yield
    finally:
        info.inventory.write_text(original)
