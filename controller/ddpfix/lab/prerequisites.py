"""What the lab needs on this machine: root, and the binaries of the lab and of its scenarios (with their Debian
packages)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from ddpfix.errors import ExitCode
from ddpfix.lab.model import NODE_PATH, PYENV_VERSIONS, LabError

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
        raise LabError(
            f"missing {what}: install the Debian package(s) {pkgs} (apt-get install {pkgs})", ExitCode.PREREQUISITE
        )


def python_home(version: str, versions: Path = PYENV_VERSIONS) -> Path:
    """The pyenv build a node asks for (`--python node2=3.8`): `versions/3.8.18` for "3.8" (the newest 3.8.Y there),
    `versions/3.8.18` for "3.8.18"; LabError(PREREQUISITE) naming the pyenv command when there is none."""
    def key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in p.name.split("."))

    found = sorted((p for p in (versions.iterdir() if versions.is_dir() else ())
                    if p.name.count(".") == 2 and p.name.replace(".", "").isdigit()
                    and (p.name == version or p.name.startswith(version + "."))
                    and (p / "bin" / f"python{'.'.join(p.name.split('.')[:2])}").exists()), key=key)
    if not found:
        raise LabError(f"no pyenv build of Python {version} in {versions}: install one (pyenv install {version})",
                       ExitCode.PREREQUISITE)
    return found[-1]
