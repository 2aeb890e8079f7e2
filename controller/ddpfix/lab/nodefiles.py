"""What `lab up` writes before any node starts: each node's file tree (a copy of /etc without ddpfix's state, the
plan's files, the lab user), the SSH keys, the client files (ssh_config, known hosts) and the inventory."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from ddpfix.errors import ExitCode
from ddpfix.lab.daemons import (
    Runtime,
)
from ddpfix.lab.model import (
    ENV_PATH,
    NODE_TMPDIR,
    LabError,
    LabPlan,
    NodePlan,
)
from ddpfix.lab.plan import env_text, hosts_text
from ddpfix.lab.system import (
    SSH_PORT,
    _run,
    _write,
)

INVENTORY_MARKER = "# ddpfix lab inventory"


#: Lab node user of the non-root scenarios: the first uid/gid from here that the host does not use.
LAB_FIRST_UID = 1500


def keygen(path: Path, comment: str) -> None:
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


def prepare_node_files(rt: Runtime, n: NodePlan) -> None:
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
    if n.python_home:  # the mount point of the node's pyenv build (daemons._start_nodes binds it, read-only)
        (d / "root" / Path(n.python_home).relative_to("/root")).mkdir(parents=True)
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
    keygen(etc / "ssh" / "ssh_host_ed25519_key", f"root@{n.hostname}")
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


def write_client_files(rt: Runtime) -> None:
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


def inventory_side_files(plan: LabPlan) -> list[str]:
    """Files `up` writes next to hosts.yml: with a bastion, the ansible.cfg and ssh_config a user would write."""
    return ["ansible.cfg", "ssh_config"] if plan.bastion else []


def write_inventory(rt: Runtime, inv_dir: Path) -> Path:
    sdir, plan = rt.sdir, rt.plan
    hosts: dict[str, dict[str, Any]] = {}
    for n in plan.nodes:
        hosts[n.name] = {"ansible_host": str(n.address), **n.hostvars,
                         **({"ansible_python_interpreter": n.interpreter} if n.interpreter else {})}
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
