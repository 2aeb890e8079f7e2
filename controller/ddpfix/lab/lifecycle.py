"""A lab's lifecycle: `up` (state dir, node file trees, keys, network, nodes, daemons, inventory), `info`, `status`
and `down` (see the package docstring of `ddpfix.lab` for the layout)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

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
    ENV_PATH,
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
    state_dir,
    switch_netns,
    validate_name,
)
from ddpfix.lab.network import _block_direct_ssh, _check_subnet_free, _create_network
from ddpfix.lab.plan import env_text, hosts_text, plan_lab
from ddpfix.lab.prerequisites import check_prerequisites
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

INVENTORY_MARKER = "# ddpfix lab inventory"


#: Lab node user of the non-root scenarios: the first uid/gid from here that the host does not use.
LAB_FIRST_UID = 1500


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
            raise LabError(
                f"lab {name!r} already exists: run 'ddpfix lab down --name {name}' first", ExitCode.INVALID_INPUT
            )
        for f in ["hosts.yml", *_inventory_side_files(plan)]:
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
        "inventory_files": [str(inv_dir / f) for f in _inventory_side_files(plan)],
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


def drop_ddpfix_state(etc: Path) -> list[Path]:
    """Remove from a copy of the host's /etc what ddpfix may have written on the host itself (its env file and
    directory, firewall includes, limits, link files: every name with "ddpfix" in it), so that a lab node starts as
    a host ddpfix never touched, whatever was done to the machine that runs the lab. Returns what it removed."""
    gone: list[Path] = []
    for root, dirs, files in os.walk(etc):
        for name in [*dirs, *files]:
            if "ddpfix" in name.lower():
                p = Path(root, name)
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
                gone.append(p)
        dirs[:] = [x for x in dirs if "ddpfix" not in x.lower()]
    return gone


def _prepare_node_files(rt: Runtime, n: NodePlan) -> None:
    plan = rt.plan
    d = rt.node_dir(n)
    d.mkdir(parents=True)
    _run(["cp", "-a", "/etc", str(d / "etc")])
    etc = d / "etc"
    drop_ddpfix_state(etc)
    for sub, mode in (
        ("run", 0o755),
        ("run/sshd", 0o755),
        ("run/tmp", 0o1777),
        ("run/lock", 0o1777),
        ("run/dbus", 0o755),
        ("run/user", 0o755),
        ("root", 0o700),
        ("root/.ssh", 0o700),
        ("log", 0o755),
        ("chrony", 0o750),
        ("home", 0o755),
    ):
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
    _write(
        etc / "ssh" / "sshd_config.d" / "00-ddpfix-lab.conf",
        "\n".join(
            [
                f"# ddpfix lab node: key-only {plan.ssh_user} login on the lab address",
                f"ListenAddress {n.address}"
                if plan.ssh_port == SSH_PORT
                else f"ListenAddress {n.address}:{plan.ssh_port}",
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
            ]
        ),
    )
    # chrony: never touch the real clock (-x); no pool (the lab has no way out)
    _write(
        etc / "default" / "chrony",
        '# ddpfix lab: -x = never adjust the system clock (shared with the host)\nDAEMON_OPTS="-F 1 -x"\n',
    )
    conf = etc / "chrony" / "chrony.conf"
    if conf.exists():
        lines = [
            ln for ln in conf.read_text().splitlines() if not ln.lstrip().startswith(("pool ", "server ", "peer "))
        ]
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
    for db, line in (
        ("passwd", f"{user}:x:{uid}:{uid}:ddpfix lab user:/home/{user}:/bin/bash"),
        ("group", f"{user}:x:{uid}:"),
        ("shadow", f"{user}:*:20000:0:99999:7:::"),
    ):
        with open(etc / db, "a") as fh:  # appending keeps the file's mode and owner (shadow: 0640 root:shadow)
            fh.write(line + "\n")
    home = d / "home" / user
    for p in (home, home / ".ssh"):
        p.mkdir(mode=0o700)
        os.chown(p, uid, uid)
    if plan.sudo:
        _write(
            etc / "sudoers.d" / f"ddpfix-lab-{user}",
            f"# ddpfix lab: passwordless sudo\n{user} ALL=(ALL:ALL) NOPASSWD: ALL\n",
            0o440,
        )


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
        cfg += [
            f"Host {' '.join([*(n.name for n in hidden), *(str(n.address) for n in hidden)])}",
            f"  ProxyJump {jump.address}",
        ]
    cfg += [
        "Host *",
        f"  User {plan.ssh_user}",
        f"  Port {plan.ssh_port}",
        f"  IdentityFile {sdir / 'id_ed25519'}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {sdir / 'known_hosts'}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
        "  ConnectTimeout 5",
        "  LogLevel ERROR",
        "",
    ]
    return "\n".join(cfg)


def _inventory_side_files(plan: LabPlan) -> list[str]:
    """Files `up` writes next to hosts.yml: with a bastion, the ansible.cfg and ssh_config a user would write."""
    return ["ansible.cfg", "ssh_config"] if plan.bastion else []


def _write_inventory(rt: Runtime, inv_dir: Path) -> Path:
    sdir, plan = rt.sdir, rt.plan
    hosts: dict[str, dict[str, Any]] = {}
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
    header = (
        f"{INVENTORY_MARKER} {plan.name}\n# written by 'ddpfix lab up' (scenarios: {', '.join(plan.scenarios)});"
        f" removed by 'ddpfix lab down --name {plan.name}'\n"
    )
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
