"""Build, inspect and remove a lab of real SSH hosts in Linux namespaces on this machine.

Layout of a lab named NAME (every name derives from NAME, so labs with different names and
subnets coexist):

- network namespaces `ddpfix-NAME-nodeI` (one per node) and `ddpfix-NAME-sw` (the switch: a
  bridge `br0` with one veth port per node NIC and an uplink);
- in the root namespace only one veth, `ddpl<hash of NAME>`, holding the subnet's first address,
  so the controller (Ansible, ssh, tests) reaches the nodes; the host does not forward;
- per node a PID 1 (`ddpfix-node`, see `_nodeinit.py`) in new mount/UTS/IPC/PID namespaces inside
  the node's network namespace, started with CAP_SYS_TIME removed from the bounding set; every
  later process of the node (sshd, chronyd -x, firewalld, ...) is started with `nsenter -t PID -a`
  under `setpriv --bounding-set -sys_time`, so nothing in the lab can set the real clock;
- state under `/run/ddpfix-lab/NAME/` on a tmpfs of its own: `lab.json` (plan, PIDs with their
  start times, what was written where), the controller key, `known_hosts`, `ssh_config`, logs and
  per node its `etc/` (a copy of the host's /etc, bind-mounted over the node's whole /etc),
  `run/`, `root/`, `log/`, `chrony/` and `machine-id`.

`down` kills only recorded PIDs (checked against their recorded start time), deletes the
namespaces and the uplink, unmounts and removes the state dir and the inventory file `up` wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import sys
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, Sequence

import yaml

from ddpfix.app import ExitCode
from ddpfix.lab import scenarios as _scn
from ddpfix.lab.model import (
    DEFAULT_NAME,
    DEFAULT_NODES,
    DEFAULT_SUBNET,
    ENV_PATH,
    MAX_NODES,
    NODE_PATH,
    NODE_TMPDIR,
    STATE_ROOT,
    LabError,
    LabInfo,
    LabPlan,
    LabStatus,
    NodeInfo,
    NodePlan,
    NodeStatus,
    host_link,
    netns_name,
    parse_subnet,
    state_dir,
    switch_netns,
    validate_ifname,
    validate_name,
)

_PKG = Path(__file__).resolve().parent
INVENTORY_MARKER = "# ddpfix lab inventory"
SSH_PORT = 22
DROP_SYS_TIME = ["setpriv", "--bounding-set", "-sys_time", "--"]

# binary -> Debian package providing it
_REQUIRED = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "setsid": "util-linux",
    "/usr/sbin/sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
    "ssh": "openssh-client",
    "/usr/bin/python3": "python3",
}
_SCENARIO_REQUIRED = {
    "chrony": {"/usr/sbin/chronyd": "chrony", "chronyc": "chrony"},
    "firewalld-master": {"firewalld": "firewalld", "firewall-cmd": "firewalld", "/usr/bin/dbus-daemon": "dbus"},
    "iptables-worker": {"iptables-restore": "iptables"},
    "iptables-worker2": {"iptables-restore": "iptables"},
    "world-open": {"iptables-restore": "iptables"},
    "nftables-worker2": {"nft": "nftables"},
    "clock-skew": {"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1": "libfaketime"},
    "chrony-unsynced": {"/usr/sbin/chronyd": "chrony", "chronyc": "chrony"},
    "chrony-no-confdir": {"/usr/sbin/chronyd": "chrony", "chronyc": "chrony"},
    "chrony-rhel-layout": {"/usr/sbin/chronyd": "chrony", "chronyc": "chrony"},
    "bastion": {"nft": "nftables", "nc": "netcat-openbsd"},
    "nonroot-become": {"/usr/bin/sudo": "sudo"},
}
#: Lab node user of the non-root scenarios: the first uid/gid from here that the host does not use.
LAB_FIRST_UID = 1500


# ============================================================================ small helpers

def _run(argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float = 60,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(list(argv), input=input, text=True, capture_output=True, timeout=timeout, env=env)
    except FileNotFoundError as exc:
        raise LabError(f"{argv[0]}: not found", ExitCode.PREREQUISITE) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(argv[:6])}: timed out after {timeout:g} s", ExitCode.RUN_FAILED) from exc
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise LabError(f"{' '.join(argv[:6])} failed (rc {res.returncode}): {msg[-1] if msg else ''}", ExitCode.RUN_FAILED)
    return res


def _ip_batch(lines: list[str], netns: str | None = None) -> None:
    if not lines:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    _run(argv, input="\n".join(lines) + "\n")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


def _proc_start(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def pid_alive(rec: dict[str, int] | None) -> bool:
    """Is the recorded process (`{"pid", "start"}`) still the same, running process?"""
    return bool(rec) and _proc_start(rec["pid"]) == rec["start"]


def _kill(rec: dict[str, int] | None, sig: int = signal.SIGKILL) -> None:
    if pid_alive(rec):
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec["pid"], sig)


def _host_pid(init_pid: int, nspid: int) -> int | None:
    """Host PID of the process that is `nspid` in the PID namespace of `init_pid`."""
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return None
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
            if os.readlink(f"{entry.path}/ns/pid") != ns:
                continue
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                if int(line.split()[-1]) == nspid:
                    return int(entry.name)
                break
    return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(x) for x in Path(task.path, "children").read_text().split()]
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in _children(p):
            out.append(c)
            todo.append(c)
    return out


def _wait(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:g} s waiting for {what}", ExitCode.RUN_FAILED)
        time.sleep(interval)
        interval = min(interval * 1.5, 0.25)


def ssh_banner(address: str, port: int = SSH_PORT, timeout: float = 0.5) -> bool:
    """True when an SSH server answers with its banner at address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = STATE_ROOT / f".{name}.lock"
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _netns_list() -> set[str]:
    try:
        return {p.name for p in Path("/run/netns").iterdir()}
    except FileNotFoundError:
        return set()


def _lab_netns(name: str) -> set[str]:
    """Namespaces of lab `name` that exist now (by derived name)."""
    prefix = f"ddpfix-{name}-"
    return {
        ns for ns in _netns_list()
        if ns.startswith(prefix) and (ns[len(prefix):] == "sw" or (ns[len(prefix):].startswith("node") and ns[len(prefix) + 4:].isdigit()))
    }


def _link_exists(ifname: str) -> bool:
    return Path("/sys/class/net", ifname).exists()


def _mounted(path: Path) -> bool:
    p = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == p for line in f)


def lab_mounts(name: str) -> list[str]:
    """Mount points in this mount namespace that belong to lab `name` (state dir, netns files)."""
    sd = str(state_dir(name))
    own_ns = {f"/run/netns/{ns}" for ns in _lab_netns(name)} | {f"/run/netns/ddpfix-{name}-sw"}
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if mp == sd or mp.startswith(sd + "/") or mp in own_ns or mp.startswith(f"/run/netns/ddpfix-{name}-node"):
                out.append(mp)
    return out


# ============================================================================ prerequisites

def check_prerequisites(scenarios: Sequence[str] = ()) -> None:
    """Raise LabError(PREREQUISITE) unless root with every binary the lab (and scenarios) need."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, mounts, veths): run it with sudo", ExitCode.PREREQUISITE)
    need = dict(_REQUIRED)
    if "chrony-absent" not in scenarios:
        need.update(_SCENARIO_REQUIRED["chrony"])
    for s in scenarios:
        need.update(_SCENARIO_REQUIRED.get(s, {}))
    missing: dict[str, list[str]] = {}
    for binary, pkg in need.items():
        found = (os.path.exists(binary) if binary.endswith(".so.1") else os.access(binary, os.X_OK)) \
            if binary.startswith("/") else shutil.which(binary, path=NODE_PATH)
        if not found:
            missing.setdefault(pkg, []).append(os.path.basename(binary))
    if missing:
        pkgs = " ".join(sorted(missing))
        what = ", ".join(b for bs in missing.values() for b in bs)
        raise LabError(f"missing {what}: install the Debian package(s) {pkgs} (apt-get install {pkgs})", ExitCode.PREREQUISITE)


# ============================================================================ planning

def plan_lab(name: str = DEFAULT_NAME, nodes: int = DEFAULT_NODES, scenario: str | Sequence[str] | None = None,
             subnet: str = DEFAULT_SUBNET, ifnames: str | Sequence[str] | None = None) -> LabPlan:
    """Validate the options and build the plan (pure: creates nothing)."""
    validate_name(name)
    if not 1 <= nodes <= MAX_NODES:
        raise LabError(f"--nodes must be between 1 and {MAX_NODES}", ExitCode.INVALID_INPUT)
    net = parse_subnet(subnet)
    if isinstance(scenario, str) or scenario is None:
        names = _scn.parse_scenarios(scenario, nodes)
    else:
        names = _scn.parse_scenarios(",".join(scenario), nodes)
    if isinstance(ifnames, str):
        ifs = [x.strip() for x in ifnames.split(",") if x.strip()]
    else:
        ifs = list(ifnames or [])
    ifs = [validate_ifname(x) for x in ifs] or ["eth0"]
    plan = LabPlan(name=name, subnet=net, nodes=[], scenarios=names)
    if net.network_address + 10 + 2 * nodes + 1 >= plan.gateway:
        raise LabError(f"subnet {net} is too small for {nodes} nodes", ExitCode.INVALID_INPUT)
    for i in range(1, nodes + 1):
        node = f"node{i}"
        plan.nodes.append(
            NodePlan(
                name=node,
                index=i,
                hostname=node,
                address=net.network_address + 10 + i,
                ifname=ifs[(i - 1) % len(ifs)],
                netns=netns_name(name, node),
                chrony="master" if i == 1 else "client",
            )
        )
    base = [
        ("127.0.0.1", ["localhost"]),
        ("::1", ["localhost", "ip6-localhost", "ip6-loopback"]),
        ("ff02::1", ["ip6-allnodes"]),
        ("ff02::2", ["ip6-allrouters"]),
    ]
    for n in plan.nodes:
        n.hosts = [(a, list(h)) for a, h in base] + [(str(m.address), [m.hostname]) for m in plan.nodes]
    for s in names:
        _scn.SCENARIOS[s].apply(plan)
    return plan


def hosts_text(node: NodePlan) -> str:
    lines = ["# /etc/hosts of a ddpfix lab node"]
    lines += [f"{addr}\t{' '.join(names)}" for addr, names in node.hosts]
    return "\n".join(lines) + "\n"


def env_text(env: dict[str, str]) -> str:
    return "# written by hand, long ago (ddpfix lab scenario)\n" + "".join(f"{k}={v}\n" for k, v in env.items())


# ============================================================================ runtime

class Runtime:
    """What scenario tasks may use while `up` runs: exec in a node, write its files, record PIDs."""

    def __init__(self, plan: LabPlan, sdir: Path, state: dict) -> None:
        self.plan = plan
        self.sdir = sdir
        self.state = state

    def node_dir(self, node: NodePlan) -> Path:
        return self.sdir / "nodes" / node.name

    def init_pid(self, node: NodePlan) -> int:
        return self.state["nodes"][node.name]["pids"]["init"]["pid"]

    def exec(self, node: NodePlan, argv: Sequence[str], *, input: str | None = None, check: bool = True,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return _node_exec(self.init_pid(node), argv, input=input, check=check, timeout=timeout)

    def write_etc(self, node: NodePlan, rel: str, text: str, mode: int = 0o644) -> None:
        _write(self.node_dir(node) / "etc" / rel, text, mode)

    def write_run(self, node: NodePlan, rel: str, text: str, mode: int = 0o644) -> None:
        _write(self.node_dir(node) / "run" / rel, text, mode)

    def read_run(self, node: NodePlan, rel: str) -> str | None:
        try:
            text = (self.node_dir(node) / "run" / rel).read_text()
        except FileNotFoundError:
            return None
        return text or None

    def hosts_text(self, node: NodePlan) -> str:
        return hosts_text(node)

    def record_pidfile(self, node: NodePlan, key: str, pidfile: str, timeout: float = 10) -> None:
        rel = pidfile.removeprefix("/run/")
        with contextlib.suppress(LabError):
            _wait(lambda: bool((self.read_run(node, rel) or "").strip()), timeout, pidfile)
        text = self.read_run(node, rel)
        if not text:
            raise LabError(f"{node.name}: no pid file {pidfile} for {key}", ExitCode.RUN_FAILED)
        self.record_nspid(node, key, int(text.split()[0]))

    def record_nspid(self, node: NodePlan, key: str, nspid: int) -> None:
        hp = _host_pid(self.init_pid(node), nspid)
        start = _proc_start(hp) if hp else None
        if hp is None or start is None:
            raise LabError(f"{node.name}: {key} (pid {nspid} in the node) is not running", ExitCode.RUN_FAILED)
        with _STATE_LOCK:
            self.state["nodes"][node.name]["pids"][key] = {"pid": hp, "start": start, "nspid": nspid}
            _save_state(self.sdir, self.state)

    def wait_for(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        _wait(pred, timeout, what)


def _node_env() -> dict[str, str]:
    return {"PATH": NODE_PATH, "HOME": "/root", "TMPDIR": NODE_TMPDIR, "LANG": "C.UTF-8", "TERM": "dumb"}


def _node_argv(init_pid: int, argv: Sequence[str]) -> list[str]:
    # Never run a "node" command in the host's namespaces (e.g. if a PID were reused).
    for ns in ("pid", "net", "mnt", "uts"):
        try:
            theirs = os.readlink(f"/proc/{init_pid}/ns/{ns}")
        except OSError:
            raise LabError(f"lab node process {init_pid} is gone", ExitCode.RUN_FAILED) from None
        if theirs == os.readlink(f"/proc/self/ns/{ns}"):
            raise LabError(f"process {init_pid} is not a lab node (shares the {ns} namespace with ddpfix)",
                           ExitCode.RUN_FAILED)
    return ["nsenter", "-t", str(init_pid), "-a", "--", *DROP_SYS_TIME, "env", "-i",
            *(f"{k}={v}" for k, v in _node_env().items()), *argv]


def _node_exec(init_pid: int, argv: Sequence[str], *, input: str | None = None, check: bool = True,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return _run(_node_argv(init_pid, argv), input=input, check=check, timeout=timeout)


_STATE_LOCK = threading.RLock()


def _save_state(sdir: Path, state: dict) -> None:
    with _STATE_LOCK:  # `up` records PIDs from several threads
        tmp = sdir / f"lab.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(state, indent=2, default=str))
        tmp.replace(sdir / "lab.json")


def _load_state(name: str) -> dict | None:
    try:
        return json.loads((state_dir(name) / "lab.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# ============================================================================ up

def up(name: str = DEFAULT_NAME, nodes: int = DEFAULT_NODES, scenario: str | Sequence[str] | None = None,
       subnet: str = DEFAULT_SUBNET, ifnames: str | Sequence[str] | None = None,
       inventory_dir: str | os.PathLike[str] | None = None, *, wait_sync: bool = True,
       sync_timeout: float = 30.0) -> LabInfo:
    """Create lab `name` and write `<inventory_dir>/hosts.yml`; return what was built.

    Raises LabError: INVALID_INPUT for bad options or when the lab already exists,
    PREREQUISITE when not root or a package is missing, RUN_FAILED when building fails (then
    everything created so far has been removed again). With `wait_sync`, waits (up to
    `sync_timeout`) until every chronyd reports a synchronised clock."""
    plan = plan_lab(name, nodes, scenario, subnet, ifnames)
    check_prerequisites(plan.scenarios)
    inv_dir = Path(inventory_dir if inventory_dir is not None else Path("inventories") / "lab").absolute()
    with _locked(name):
        if state_dir(name).exists() or _lab_netns(name) or _link_exists(host_link(name)):
            raise LabError(f"lab {name!r} already exists: run 'ddpfix lab down --name {name}' first", ExitCode.INVALID_INPUT)
        for f in ["hosts.yml", *_inventory_side_files(plan)]:
            _check_inventory_free(inv_dir / f, name)
        _check_subnet_free(plan)
        try:
            return _build(plan, inv_dir, wait_sync=wait_sync, sync_timeout=sync_timeout)
        except BaseException as exc:
            try:
                _teardown(name)
            except Exception as exc2:  # pragma: no cover - reported with the original error
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
        raise LabError(f"{path} exists and was not written by 'ddpfix lab up': pass another --inventory-dir",
                       ExitCode.INVALID_INPUT)
    other = head.splitlines()[0].removeprefix(INVENTORY_MARKER).strip().split()[0] if head.splitlines()[0] != INVENTORY_MARKER else ""
    if other and other != name and state_dir(other).exists():
        raise LabError(f"{path} belongs to the running lab {other!r}: pass another --inventory-dir", ExitCode.INVALID_INPUT)


def _check_subnet_free(plan: LabPlan) -> None:
    res = _run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False)
    try:
        routes = json.loads(res.stdout or "[]")
    except json.JSONDecodeError:
        routes = []
    for r in routes:
        dst = r.get("dst", "")
        if dst in ("", "default") or r.get("type") in ("local", "broadcast"):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.overlaps(plan.subnet):
            raise LabError(f"subnet {plan.subnet} overlaps {dst} (dev {r.get('dev', '?')}) on this machine: pass another --subnet",
                           ExitCode.INVALID_INPUT)


def _build(plan: LabPlan, inv_dir: Path, *, wait_sync: bool, sync_timeout: float) -> LabInfo:
    t0 = time.monotonic()
    name = plan.name
    sdir = state_dir(name)
    sdir.mkdir(mode=0o700, parents=True)
    _run(["mount", "-t", "tmpfs", "-o", "mode=0700,nosuid,nodev", f"ddpfix-lab-{name}", str(sdir)])
    state: dict = {
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
        "inventory_files": [str(inv_dir / f) for f in _inventory_side_files(plan)],
        "ssh_user": plan.ssh_user,
        "ssh_port": plan.ssh_port,
        "bastion": plan.bastion,
        "inventory_dirs_created": [str(p) for p in [inv_dir, *inv_dir.parents] if not p.exists()],
        "supervisor": None,
        "nodes": {
            n.name: {"hostname": n.hostname, "address": str(n.address), "ifname": n.ifname, "netns": n.netns,
                     "pids": {}} for n in plan.nodes
        },
    }
    _save_state(sdir, state)
    rt = Runtime(plan, sdir, state)

    # keys and node file trees, in parallel with the network
    with ThreadPoolExecutor(max_workers=8) as pool:
        key_job = pool.submit(_keygen, sdir / "id_ed25519", f"ddpfix-lab-{name}")
        file_jobs = [pool.submit(_prepare_node_files, rt, n) for n in plan.nodes]
        _create_network(plan)
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
    _write_client_files(rt)
    # scenario tasks, then chrony
    for n in plan.nodes:
        for task in n.tasks:
            task(rt, n)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda n: _start_chrony(rt, n), [n for n in plan.nodes if n.chrony]))
    _wait(lambda: all(ssh_banner(str(n.address), plan.ssh_port) for n in plan.nodes), 10, "sshd on every node")
    if plan.bastion:
        _block_direct_ssh(plan)
    inv = _write_inventory(rt, inv_dir)
    state["inventory"] = str(inv)
    state["up_seconds"] = round(time.monotonic() - t0, 3)
    _save_state(sdir, state)
    if wait_sync and any(n.chrony for n in plan.nodes):
        wait_synchronised(name, timeout=sync_timeout)
    return info(name)


def _keygen(path: Path, comment: str) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _prepare_node_files(rt: Runtime, n: NodePlan) -> None:
    plan = rt.plan
    d = rt.node_dir(n)
    d.mkdir(parents=True)
    _run(["cp", "-a", "/etc", str(d / "etc")])
    etc = d / "etc"
    for sub, mode in (("run", 0o755), ("run/sshd", 0o755), ("run/tmp", 0o1777), ("run/lock", 0o1777),
                      ("run/dbus", 0o755), ("run/user", 0o755), ("root", 0o700), ("root/.ssh", 0o700),
                      ("log", 0o755), ("chrony", 0o750), ("home", 0o755)):
        p = d / sub
        p.mkdir(exist_ok=True)
        p.chmod(mode)
    for skel in (".bashrc", ".profile"):
        if Path("/etc/skel", skel).exists():
            shutil.copy2(Path("/etc/skel", skel), d / "root" / skel)
    st = os.stat("/var/lib/chrony") if Path("/var/lib/chrony").exists() else None
    if st:
        os.chown(d / "chrony", st.st_uid, st.st_gid)
    mid = uuid.uuid4().hex
    _write(etc / "machine-id", mid + "\n", 0o444)
    _write(d / "machine-id", mid + "\n", 0o444)
    _write(etc / "hostname", n.hostname + "\n")
    _write(etc / "hosts", hosts_text(n))
    _write(etc / "resolv.conf", "# ddpfix lab: nothing answers here, so nothing leaves the lab\nnameserver 127.0.0.1\n")
    # sshd: own host key, key-only root login, listening on the lab address only
    for key in (etc / "ssh").glob("ssh_host_*"):
        key.unlink()
    _keygen(etc / "ssh" / "ssh_host_ed25519_key", f"root@{n.hostname}")
    _write(etc / "ssh" / "sshd_config.d" / "00-ddpfix-lab.conf", "\n".join([
        f"# ddpfix lab node: key-only {plan.ssh_user} login on the lab address",
        f"ListenAddress {n.address}" if plan.ssh_port == SSH_PORT else f"ListenAddress {n.address}:{plan.ssh_port}",
        "HostKey /etc/ssh/ssh_host_ed25519_key",
        "PermitRootLogin prohibit-password" if plan.ssh_user == "root" else "PermitRootLogin no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "UseDNS no",
        "X11Forwarding no",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        f"SetEnv TMPDIR={NODE_TMPDIR}",
        "PidFile /run/sshd.pid",
        "",
    ]))
    # chrony: never touch the real clock (-x); no pool (the lab has no way out)
    _write(etc / "default" / "chrony", "# ddpfix lab: -x = never adjust the system clock (shared with the host)\n"
                                       'DAEMON_OPTS="-F 1 -x"\n')
    conf = etc / "chrony" / "chrony.conf"
    if conf.exists():
        lines = [ln for ln in conf.read_text().splitlines() if not ln.lstrip().startswith(("pool ", "server ", "peer "))]
        _write(conf, "\n".join(lines) + "\n")
    if n.chrony == "master" or (n.chrony is None and n.index == 1):
        lab_conf = f"# ddpfix lab: node1 serves time to the lab\nlocal stratum 8\nallow {plan.subnet}\n"
    else:
        lab_conf = f"# ddpfix lab: sync to node1\nserver {plan.master.address} iburst minpoll -2 maxpoll 2\n"
    _write(etc / "chrony" / "conf.d" / "lab.conf", lab_conf)
    if plan.ssh_user != "root":
        _add_user(d, plan)
    if n.env is not None:
        _write(etc / ENV_PATH.removeprefix("/etc/"), env_text(n.env))
    for rel, text in n.files.items():
        _write(etc / rel, text)


def lab_uid() -> int:
    """The uid (= gid) of the lab's non-root user: the first from LAB_FIRST_UID that the host does not use."""
    used: set[int] = set()
    for db in ("/etc/passwd", "/etc/group"):
        with contextlib.suppress(OSError):
            for line in Path(db).read_text().splitlines():
                parts = line.split(":")
                if len(parts) > 2 and parts[2].isdigit():
                    used.add(int(parts[2]))
    uid = LAB_FIRST_UID
    while uid in used:
        uid += 1
    return uid


def _add_user(d: Path, plan: LabPlan) -> None:
    """The non-root SSH user in the node's own /etc (passwd, group, shadow; sudoers.d when `plan.sudo`) with a
    home under the node's /home."""
    user, uid, etc = plan.ssh_user, lab_uid(), d / "etc"
    if any(line.split(":")[0] == user for line in (etc / "passwd").read_text().splitlines()):
        raise LabError(f"user {user!r} already exists in this machine's /etc/passwd", ExitCode.RUN_FAILED)
    for db, line in (("passwd", f"{user}:x:{uid}:{uid}:ddpfix lab user:/home/{user}:/bin/bash"),
                     ("group", f"{user}:x:{uid}:"), ("shadow", f"{user}:*:20000:0:99999:7:::")):
        with open(etc / db, "a") as fh:  # appending keeps the file's mode and owner (shadow: 0640 root:shadow)
            fh.write(line + "\n")
    home = d / "home" / user
    for p in (home, home / ".ssh"):
        p.mkdir(mode=0o700)
        os.chown(p, uid, uid)
    if plan.sudo:
        _write(etc / "sudoers.d" / f"ddpfix-lab-{user}", f"# ddpfix lab: passwordless sudo\n{user} ALL=(ALL:ALL) NOPASSWD: ALL\n",
               0o440)


def _create_network(plan: LabPlan) -> None:
    sw = switch_netns(plan.name)
    _ip_batch([f"netns add {sw}"] + [f"netns add {n.netns}" for n in plan.nodes])
    for n in plan.nodes:  # interfaces that must index before the cluster NIC
        _ip_batch(n.pre_links, n.netns)
    links = [f"link add {host_link(plan.name)} type veth peer name uplink netns {sw}"]
    sw_cmds = ["link add br0 type bridge", "link set br0 up", "link set dev uplink master br0", "link set dev uplink up"]
    for n in plan.nodes:
        links.append(f"link add {n.ifname} netns {n.netns} type veth peer name n{n.index} netns {sw}")
        sw_cmds += [f"link set n{n.index} master br0", f"link set n{n.index} up"]
        for j, x in enumerate(n.extra_nics, 1):
            links.append(f"link add {x.ifname} netns {n.netns} type veth peer name n{n.index}x{j} netns {sw}")
            sw_cmds += [f"link set n{n.index}x{j} master br0", f"link set n{n.index}x{j} up"]
    _ip_batch(links)
    hl = host_link(plan.name)
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{hl}/disable_ipv6").write_text("1")
    _ip_batch([f"addr add {plan.controller_address} dev {hl}", f"link set {hl} up"])
    jobs = [(sw_cmds, sw)]
    for n in plan.nodes:
        cmds = ["link set lo up"]
        if n.mtu:
            cmds.append(f"link set {n.ifname} mtu {n.mtu}")
        cmds += [f"addr add {n.address}/{plan.subnet.prefixlen} dev {n.ifname}", f"link set {n.ifname} up",
                 f"route add default via {plan.gateway} dev {n.ifname}"]
        for x in n.extra_nics:
            if x.address:
                cmds.append(f"addr add {x.address} dev {x.ifname}")
            if x.up:
                cmds.append(f"link set {x.ifname} up")
        cmds += n.post_ip
        jobs.append((cmds, n.netns))
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda j: _ip_batch(*j), jobs))
    for n in plan.nodes:
        if n.sysctls:
            _run(["ip", "netns", "exec", n.netns, "sysctl", "-q", "-w", *(f"{k}={v}" for k, v in n.sysctls.items())])


def _start_nodes(rt: Runtime) -> None:
    sdir, plan = rt.sdir, rt.plan
    launches = []
    for n in plan.nodes:
        d = rt.node_dir(n)
        cfg = {
            "ready": str(d / "ready.json"),
            "lab_dir": str(sdir),
            "run": str(d / "run"),
            "hostname": n.hostname,
            "binds": [[str(d / "etc"), "/etc"], [str(d / "root"), "/root"], [str(d / "home"), "/home"],
                      [str(d / "log"), "/var/log"],
                      [str(d / "chrony"), "/var/lib/chrony"], [str(d / "machine-id"), "/var/lib/dbus/machine-id"]],
        }
        argv = ["nsenter", f"--net=/run/netns/{n.netns}", "--",
                "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child=SIGKILL", "--propagation", "private", "--",
                *DROP_SYS_TIME, "/usr/bin/python3", "-I", "-c", (_PKG / "_nodeinit.py").read_text(), json.dumps(cfg)]
        launches.append([argv, str(sdir / "logs" / f"{n.name}.log")])
    launch_file = sdir / "launches.json"
    launch_file.write_text(json.dumps(launches))
    sup = subprocess.Popen(
        [*DROP_SYS_TIME, "/usr/bin/python3", "-I", "-c", (_PKG / "_supervisor.py").read_text(), str(launch_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(sdir / "logs" / "supervisor.log", "ab"),
        start_new_session=True, close_fds=True,
    )
    start = None
    _wait(lambda: _proc_start(sup.pid) is not None or sup.poll() is not None, 2, "the lab supervisor")
    start = _proc_start(sup.pid)
    rt.state["supervisor"] = {"pid": sup.pid, "start": start} if start is not None else None
    _save_state(sdir, rt.state)

    def ready(n: NodePlan) -> bool:
        p = rt.node_dir(n) / "ready.json"
        if not p.exists():
            return False
        doc = json.loads(p.read_text())
        if "error" in doc:
            raise LabError(f"{n.name}: node setup failed: {doc['error']}", ExitCode.RUN_FAILED)
        if n.name not in rt.state["nodes"] or "init" not in rt.state["nodes"][n.name]["pids"]:
            rt.state["nodes"][n.name]["pids"]["init"] = {"pid": doc["pid"], "start": doc["start"]}
            rt.state["nodes"][n.name]["pids"]["launcher"] = {"pid": doc["ppid"], "start": _proc_start(doc["ppid"])}
            _save_state(sdir, rt.state)
        return True

    def all_ready() -> bool:
        if sup.poll() is not None and not all((rt.node_dir(n) / "ready.json").exists() for n in plan.nodes):
            raise LabError(f"the node launcher exited early: {_log_tail(sdir)}", ExitCode.RUN_FAILED)
        return all([ready(n) for n in plan.nodes])

    _wait(all_ready, 15, "the nodes to start")


def _log_tail(sdir: Path) -> str:
    tails = []
    for log in sorted((sdir / "logs").glob("*.log")):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        if lines:
            tails.append(f"{log.stem}: {lines[-1]}")
    return "; ".join(tails) or "no log output"


def _start_sshd(rt: Runtime, n: NodePlan) -> None:
    rt.exec(n, ["/usr/sbin/sshd"])
    rt.record_pidfile(n, "sshd", "/run/sshd.pid")


def _start_chrony(rt: Runtime, n: NodePlan) -> None:
    rt.exec(n, ["/etc/init.d/chrony", "start"])
    rt.wait_for(lambda: rt.read_run(n, "chrony/chronyd.pid") is not None, 10, f"chronyd on {n.name}")
    rt.record_pidfile(n, "chronyd", "/run/chrony/chronyd.pid")


def _write_client_files(rt: Runtime) -> None:
    sdir, plan = rt.sdir, rt.plan
    lines = []
    for n in plan.nodes:
        pub = (rt.node_dir(n) / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
        where = str(n.address) if plan.ssh_port == SSH_PORT else f"[{n.address}]:{plan.ssh_port}"
        lines.append(f"{where} {pub[0]} {pub[1]}")
    _write(sdir / "known_hosts", "\n".join(lines) + "\n", 0o644)
    _write(sdir / "ssh_config", f"# ssh -F {sdir / 'ssh_config'} node1\n" + ssh_config_text(plan, sdir), 0o644)


def ssh_config_text(plan: LabPlan, sdir: Path) -> str:
    """An ssh_config reaching every node as the lab's SSH user on its port (through the bastion, if any)."""
    cfg = []
    for n in plan.nodes:
        cfg += [f"Host {n.name}", f"  HostName {n.address}"]
    if plan.bastion:
        jump = plan.node(plan.bastion)
        hidden = [n for n in plan.nodes if n is not jump]
        cfg += [f"Host {' '.join([*(n.name for n in hidden), *(str(n.address) for n in hidden)])}",
                f"  ProxyJump {jump.address}"]
    cfg += ["Host *", f"  User {plan.ssh_user}", f"  Port {plan.ssh_port}", f"  IdentityFile {sdir / 'id_ed25519'}",
            "  IdentitiesOnly yes", f"  UserKnownHostsFile {sdir / 'known_hosts'}", "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes", "  BatchMode yes", "  ConnectTimeout 5", "  LogLevel ERROR", ""]
    return "\n".join(cfg)


def _inventory_side_files(plan: LabPlan) -> list[str]:
    """Files `up` writes next to hosts.yml: with a bastion, the ansible.cfg and ssh_config a user would write."""
    return ["ansible.cfg", "ssh_config"] if plan.bastion else []


def _block_direct_ssh(plan: LabPlan) -> None:
    """The lab switch drops the controller's SSH to every node but the bastion (a network ACL, outside the nodes:
    their own firewalls stay as the scenarios made them)."""
    jump = plan.node(plan.bastion or "")
    ruleset = "\n".join([
        "table bridge ddpfix_lab_bastion {",
        "  chain forward {",
        "    type filter hook forward priority 0; policy accept;",
        f'    iifname "uplink" ip daddr != {jump.address} tcp dport {plan.ssh_port} drop',
        "  }",
        "}",
        "",
    ])
    _run(["ip", "netns", "exec", switch_netns(plan.name), "nft", "-f", "-"], input=ruleset)


def _write_inventory(rt: Runtime, inv_dir: Path) -> Path:
    sdir, plan = rt.sdir, rt.plan
    hosts: dict[str, dict] = {}
    for n in plan.nodes:
        hosts[n.name] = {"ansible_host": str(n.address), **n.hostvars}
    doc = {
        "all": {
            "children": {
                "ddp_nodes": {
                    "hosts": hosts,
                    "vars": {
                        "ansible_user": plan.ssh_user,
                        **({"ansible_port": plan.ssh_port} if plan.ssh_port != SSH_PORT else {}),
                        **({"ansible_become": True} if plan.become else {}),
                        "ansible_ssh_private_key_file": str(sdir / "id_ed25519"),
                        "ansible_ssh_common_args": f"-o UserKnownHostsFile={sdir / 'known_hosts'} "
                                                   "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
                        "ansible_python_interpreter": "/usr/bin/python3",
                        "ddp_master": plan.master.name,
                        "ddp_master_port": plan.master_port,
                        "ddp_cluster_cidr": str(plan.subnet),
                        "ddp_ntp_local_master": True,
                        # verify --torch runs this interpreter on the nodes (/usr and the checkout are shared)
                        "ddp_python": sys.executable,
                        **plan.groupvars,
                    },
                }
            }
        }
    }
    path = inv_dir / "hosts.yml"
    header = (f"{INVENTORY_MARKER} {plan.name}\n# written by 'ddpfix lab up' (scenarios: {', '.join(plan.scenarios)});"
              f" removed by 'ddpfix lab down --name {plan.name}'\n")
    inv_dir.mkdir(parents=True, exist_ok=True)
    if plan.bastion:
        # What a user with a bastion writes: an ansible.cfg next to the inventory whose ssh_args name an ssh_config
        # with ProxyJump (ddpfix reads that ansible.cfg and only adds its ControlPersist options).
        _write(inv_dir / "ssh_config", header + ssh_config_text(plan, sdir))
        _write(inv_dir / "ansible.cfg", header + f"[ssh_connection]\nssh_args = -F {inv_dir / 'ssh_config'}\n")
    tmp = path.with_suffix(".yml.tmp")
    tmp.write_text(header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    tmp.replace(path)
    return path


# ============================================================================ chrony

def chrony_tracking(name: str, node: str) -> dict[str, str] | None:
    """`chronyc -c tracking` of a node as a dict (None when chronyd does not answer)."""
    res = node_exec(name, node, ["chronyc", "-c", "tracking"], check=False, timeout=10)
    if res.returncode != 0 or not res.stdout.strip():
        return None
    keys = ["ref_id", "ref_name", "stratum", "ref_time", "system_time", "last_offset", "rms_offset", "frequency",
            "residual_freq", "skew", "root_delay", "root_dispersion", "update_interval", "leap_status"]
    return dict(zip(keys, res.stdout.strip().split(",")))


def wait_synchronised(name: str, timeout: float = 30.0) -> None:
    """Wait until every node running chronyd reports leap status Normal (synchronised)."""
    state = _require_state(name)
    running = [n for n, s in state["nodes"].items() if pid_alive(s["pids"].get("chronyd"))]

    def synced(n: str) -> bool:
        t = chrony_tracking(name, n)
        return bool(t) and t.get("leap_status") == "Normal" and t.get("ref_id") not in ("00000000", "")

    pending = list(running)

    def check() -> bool:
        pending[:] = [n for n in pending if not synced(n)]
        return not pending

    try:
        _wait(check, timeout, "chrony to synchronise", interval=0.25)
    except LabError:
        raise LabError(f"chrony not synchronised after {timeout:g} s on {', '.join(pending)}", ExitCode.RUN_FAILED) from None


# ============================================================================ queries and helpers for tests

def _require_state(name: str) -> dict:
    validate_name(name)
    state = _load_state(name)
    if state is None:
        raise LabError(f"lab {name!r} does not exist (run 'ddpfix lab up --name {name}')", ExitCode.INVALID_INPUT)
    return state


def _node_state(state: dict, node: str) -> dict:
    try:
        return state["nodes"][node]
    except KeyError:
        raise LabError(f"lab {state['name']!r} has no node {node!r}", ExitCode.INVALID_INPUT) from None


def free_subnet() -> str:
    """A /24 in 192.168.100-249 that no route on this machine overlaps (for parallel labs: tests, benchmarks)."""
    import random

    out = _run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False).stdout
    used = []
    for r in json.loads(out or "[]"):
        dst = r.get("dst")
        if dst and dst != "default":
            try:
                used.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    for o in random.sample(range(100, 250), 150):
        net = ipaddress.ip_network(f"192.168.{o}.0/24")
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise LabError("no free /24 in 192.168.100-249", ExitCode.RUN_FAILED)


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
        nodes=[
            NodeInfo(name=n, hostname=s["hostname"], address=s["address"], ifname=s["ifname"], netns=s["netns"],
                     pid=s["pids"].get("init", {}).get("pid", 0))
            for n, s in state["nodes"].items()
        ],
    )


def node_exec(name: str, node: str, argv: Sequence[str], *, input: str | None = None, check: bool = True,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run argv inside a node (all its namespaces, CAP_SYS_TIME dropped, clean env with TMPDIR).

    Returns the CompletedProcess (text); raises LabError when `check` and the exit status is not 0."""
    state = _require_state(name)
    rec = _node_state(state, node)["pids"].get("init")
    if not pid_alive(rec):
        raise LabError(f"{node} of lab {name!r} is not running", ExitCode.RUN_FAILED)
    return _node_exec(rec["pid"], argv, input=input, check=check, timeout=timeout)


def node_popen(name: str, node: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """Start argv inside a node without waiting (e.g. a long-running torchrun); kwargs go to Popen."""
    state = _require_state(name)
    rec = _node_state(state, node)["pids"].get("init")
    if not pid_alive(rec):
        raise LabError(f"{node} of lab {name!r} is not running", ExitCode.RUN_FAILED)
    return subprocess.Popen(_node_argv(rec["pid"], argv), **kwargs)


def stop_sshd(name: str, node: str) -> None:
    """Make a node unreachable over SSH: kill its sshd listener and every session it spawned."""
    state = _require_state(name)
    rec = _node_state(state, node)["pids"].get("sshd")
    if pid_alive(rec):
        victims = [rec["pid"], *_descendants(rec["pid"])]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait(lambda: not pid_alive(rec), 5, f"sshd on {node} to stop")
    addr, port = state["nodes"][node]["address"], state.get("ssh_port", SSH_PORT)
    _wait(lambda: not _sshd_answers(state, node, timeout=0.3), 5, f"port {port} on {node} to close")


def start_sshd(name: str, node: str) -> None:
    """Start a node's sshd again (after stop_sshd) and wait until it answers."""
    state = _require_state(name)
    ns = _node_state(state, node)
    if pid_alive(ns["pids"].get("sshd")):
        return
    init_pid = ns["pids"]["init"]["pid"]
    with contextlib.suppress(FileNotFoundError):
        (state_dir(name) / "nodes" / node / "run" / "sshd.pid").unlink()
    _node_exec(init_pid, ["/usr/sbin/sshd"])
    pidfile = state_dir(name) / "nodes" / node / "run" / "sshd.pid"
    _wait(pidfile.exists, 5, f"sshd pid file on {node}")
    nspid = int(pidfile.read_text().split()[0])
    hp = _host_pid(init_pid, nspid)
    if hp is None:
        raise LabError(f"sshd on {node} did not stay up", ExitCode.RUN_FAILED)
    ns["pids"]["sshd"] = {"pid": hp, "start": _proc_start(hp), "nspid": nspid}
    _save_state(state_dir(name), state)
    _wait(lambda: _sshd_answers(state, node), 5, f"sshd on {node}")


# ============================================================================ status

def status(name: str = DEFAULT_NAME) -> LabStatus:
    """Nodes, addresses, interfaces, which recorded processes are alive, whether sshd answers."""
    validate_name(name)
    state = _load_state(name)
    if state is None:
        return LabStatus(name=name, exists=bool(_lab_netns(name)) or state_dir(name).exists())
    out = LabStatus(name=name, exists=True, subnet=state["subnet"], scenarios=list(state["scenarios"]),
                    inventory=state.get("inventory"), state_dir=str(state_dir(name)))
    with ThreadPoolExecutor(max_workers=8) as pool:
        reach = dict(zip(state["nodes"], pool.map(lambda n: _sshd_answers(state, n), state["nodes"])))
    for n, s in state["nodes"].items():
        procs = {k: pid_alive(v) for k, v in s["pids"].items() if k not in ("init", "launcher")}
        out.nodes.append(NodeStatus(
            name=n, hostname=s["hostname"], address=s["address"], ifname=s["ifname"], netns=s["netns"],
            pid=s["pids"].get("init", {}).get("pid", 0), alive=pid_alive(s["pids"].get("init")),
            sshd=reach[n], processes=procs,
        ))
    return out


def _sshd_answers(state: dict, node: str, timeout: float = 0.5) -> bool:
    """Does the node's sshd answer on the lab's SSH port - from the controller, or from the bastion for the nodes
    the controller may not reach directly?"""
    addr, port, bastion = state["nodes"][node]["address"], state.get("ssh_port", SSH_PORT), state.get("bastion")
    if not bastion or bastion == node:
        return ssh_banner(addr, port, timeout)
    res = _run(["ip", "netns", "exec", state["nodes"][bastion]["netns"], "nc", "-z", "-w", str(max(1, round(timeout))),
                addr, str(port)], check=False, timeout=10)
    return res.returncode == 0


def list_labs() -> list[str]:
    """Names of labs with a state dir on this machine."""
    if not STATE_ROOT.is_dir():
        return []
    return sorted(p.name for p in STATE_ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))


def status_dict(st: LabStatus) -> dict:
    return asdict(st)


# ============================================================================ down

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


def _kill_recorded(state: dict) -> None:
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
        raise LabError(f"processes of lab {name!r} did not exit: {[r['pid'] for r in rest if pid_alive(r)]}",
                       ExitCode.RUN_FAILED)
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
