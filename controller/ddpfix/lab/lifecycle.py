"""A lab's lifecycle: `up` (state dir, node file trees, keys, network, nodes, daemons, inventory), `info`, `status`
and `down` (see the package docstring of `ddpfix.lab` for the layout)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ddpfix.errors import ExitCode
from ddpfix.lab.daemons import (
    Runtime,
    _sshd_answers,
    _start_chrony,
    _start_nodes,
    _start_sshd,
    wait_synchronised,
)
from ddpfix.lab.model import (
    DEFAULT_NAME,
    DEFAULT_NODES,
    DEFAULT_SUBNET,
    STATE_ROOT,
    LabError,
    LabInfo,
    LabPlan,
    LabStatus,
    NodeInfo,
    NodeStatus,
    host_link,
    state_dir,
    switch_netns,
    validate_name,
)
from ddpfix.lab.network import _block_direct_ssh, _check_subnet_free, _create_network
from ddpfix.lab.nodefiles import (
    INVENTORY_MARKER,
    inventory_side_files,
    keygen,
    lab_uid,
    prepare_node_files,
    write_client_files,
    write_inventory,
)
from ddpfix.lab.plan import plan_lab
from ddpfix.lab.prerequisites import check_prerequisites, python_home
from ddpfix.lab.system import (
    SSH_PORT,
    LabState,
    _kill,
    _lab_netns,
    _link_exists,
    _load_state,
    _locked,
    _netns_list,
    _require_state,
    _run,
    _save_state,
    _wait,
    _write,
    lab_mounts,
    pid_alive,
    ssh_banner,
)


def up(name: str = DEFAULT_NAME, nodes: int = DEFAULT_NODES, scenario: str | Sequence[str] | None = None,
       subnet: str = DEFAULT_SUBNET, ifnames: str | Sequence[str] | None = None,
       inventory_dir: str | os.PathLike[str] | None = None, *, wait_sync: bool = True,
       sync_timeout: float = 30.0, pythons: str | Mapping[str, str] | None = None) -> LabInfo:
    """Create lab `name` and write `<inventory_dir>/hosts.yml`; return what was built.

    Raises LabError: INVALID_INPUT for bad options or when the lab already exists,
    PREREQUISITE when not root or a package is missing, RUN_FAILED when building fails (then
    everything created so far has been removed again). With `wait_sync`, waits (up to
    `sync_timeout`) until every chronyd reports a synchronised clock. `pythons` ({"node2": "3.8"} or
    "node2=3.8,..."): those nodes run that pyenv build as ansible_python_interpreter."""
    plan = plan_lab(name, nodes, scenario, subnet, ifnames, pythons)
    check_prerequisites(plan.scenarios)
    for n in plan.nodes:
        if n.python:
            n.python_home = str(python_home(n.python))
    inv_dir = Path(inventory_dir if inventory_dir is not None else Path("inventories") / "lab").absolute()
    with _locked(name):
        if state_dir(name).exists() or _lab_netns(name) or _link_exists(host_link(name)):
            raise LabError(
                f"lab {name!r} already exists: run 'ddpfix lab down --name {name}' first", ExitCode.INVALID_INPUT
            )
        for f in ["hosts.yml", *inventory_side_files(plan)]:
            _check_inventory_free(inv_dir / f, name)
        _check_subnet_free(plan)
        try:
            return _build(plan, inv_dir, wait_sync=wait_sync, sync_timeout=sync_timeout)
        except BaseException as exc:
            try:
                _teardown(name)
            except Exception as exc2:  # noqa: BLE001 - reported with the original error, which is re-raised
                raise LabError(f"{_msg(exc)}; cleanup also failed: {_msg(exc2)}", ExitCode.RUN_FAILED) from exc
            if isinstance(exc, LabError):
                raise
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise LabError(f"lab up failed: {_msg(exc)} (everything created was removed)", ExitCode.RUN_FAILED) from exc


def _msg(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _check_inventory_free(path: Path, name: str) -> None:
    if not path.exists():
        return
    head = path.read_text(errors="replace")[:300]
    if not head.startswith(INVENTORY_MARKER):
        raise LabError(
            f"{path} exists and was not written by 'ddpfix lab up': pass another --inventory-dir",
            ExitCode.INVALID_INPUT,
        )
    other = (
        head.splitlines()[0].removeprefix(INVENTORY_MARKER).strip().split()[0]
        if head.splitlines()[0] != INVENTORY_MARKER
        else ""
    )
    if other and other != name and state_dir(other).exists():
        raise LabError(
            f"{path} belongs to the running lab {other!r}: pass another --inventory-dir", ExitCode.INVALID_INPUT
        )


#: The machine-wide lock under which a lab's subnet is checked free and its network made ('_' starts no lab name).
SUBNETS_LOCK = "_subnets"


def _claim_network(plan: LabPlan) -> None:
    """The lab's network, its subnet checked free again under `SUBNETS_LOCK`: two labs coming up at once (parallel
    tests, benchmarks) never both take a subnet that was free when each looked."""
    with _locked(SUBNETS_LOCK):
        _check_subnet_free(plan)
        _create_network(plan)


def _build(plan: LabPlan, inv_dir: Path, *, wait_sync: bool, sync_timeout: float) -> LabInfo:
    t0 = time.monotonic()
    name = plan.name
    sdir = state_dir(name)
    sdir.mkdir(mode=0o700, parents=True)
    _run(["mount", "-t", "tmpfs", "-o", "mode=0700,nosuid,nodev", f"ddpfix-lab-{name}", str(sdir)])
    state: LabState = {
        "version": 1,
        "name": name,
        "subnet": str(plan.subnet),
        "scenarios": plan.scenarios,
        "created": time.time(),
        "master": plan.master.name,
        "master_port": plan.master_port,
        "host_link": host_link(name),
        "switch_netns": switch_netns(name),
        "inventory": str(inv_dir / "hosts.yml"),
        "inventory_files": [str(inv_dir / f) for f in inventory_side_files(plan)],
        "ssh_user": plan.ssh_user,
        "ssh_port": plan.ssh_port,
        "bastion": plan.bastion,
        "inventory_dirs_created": [str(p) for p in [inv_dir, *inv_dir.parents] if not p.exists()],
        "supervisor": None,
        "nodes": {
            n.name: {
                "hostname": n.hostname,
                "address": str(n.address),
                "ifname": n.ifname,
                "netns": n.netns,
                "pids": {},
            }
            for n in plan.nodes
        },
    }
    _save_state(sdir, state)
    rt = Runtime(plan, sdir, state)

    # keys and node file trees, in parallel with the network
    with ThreadPoolExecutor(max_workers=8) as pool:
        key_job = pool.submit(keygen, sdir / "id_ed25519", f"ddpfix-lab-{name}")
        file_jobs = [pool.submit(prepare_node_files, rt, n) for n in plan.nodes]
        _claim_network(plan)
        key_job.result()
        for j in file_jobs:
            j.result()
    (rt.node_dir(plan.master).parent.parent / "logs").mkdir(exist_ok=True)
    pub = (sdir / "id_ed25519.pub").read_text()
    for n in plan.nodes:
        _write(rt.node_dir(n) / "root" / ".ssh" / "authorized_keys", pub, 0o600)
        if plan.ssh_user != "root":
            keys = rt.node_dir(n) / "home" / plan.ssh_user / ".ssh" / "authorized_keys"
            _write(keys, pub, 0o600)
            os.chown(keys, lab_uid(), lab_uid())

    _start_nodes(rt)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda n: _start_sshd(rt, n), plan.nodes))
    write_client_files(rt)
    # scenario tasks, then chrony
    for n in plan.nodes:
        for task in n.tasks:
            task(rt, n)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda n: _start_chrony(rt, n), [n for n in plan.nodes if n.chrony]))
    _wait(lambda: all(ssh_banner(str(n.address), plan.ssh_port) for n in plan.nodes), 10, "sshd on every node")
    if plan.bastion:
        _block_direct_ssh(plan)
    inv = write_inventory(rt, inv_dir)
    state["inventory"] = str(inv)
    state["up_seconds"] = round(time.monotonic() - t0, 3)
    _save_state(sdir, state)
    if wait_sync and any(n.chrony for n in plan.nodes):
        wait_synchronised(name, timeout=sync_timeout)
    return info(name)


def info(name: str = DEFAULT_NAME) -> LabInfo:
    """What `up` built (from the lab's state file)."""
    state = _require_state(name)
    sdir = state_dir(name)
    return LabInfo(
        name=name,
        subnet=state["subnet"],
        scenarios=list(state["scenarios"]),
        state_dir=sdir,
        inventory=Path(state["inventory"]),
        private_key=sdir / "id_ed25519",
        known_hosts=sdir / "known_hosts",
        ssh_config=sdir / "ssh_config",
        master=state["master"],
        master_port=state["master_port"],
        ssh_user=state.get("ssh_user", "root"),
        ssh_port=state.get("ssh_port", SSH_PORT),
        bastion=state.get("bastion"),
        nodes=[NodeInfo(**_node_fields(n, s)) for n, s in state["nodes"].items()],
    )


def _node_fields(name: str, s: Mapping[str, Any]) -> dict[str, Any]:
    """A node's recorded identity, as NodeInfo and NodeStatus both carry it."""
    return {"name": name, "hostname": s["hostname"], "address": s["address"], "ifname": s["ifname"],
            "netns": s["netns"], "pid": s["pids"].get("init", {}).get("pid", 0)}


def status(name: str = DEFAULT_NAME) -> LabStatus:
    """Nodes, addresses, interfaces, which recorded processes are alive, whether sshd answers."""
    validate_name(name)
    state = _load_state(name)
    if state is None:
        return LabStatus(name=name, exists=bool(_lab_netns(name)) or state_dir(name).exists())
    out = LabStatus(
        name=name,
        exists=True,
        subnet=state["subnet"],
        scenarios=list(state["scenarios"]),
        inventory=state.get("inventory"),
        state_dir=str(state_dir(name)),
    )
    with ThreadPoolExecutor(max_workers=8) as pool:
        reach = dict(zip(state["nodes"], pool.map(lambda n: _sshd_answers(state, n), state["nodes"]), strict=False))
    for n, s in state["nodes"].items():
        procs = {k: pid_alive(v) for k, v in s["pids"].items() if k not in ("init", "launcher")}
        out.nodes.append(
            NodeStatus(
                **_node_fields(n, s),
                alive=pid_alive(s["pids"].get("init")),
                sshd=reach[n],
                processes=procs,
            )
        )
    return out


def list_labs() -> list[str]:
    """Names of labs with a state dir on this machine."""
    if not STATE_ROOT.is_dir():
        return []
    return sorted(p.name for p in STATE_ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))


def status_dict(st: LabStatus) -> dict[str, Any]:
    return asdict(st)


def down(name: str = DEFAULT_NAME) -> bool:
    """Remove lab `name` completely; True if there was anything to remove. Safe to repeat."""
    validate_name(name)
    if os.geteuid() != 0:
        raise LabError("the lab needs root: run it with sudo", ExitCode.PREREQUISITE)
    with _locked(name):
        existed = _teardown(name)
    with contextlib.suppress(OSError):
        (STATE_ROOT / f".{name}.lock").unlink()
    return existed


def _kill_recorded(state: LabState) -> None:
    """Kill the lab's recorded processes, innermost first, so that each is reaped by its parent.

    Killing a node's PID 1 kills everything in its PID namespace; its `unshare` launcher then
    exits and the supervisor reaps it, and exits when no node is left. Launchers and the
    supervisor are killed only if they outlive that (they would then stay zombies of PID 1 on a
    machine whose init does not reap)."""
    name = state["name"]
    daemons, inits, launchers = [], [], []
    for s in state["nodes"].values():
        pids = s.get("pids", {})
        daemons += [v for k, v in pids.items() if k not in ("init", "launcher") and v]
        inits += [pids["init"]] if pids.get("init") else []
        launchers += [pids["launcher"]] if pids.get("launcher") else []
    sup = [state["supervisor"]] if state.get("supervisor") else []
    for r in daemons + inits:
        _kill(r)
    _wait(lambda: not any(pid_alive(r) for r in daemons + inits), 10, f"the nodes of lab {name!r} to exit")
    rest = launchers + sup
    for stragglers in ([], launchers, sup):
        for r in stragglers:
            _kill(r)
        with contextlib.suppress(LabError):
            _wait(lambda: not any(pid_alive(r) for r in rest), 2, "")
    if any(pid_alive(r) for r in rest):
        raise LabError(
            f"processes of lab {name!r} did not exit: {[r['pid'] for r in rest if pid_alive(r)]}", ExitCode.RUN_FAILED
        )
    for r in sup:  # reap it if it is our child (tests call up() and down() in one process)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(r["pid"], os.WNOHANG)


def _teardown(name: str) -> bool:
    sdir = state_dir(name)
    state = _load_state(name)
    existed = state is not None or sdir.exists() or bool(_lab_netns(name)) or _link_exists(host_link(name))
    if state:
        _kill_recorded(state)
    errors = []
    for ns in sorted(_lab_netns(name)):
        res = _run(["ip", "netns", "del", ns], check=False)
        if res.returncode != 0 and ns in _netns_list():
            errors.append(f"ip netns del {ns}: {res.stderr.strip()}")
    hl = host_link(name)
    if _link_exists(hl):
        res = _run(["ip", "link", "del", hl], check=False)
        if res.returncode != 0 and _link_exists(hl):
            errors.append(f"ip link del {hl}: {res.stderr.strip()}")
    if state and state.get("inventory"):
        inv = Path(state["inventory"])
        with contextlib.suppress(OSError):
            if inv.read_text(errors="replace").startswith(f"{INVENTORY_MARKER} {name}\n"):
                inv.unlink()
                for side in state.get("inventory_files", []):
                    with contextlib.suppress(OSError):
                        if Path(side).read_text(errors="replace").startswith(f"{INVENTORY_MARKER} {name}\n"):
                            Path(side).unlink()
                for d in state.get("inventory_dirs_created", []):  # innermost first; only if empty
                    with contextlib.suppress(OSError):
                        Path(d).rmdir()
    for mp in sorted({m for m in lab_mounts(name) if m.startswith(str(sdir))}, key=len, reverse=True):
        res = _run(["umount", mp], check=False)
        if res.returncode != 0:
            res = _run(["umount", "-l", mp], check=False)
            if res.returncode != 0:
                errors.append(f"umount {mp}: {res.stderr.strip()}")
    if sdir.exists():
        shutil.rmtree(sdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            sdir.rmdir()
        if sdir.exists():
            errors.append(f"could not remove {sdir}")
    if errors:
        raise LabError(f"lab down {name!r} incomplete: {'; '.join(errors)}", ExitCode.RUN_FAILED)
    return existed
