"""Typed data of the lab: what `up` plans, what it reports, what `status` sees."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.model.cluster import DEFAULT_ENV_PATH
from ddpfix.model.net import valid_ifname
from ddpfix.plan import node_env

if TYPE_CHECKING:
    from ddpfix.lab.daemons import Runtime

STATE_ROOT = Path("/run/ddpfix-lab")
DEFAULT_NAME = "ddpfix"
DEFAULT_SUBNET = "192.168.77.0/24"
DEFAULT_NODES = 3
MASTER_PORT = 29500
ENV_PATH = DEFAULT_ENV_PATH
NODE_TMPDIR = "/run/tmp"
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_NODES = 64
#: pyenv's builds (`pyenv install 3.8`): a node with `python` set sees its build here, read-only, at the same path (its
#: libpython is found through that path), and runs it as ansible_python_interpreter
PYENV_VERSIONS = Path("/root/.pyenv/versions")

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,19}$")


class LabError(DdpfixError):
    """A lab operation failed; `code` is the CLI exit code."""


def validate_name(name: str) -> str:
    if not _NAME_RE.match(name or "") or name.endswith("-"):
        raise LabError(
            f"invalid lab name {name!r}: use 1-20 characters a-z, 0-9 and '-', starting with a letter",
            ExitCode.INVALID_INPUT,
        )
    return name


def validate_ifname(name: str) -> str:
    # the controller's interface-name rule, narrowed for the names a lab creates: a letter first, no ':', '@', '+'
    if not valid_ifname(name) or not name[0].isalpha() or set(name) & set(":@+") or name == "lo":
        raise LabError(f"invalid interface name {name!r} (1-15 characters, not 'lo')", ExitCode.INVALID_INPUT)
    return name


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    """The lab subnet: a private IPv4 network (never a public, loopback or link-local one)."""
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise LabError(f"invalid --subnet {text!r}: {exc}", ExitCode.INVALID_INPUT) from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise LabError(f"invalid --subnet {text!r}: the lab needs an IPv4 network", ExitCode.INVALID_INPUT)
    if net.is_loopback or net.is_link_local or net.is_multicast or not net.is_private or net.prefixlen > 26:
        raise LabError(
            f"invalid --subnet {text!r}: use a private IPv4 network of /26 or larger, e.g. {DEFAULT_SUBNET}",
            ExitCode.INVALID_INPUT,
        )
    for reserved in ("172.17.0.0/16", "172.18.0.0/16", "198.51.100.0/24", "203.0.113.0/24"):
        if net.overlaps(ipaddress.ip_network(reserved)):
            raise LabError(
                f"invalid --subnet {text!r}: overlaps {reserved}, which scenarios use", ExitCode.INVALID_INPUT
            )
    return net


def tag(name: str) -> str:
    """Short stable hash of the lab name, for names with Linux's 15-character limit."""
    return hashlib.sha1(name.encode()).hexdigest()[:8]


def netns_name(lab: str, node: str) -> str:
    return f"ddpfix-{lab}-{node}"


def switch_netns(lab: str) -> str:
    return f"ddpfix-{lab}-sw"


def host_link(lab: str) -> str:
    """The controller's veth into the lab switch (root namespace), e.g. `ddpl1a2b3c4d`."""
    return f"ddpl{tag(lab)}"


def state_dir(lab: str) -> Path:
    return STATE_ROOT / lab


@dataclass
class ExtraNic:
    """A further veth from a node onto the lab switch (e.g. a data NIC)."""

    ifname: str
    address: ipaddress.IPv4Interface | None
    up: bool = True


@dataclass
class NodePlan:
    """Everything `up` needs to build one node; scenarios edit it before anything is created."""

    name: str  # inventory name: node1..nodeN
    index: int  # 1-based; node1 is the master
    hostname: str
    address: ipaddress.IPv4Address
    ifname: str
    netns: str
    mtu: int | None = None
    # /etc/hosts as (address, names) lines, in order
    hosts: list[tuple[str, list[str]]] = field(default_factory=list)
    env: dict[str, str] | None = None  # existing env file at ENV_PATH (None: none)
    hostvars: dict[str, object] = field(default_factory=dict)
    chrony: str | None = None  # "master", "client" or None (no chronyd)
    pre_links: list[str] = field(default_factory=list)  # `ip -batch` lines before the cluster NIC exists
    post_ip: list[str] = field(default_factory=list)  # `ip -batch` lines after addresses and routes
    sysctls: dict[str, str] = field(default_factory=dict)
    extra_nics: list[ExtraNic] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # extra files in the node's /etc copy: path -> text
    tasks: list[Callable[[Runtime, NodePlan], None]] = field(default_factory=list)  # after sshd is up
    # ansible_python_interpreter: a pyenv version ("3.8" or "3.8.18"; None: the host's /usr/bin/python3); `up`
    # resolves it to `python_home` (a directory under PYENV_VERSIONS) and bind-mounts that into the node
    python: str | None = None
    python_home: str | None = None

    @property
    def interpreter(self) -> str | None:
        """The node's ansible_python_interpreter when `python` is set (after `up` resolved it)."""
        if self.python_home is None:
            return None
        return f"{self.python_home}/bin/python{'.'.join(Path(self.python_home).name.split('.')[:2])}"


@dataclass
class LabPlan:
    name: str
    subnet: ipaddress.IPv4Network
    nodes: list[NodePlan]
    scenarios: list[str]
    master_port: int = MASTER_PORT
    groupvars: dict[str, object] = field(default_factory=dict)
    # How the controller logs in (SSH setup scenarios): user, sshd port, passwordless sudo for that user,
    # `ansible_become` in the inventory, and the node every other node is reached through (ProxyJump).
    ssh_user: str = "root"
    ssh_port: int = 22
    sudo: bool = False
    become: bool = False
    bastion: str | None = None

    @property
    def master(self) -> NodePlan:
        return self.nodes[0]

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The nodes' default gateway: an address in the subnet that nobody holds."""
        hosts = self.subnet.num_addresses - 2
        return self.subnet.network_address + (254 if hosts >= 254 else hosts)

    @property
    def controller_address(self) -> ipaddress.IPv4Interface:
        return ipaddress.IPv4Interface(f"{self.subnet.network_address + 1}/{self.subnet.prefixlen}")

    def spare_address(self, n: int) -> ipaddress.IPv4Address:
        """The n-th (1-based) address after the node addresses, for extra NICs."""
        addr = self.subnet.network_address + 10 + len(self.nodes) + n
        if addr >= self.gateway:
            raise LabError(f"subnet {self.subnet} is too small for this lab", ExitCode.INVALID_INPUT)
        return addr

    def node(self, name: str) -> NodePlan:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def env_for(self, node: NodePlan, **override: str) -> dict[str, str]:
        """The env file ddpfix would write for `node` (the plan's own launch keys), with `override` applied."""
        env = node_env(str(self.master.address), self.master_port, len(self.nodes), node.index - 1, 1, node.ifname)
        env.update(override)
        return env


@dataclass
class NodeInfo:
    name: str
    hostname: str
    address: str
    ifname: str
    netns: str
    pid: int  # host PID of the node's PID 1


@dataclass
class LabInfo:
    name: str
    subnet: str
    scenarios: list[str]
    state_dir: Path
    inventory: Path
    private_key: Path
    known_hosts: Path
    ssh_config: Path
    nodes: list[NodeInfo]
    master: str = "node1"
    master_port: int = MASTER_PORT
    ssh_user: str = "root"
    ssh_port: int = 22
    bastion: str | None = None

    def node(self, name: str) -> NodeInfo:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def ssh_argv(self, node: str, *command: str) -> list[str]:
        """`ssh` argv reaching `node` with the lab's key, known_hosts (strict checking), user, port and bastion."""
        return ["ssh", "-F", str(self.ssh_config), node, *command]


@dataclass
class NodeStatus:
    name: str
    hostname: str
    address: str
    ifname: str
    netns: str
    pid: int
    alive: bool
    sshd: bool
    processes: dict[str, bool] = field(default_factory=dict)


@dataclass
class LabStatus:
    name: str
    exists: bool
    subnet: str | None = None
    scenarios: list[str] = field(default_factory=list)
    inventory: str | None = None
    state_dir: str | None = None
    nodes: list[NodeStatus] = field(default_factory=list)
