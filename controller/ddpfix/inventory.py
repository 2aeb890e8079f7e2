"""The inventory contract: read an Ansible inventory into a validated `Cluster`.

Only inputs are checked here, nothing that depends on host facts (kubespray's rule).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.factguard import is_hostname, one_line
from ddpfix.model.cluster import DEFAULT_ENV_PATH, DEFAULT_PORT, Cluster, Node

GROUP = "ddp_nodes"
FIREWALL_CHOICES = ("auto", "firewalld", "iptables", "nftables", "none")
ENV_SCOPES = ("cluster", "node")


def _bad(msg: str) -> DdpfixError:
    """A refused inventory value: one printable line (a value's line break or escape is shown escaped), exit 2."""
    return DdpfixError(one_line(msg, 1000), ExitCode.INVALID_INPUT)


#: ddp_backup_keep: 1 (the last backup only) .. this many backups per written file.
BACKUP_KEEP_MAX = 1000


def _int(value: Any, what: str, lo: int, hi: int) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        v = int(str(value).strip())
    except (TypeError, ValueError):
        raise _bad(f"{what} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise _bad(f"{what} must be between {lo} and {hi}, got {v}")
    return v


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise _bad(f"{what} must be a boolean, got {value!r}")


#: Private networks: RFC 1918, CGNAT (RFC 6598), IPv6 ULA. A cluster CIDR outside them needs the ack variable.
PRIVATE_NETS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                         "100.64.0.0/10", "fc00::/7"))
#: The broadest cluster CIDR accepted without the ack variable.
MAX_PREFIX_WITHOUT_ACK = 16
ACK_BROAD = "ddp_cluster_cidr_ack_broad"
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@+-]{1,15}$")
_COMMAND = re.compile(r"^[A-Za-z0-9._+-]+$")
_ABS_PATH = re.compile(r"^(/[A-Za-z0-9._+@:-]+)+$")
#: ddp_env_path must not lie under these (tmpfs, per-user, kernel trees).
ENV_PATH_FORBIDDEN = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run/user")


def parse_cidr(value: Any, what: str = "ddp_cluster_cidr") -> str:
    text = str(value).strip()
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise _bad(f"{what} is not a valid CIDR: {value!r}") from None
    if net.prefixlen == 0:
        raise _bad(f"{what} {value!r} is the whole address space: name the cluster's private network")
    if str(net) != text and "/" in text and ipaddress.ip_interface(text).ip != net.network_address:
        raise _bad(f"{what} {text!r} has host bits set: did you mean {net}?")
    if net.version == 6:
        raise _bad(f"{what} {text!r} is IPv6: ddpfix's firewall fixes are IPv4 (iptables) only; "
                   "use the cluster's IPv4 network")
    return str(net)


def parse_skip(value: Any, what: str) -> tuple[str, ...]:
    """Accepted findings: a list (or comma-separated text) of `ID` or `ID@HOST`; unknown ids are refused."""
    from ddpfix.rules.registry import RULES

    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise _bad(f"{what} must be a list of finding ids, got {value!r}")
    out: list[str] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        rid = text.split("@", 1)[0]
        if rid not in RULES:
            raise _bad(f"{what}: unknown finding id {rid!r} (in {text!r})")
        out.append(text)
    return tuple(out)


def cidr_needs_ack(cidr: str) -> str | None:
    """Why opening firewalls to `cidr` needs ddp_cluster_cidr_ack_broad (None: it does not)."""
    net = ipaddress.ip_network(cidr)
    if not any(net.subnet_of(p) for p in PRIVATE_NETS if p.version == net.version):  # type: ignore[arg-type]
        return "is not a private network (RFC 1918, CGNAT 100.64.0.0/10 or ULA)"
    if net.prefixlen < MAX_PREFIX_WITHOUT_ACK:
        return f"is broader than /{MAX_PREFIX_WITHOUT_ACK}"
    return None


def _check_env_path(value: Any) -> str:
    p = str(value)
    what = f"ddp_env_path {p!r}"
    if not p.startswith("/"):
        raise _bad(f"{what} must be an absolute path")
    if p.endswith("/"):
        raise _bad(f"{what} names a directory: give the file's path")
    if not _ABS_PATH.match(p):
        raise _bad(f"{what} contains whitespace or shell characters")
    if posixpath.normpath(p) != p or "/../" in p + "/" or "/./" in p + "/":
        raise _bad(f"{what} is not normalized (no '.', '..' or '//' components): "
                   f"did you mean {posixpath.normpath(p)!r}?")
    for root in ENV_PATH_FORBIDDEN:
        if p == root or p.startswith(root + "/"):
            raise _bad(f"{what} lies under {root}: choose a persistent system path such as {DEFAULT_ENV_PATH}")
    return p


def _check_env_template(value: Any, inventories: Sequence[str]) -> str | None:
    """ddp_env_template: a readable file on the controller (relative: to the first inventory's directory)."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise _bad(f"ddp_env_template must be a path, got {value!r}")
    p = os.path.expanduser(value)
    if not os.path.isabs(p):
        base = next((i for i in inventories if os.path.exists(i)), None)
        if base:
            p = os.path.join(base if os.path.isdir(base) else os.path.dirname(os.path.abspath(base)), p)
    p = os.path.abspath(p)
    if not os.path.isfile(p) or not os.access(p, os.R_OK):
        raise _bad(f"ddp_env_template {value!r}: no readable file at {p}")
    return p


def _check_ntp_server(value: Any) -> str:
    s = str(value).strip() if isinstance(value, str) else value
    if not isinstance(s, str) or not s or not (is_hostname(s) or _is_address(s)):
        raise _bad(f"ddp_ntp_servers entry {value!r} is not a hostname or an IP address")
    return s


def _check_ifname(value: Any, host: str) -> str:
    s = str(value)
    prefix = next((p for p in ("^=", "^", "=") if s.startswith(p)), "")
    names = s[len(prefix) :].split(",") if prefix else [s]  # a list only in NCCL's explicit grammar
    if not all(_IFNAME.match(n) for n in names) or any(n in (".", "..") for n in names):
        raise _bad(
            f"ddp_socket_ifname of {host} {s!r} is not an interface name (at most 15 characters, no '/', "
            "whitespace or shell characters) or an NCCL spec written with an explicit ^ or = prefix"
        )
    return s


@functools.lru_cache(maxsize=1)
def role_var_specs() -> dict[str, dict[str, Any]]:
    """Every role input (`ddpfix_<role>_*`) of the roles' meta/argument_specs.yml: name -> its type, elements and
    choices. An inventory that sets one is checked against it here, before any node is contacted, rather than by
    the role's argument validation when the role starts (after other roles changed the node)."""
    import yaml

    from ddpfix import paths

    out: dict[str, dict[str, Any]] = {}
    for f in sorted(paths.roles_dir().glob("*/meta/argument_specs.yml")):
        doc = yaml.safe_load(f.read_text()) or {}
        for entry in (doc.get("argument_specs") or {}).values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                if str(name).startswith("ddpfix_"):
                    out[str(name)] = {k: spec[k] for k in ("type", "elements", "choices") if k in spec}
    return out


def _check_role_var(host: str, name: str, value: Any, spec: Mapping[str, Any]) -> None:
    """One role input set in the inventory: its declared type (and choices), one line of text without control
    characters. A value that is still a template (Ansible renders it when the play runs) is left to the role."""
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        return
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    shown = "(env file content: not shown)" if name.startswith("ddpfix_env_") else repr(value)
    try:
        result = ArgumentSpecValidator({name: dict(spec)}).validate({name: value})
    except (OverflowError, ValueError) as exc:  # ansible-core's int check raises on 'INFINITY', 'NaN'
        raise _bad(f"{name} of {host} {shown}: not of type {spec.get('type', 'raw')} ({one_line(str(exc))})") from None
    if result.error_messages:
        raise _bad(f"{name} of {host} {shown}: {result.error_messages[0]} (roles/*/meta/argument_specs.yml)")

    def texts(v: Any) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, Mapping):
            return [t for k, x in v.items() for t in texts(k) + texts(x)]
        if isinstance(v, (list, tuple)):
            return [t for x in v for t in texts(x)]
        return []

    if any(ord(c) < 32 or ord(c) == 127 for t in texts(value) for c in t):
        raise _bad(f"{name} of {host} {shown} contains a newline or another control character")


def _check_host_name(name: str) -> str:
    """An inventory host name: it names the node in the env file's comment, the plan and every report, so no
    whitespace, control character, quote, shell or template character (`{`, `}`, `$`, ...)."""
    if not name or len(name) > 253 or _BAD_HOST_CHARS & set(name) or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise _bad(f"inventory host name {name!r} is not a host name (no whitespace, quotes, shell or template "
                   "characters)")
    return name


def _check_python(value: Any, host: str) -> str:
    s = str(value)
    if not (_ABS_PATH.match(s) or _COMMAND.match(s)) or (s.startswith("/") and posixpath.normpath(s) != s):
        raise _bad(
            f"ddp_python of {host} {s!r} must be an absolute path or a command name, "
            "without whitespace or shell characters"
        )
    return s


def _is_address(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
        return True
    except ValueError:
        return False


def cluster_from_inventory_data(data: Mapping[str, Any], inventories: Sequence[str] = ()) -> Cluster:
    """Build and validate the cluster from `ansible-inventory --list` output."""
    hostvars: Mapping[str, Mapping[str, Any]] = (data.get("_meta") or {}).get("hostvars") or {}
    if GROUP in data:
        names = _group_hosts(data, GROUP)
        if not names:
            raise _bad(f"inventory group '{GROUP}' has no hosts")
    else:
        names = _group_hosts(data, "all")
        if not names:
            raise _bad(f"inventory has no hosts (expected a group '{GROUP}')")
    for n in names:
        _check_host_name(n)
    first = hostvars.get(names[0], {})
    master = str(first.get("ddp_master") or names[0])
    if master not in names:
        raise _bad(f"ddp_master '{master}' is not a host of group '{GROUP}' (hosts: {', '.join(names)})")
    mv = hostvars.get(master, {})
    port = _int(mv.get("ddp_master_port", DEFAULT_PORT), "ddp_master_port", 1, 65535)
    cidr = mv.get("ddp_cluster_cidr")
    cidr = parse_cidr(cidr) if cidr not in (None, "") else None
    ack_broad = _bool(mv.get(ACK_BROAD, False), ACK_BROAD)
    nproc = _int(mv.get("ddp_nproc_per_node", 1), "ddp_nproc_per_node", 1, 1024)
    env_path = _check_env_path(mv.get("ddp_env_path") or DEFAULT_ENV_PATH)
    env_adopt = _bool(mv.get("ddp_env_adopt", False), "ddp_env_adopt")
    env_process_vars = _bool(mv.get("ddp_env_process_vars", False), "ddp_env_process_vars")
    if env_process_vars and nproc != 1:
        raise _bad(
            f"ddp_env_process_vars: true writes one RANK per node, so it needs ddp_nproc_per_node: 1, got {nproc} "
            "(with several processes per node torchrun sets RANK/WORLD_SIZE/LOCAL_RANK itself)"
        )
    env_scope = str(mv.get("ddp_env_scope") or "cluster")
    if env_scope not in ENV_SCOPES:
        raise _bad(f"ddp_env_scope must be one of {', '.join(ENV_SCOPES)}, got {mv.get('ddp_env_scope')!r}")
    if env_scope == "node" and env_process_vars:
        raise _bad("ddp_env_process_vars: true writes ranks into the env file, which ddp_env_scope: node keeps per "
                   "node only: set one of them")
    job_ports = mv.get("ddp_job_port_range")
    if job_ports not in (None, ""):
        from ddpfix.slurm import parse_port_range

        lo, hi = parse_port_range(job_ports, "ddp_job_port_range")
        job_ports = f"{lo}-{hi}"
    env_template = _check_env_template(mv.get("ddp_env_template"), inventories)
    mismatch = mv.get("ddp_slurm_count_mismatch")
    if mismatch not in (None, "") and not isinstance(mismatch, str):
        raise _bad(f"ddp_slurm_count_mismatch must be a string, got {mismatch!r}")
    firewall = str(mv.get("ddp_firewall") or "auto")
    if firewall not in FIREWALL_CHOICES:
        raise _bad(f"ddp_firewall must be one of {', '.join(FIREWALL_CHOICES)}, got {firewall!r}")
    ntp = mv.get("ddp_ntp_servers") or []
    if isinstance(ntp, str):
        ntp = [ntp]
    if not isinstance(ntp, list):
        raise _bad(f"ddp_ntp_servers must be a list, got {ntp!r}")
    ntp = [_check_ntp_server(x) for x in ntp]
    local_master = _bool(mv.get("ddp_ntp_local_master", False), "ddp_ntp_local_master")

    skip = parse_skip(mv.get("ddp_skip_findings") or [], "ddp_skip_findings")
    memlock = mv.get("ddp_memlock", "unlimited")
    memlock_kib = (
        None
        if str(memlock).strip().lower() in ("unlimited", "infinity", "-1")
        else _int(memlock, "ddp_memlock (KiB, or unlimited)", 64, 2**40)
    )

    specs = role_var_specs()
    for n in names:
        hv = hostvars.get(n) or {}
        for var in sorted(set(hv) & set(specs)):
            _check_role_var(n, var, hv[var], specs[var])
        if hv.get("ddp_socket_ifname"):
            _check_ifname(hv["ddp_socket_ifname"], n)
        if "ddp_python" in hv:
            _check_python(hv["ddp_python"], n)
        if "ddp_backup_keep" in hv:  # how many FILE.<pid>.<date>~ backups the roles keep per file they write
            _int(hv["ddp_backup_keep"], f"ddp_backup_keep of {n}", 1, BACKUP_KEEP_MAX)
    ranks = _assign_ranks(names, master, hostvars)
    nodes = tuple(
        sorted(
            (
                Node(
                    name=n,
                    address=str(hostvars.get(n, {}).get("ansible_host") or n),
                    rank=ranks[n],
                    socket_ifname=(
                        str(hostvars[n]["ddp_socket_ifname"]) if hostvars.get(n, {}).get("ddp_socket_ifname") else None
                    ),
                    **_fabric_vars(n, hostvars.get(n, {})),
                )
                for n in names
            ),
            key=lambda node: node.rank,
        )
    )
    return Cluster(
        nodes=nodes,
        master=master,
        master_port=port,
        cluster_cidr=cidr,
        nproc_per_node=nproc,
        env_path=env_path,
        env_adopt=env_adopt,
        env_process_vars=env_process_vars,
        env_scope=env_scope,
        job_port_range=str(job_ports) if job_ports else None,
        slurm_count_mismatch=one_line(mismatch, 1000) if mismatch else None,
        env_template=env_template,
        firewall=firewall,
        ntp_servers=tuple(str(s) for s in ntp),
        ntp_local_master=local_master,
        cidr_ack_broad=ack_broad,
        inventories=tuple(inventories),
        skip_findings=skip,
        memlock_kib=memlock_kib,
    )


#: Keys ddp_env_extra may not set (exit 2). What torchrun and torch.distributed read for ranks and rendezvous (a
#: permanent file setting one makes every node claim it: `PET_NODE_RANK=0` on every node is rank 0 everywhere), and
#: every key ddpfix itself writes into the block (derived per node, or set by their own inventory variable).
RESERVED_ENV_KEYS = frozenset(
    {
        # torch.distributed env:// and torchrun's per-worker environment
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        # ddpfix's own keys (plan.node_env, plan.fabric_env)
        "NNODES",
        "NODE_RANK",
        "NPROC_PER_NODE",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "FI_PROVIDER",
        "FI_EFA_USE_DEVICE_RDMA",
    }
)
#: Prefixes of reserved keys: torchrun's own option names (PET_NNODES, PET_NODE_RANK, ...) and torchelastic's.
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_")
#: Where a reserved key's value comes from instead (the refusal names it).
_RESERVED_INSTEAD = {
    "MASTER_ADDR": "ddp_master",
    "MASTER_PORT": "ddp_master_port",
    "NODE_RANK": "ddp_node_rank",
    "NPROC_PER_NODE": "ddp_nproc_per_node",
    "GLOO_SOCKET_IFNAME": "ddp_socket_ifname",
    "NCCL_SOCKET_IFNAME": "ddp_socket_ifname",
    "TP_SOCKET_IFNAME": "ddp_socket_ifname",
    "NCCL_IB_HCA": "ddp_nccl_ib_hca",
    "NCCL_IB_GID_INDEX": "ddp_nccl_ib_gid_index",
}
#: Longest ddp_env_extra key and value accepted.
ENV_KEY_MAX = 128


def _secret(lib: Any, key: str, value: Any) -> bool:
    """A value a refusal must not print: the env file module's one test (a secret-looking key, or URL userinfo)."""
    return bool(lib.is_secret(key, value))


def _shown(lib: Any, key: str, value: Any) -> str:
    return repr(lib.REDACTED) if _secret(lib, key, value) else repr(value)


def env_key_reserved(key: str) -> bool:
    return key in RESERVED_ENV_KEYS or key.startswith(RESERVED_ENV_PREFIXES)


def check_env_extra(host: str, key: Any, value: Any) -> tuple[str, str]:
    """One ddp_env_extra entry as the env file will hold it, or exit 2 naming the host, the key and the value.

    The value grammar is the env file's own (module_utils ddpfix_envfile `check_values`, the one the node's module
    applies): a value that bash, systemd and docker would not read alike unquoted is refused here, before any node
    is contacted, not by the module after other fixes were made. Template syntax (`{{`, `{%`), `$`, quotes,
    whitespace and control characters are outside that grammar, so no value reaches a node or a play that could be
    evaluated."""
    where = f"ddp_env_extra of {host}"
    if not isinstance(key, str) or not _ENV_KEY.fullmatch(key) or len(key) > ENV_KEY_MAX:
        raise _bad(f"{where}: key {key!r} is not an environment name ([A-Z_][A-Z0-9_]*, at most {ENV_KEY_MAX} "
                   "characters)")
    from ddpfix import collection

    lib = collection.module_utils("ddpfix_envfile")
    if env_key_reserved(key):
        instead = _RESERVED_INSTEAD.get(key)
        why = (f"set {instead} instead" if instead else
               "torchrun and torch.distributed read it for ranks and rendezvous; ddpfix writes the keys they need "
               "per node (RANK/WORLD_SIZE/LOCAL_RANK with ddp_env_process_vars: true)")
        raise _bad(f"{where}: {key}={_shown(lib, key, value)} is reserved (derived by ddpfix per node: {why})")
    if isinstance(value, (dict, list, tuple)) or value is None:
        raise _bad(f"{where}: {key} must be a string or number, got {_shown(lib, key, value)}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise _bad(f"{where}: {key} must be one line, got {_shown(lib, key, text)}")
    bad = lib.check_values({key: text})
    if bad:
        if _secret(lib, key, text):  # the module's message quotes the value: a secret stays in the inventory
            bad = (f"env value of {key} ({lib.REDACTED}: a secret-looking value is not shown) is outside the env "
                   "file's grammar (it would need quoting, or is longer than 4096 characters): only letters, digits "
                   "and _ . , : / = @ % + ^ - are written")
        raise _bad(f"{where}: {bad}")
    return key, text


_ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_UNIT = re.compile(r"^[A-Za-z0-9@_.:-]+\.service$")
_IB_HCA = re.compile(r"^\^?=?[A-Za-z0-9_.-]+(:[0-9]+)?(,[A-Za-z0-9_.-]+(:[0-9]+)?)*$")


def _fabric_vars(host: str, hv: Mapping[str, Any]) -> dict[str, Any]:
    """ddp_nccl_ib_hca, ddp_nccl_ib_gid_index and ddp_env_extra of one host, validated."""
    out: dict[str, Any] = {}
    hca = hv.get("ddp_nccl_ib_hca")
    if hca not in (None, ""):
        if not isinstance(hca, str) or not _IB_HCA.match(hca):
            raise _bad(f"ddp_nccl_ib_hca of {host} must be an NCCL_IB_HCA list like '=mlx5_0:1,mlx5_1:1', got {hca!r}")
        out["nccl_ib_hca"] = hca
    gid = hv.get("ddp_nccl_ib_gid_index")
    if gid not in (None, ""):
        out["nccl_ib_gid_index"] = _int(gid, f"ddp_nccl_ib_gid_index of {host}", 0, 255)
    units = hv.get("ddp_launcher_units")
    if units not in (None, "", []) and (
        not isinstance(units, list) or not all(isinstance(u, str) and _UNIT.match(u) for u in units)
    ):
        raise _bad(
            f"ddp_launcher_units of {host} must be a list of systemd unit names ending in .service, got {units!r}"
        )
    extra = hv.get("ddp_env_extra")
    if extra not in (None, "", {}):
        if not isinstance(extra, Mapping):
            raise _bad(f"ddp_env_extra of {host} must be a mapping of NAME: value, got {extra!r}")
        items = [check_env_extra(host, k, v) for k, v in extra.items()]
        out["env_extra"] = tuple(sorted(items))
    return out


def _group_hosts(data: Mapping[str, Any], group: str, seen: set[str] | None = None) -> list[str]:
    """Hosts of a group including its children, in inventory order, without duplicates."""
    seen = seen if seen is not None else set()
    if group in seen:
        return []
    seen.add(group)
    g = data.get(group) or {}
    out: list[str] = list(g.get("hosts") or [])
    for child in g.get("children") or []:
        out.extend(_group_hosts(data, child, seen))
    unique: list[str] = []
    for h in out:
        if h not in unique:
            unique.append(h)
    return unique


def _assign_ranks(names: list[str], master: str, hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Explicit ddp_node_rank wins; the rest fill the free ranks in inventory order, master first."""
    n = len(names)
    explicit: dict[str, int] = {}
    for h in names:
        if "ddp_node_rank" in (hostvars.get(h) or {}):
            explicit[h] = _int(hostvars[h]["ddp_node_rank"], f"ddp_node_rank of {h}", 0, n - 1)
    by_rank: dict[int, str] = {}
    for h, r in explicit.items():
        if r in by_rank:
            raise _bad(f"duplicate ddp_node_rank {r}: {by_rank[r]} and {h}")
        by_rank[r] = h
    if master in explicit and explicit[master] != 0:
        raise _bad(f"ddp_master {master} must have rank 0, has ddp_node_rank {explicit[master]}")
    if 0 in by_rank and by_rank[0] != master:
        raise _bad(f"ddp_node_rank 0 is {by_rank[0]} but ddp_master is {master}: rank 0 is the master")
    ranks = dict(explicit)
    free = iter(r for r in range(n) if r not in by_rank)
    for h in [master] + [x for x in names if x != master]:
        if h not in ranks:
            ranks[h] = next(free)
    return ranks


def cluster_from_hostvars(
    groups: Mapping[str, Any], hostvars: Mapping[str, Mapping[str, Any]], inventories: Sequence[str] = ()
) -> Cluster:
    """The same cluster from what a play sees (the ansible-playbook path, where extra vars such as a survey's
    `ddp_cluster_cidr` are part of every host's variables): only the `ddp_*` variables and `ansible_host` of the
    cluster's hosts are read, then validated by `cluster_from_inventory_data`.

    `groups`: the group tree as `ansible-inventory --list` writes it (`{group: {"hosts": [...], "children": [...]}}`,
    the same host order as the CLI's), or the play's flat `groups` variable (`{group: [hosts]}`: Ansible's order,
    the same unless the cluster group has grandchild groups)."""
    return cluster_from_inventory_data(inventory_data_from_hostvars(groups, hostvars), inventories)


def inventory_data_from_hostvars(
    groups: Mapping[str, Any], hostvars: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What `cluster_from_inventory_data` reads, in `ansible-inventory --list`'s shape, from what a play sees: the
    group tree and, of the cluster's hosts, only the `ddp_*` variables, `ansible_host` and the roles' inputs
    (`role_var_specs`, checked like the rest) (plain, templated values).
    The audit play hands this to the ddpfix CLI, which builds the same cluster from it without reading the inventory
    a second time."""
    tree: dict[str, Any] = {
        str(g): (dict(v) if isinstance(v, Mapping) else {"hosts": [str(h) for h in v or []]}) for g, v in groups.items()
    }
    group = GROUP if GROUP in tree else "all"
    names = _group_hosts(tree, group)
    data: dict[str, Any] = {**tree, "_meta": {"hostvars": {}}}
    specs = role_var_specs()
    for h in names:
        hv = hostvars.get(h) or {}
        data["_meta"]["hostvars"][h] = {
            str(k): plain(hv[k]) for k in list(hv) if str(k).startswith("ddp_") or k == "ansible_host" or k in specs
        }
    return data


def plain(value: Any) -> Any:
    """Plain Python containers and scalars of a value Ansible handed over (its own str/dict/list subclasses)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def load_cluster(inventories: Sequence[str]) -> Cluster:
    from ddpfix.ansible.listing import list_inventory

    return cluster_from_inventory_data(list_inventory(inventories), inventories)


# ---------------------------------------------------------------------------- inventory sources (-i, DDPFIX_INVENTORY)
_BAD_HOST_CHARS = frozenset(" \t\r\n\"'`$;&|<>(){}\\/*?")


def split_inventory_env(value: str) -> tuple[str, ...]:
    """DDPFIX_INVENTORY: one inventory, several separated by commas, or an ad-hoc host list.

    The whole value names an existing path, or ends with a comma (Ansible's ad-hoc marker): one source.
    Otherwise it is split on commas when every part is an existing path; if any part is not, the whole
    value is one source (an ad-hoc host list `host1,host2`, checked like `-i host1,host2,`).
    """
    v = value.strip()
    if not v:
        return ()
    if os.path.exists(v) or v.endswith(","):
        return (v,)
    parts = [p.strip() for p in v.split(",") if p.strip()]
    if len(parts) > 1 and all(os.path.exists(p) for p in parts):
        return tuple(parts)
    return (v,)


def host_list_data(spec: str) -> dict[str, Any]:
    """Ansible's ad-hoc host list (`-i host1,host2:2222,`) as a YAML inventory: the hosts form group ddp_nodes."""
    from ansible.errors import AnsibleError
    from ansible.parsing.utils.addresses import parse_address

    hosts: dict[str, dict[str, Any]] = {}
    for item in (h.strip() for h in spec.split(",")):
        if not item:
            continue
        try:
            host, port = parse_address(item, allow_ranges=False)
        except AnsibleError:
            host, port = item, None
        if "/" in item:
            raise _bad(f"inventory not found: {item} (in -i/--inventory {spec!r}; a path is not a host name)")
        if not host or _BAD_HOST_CHARS & set(host) or any(ord(c) < 32 for c in host):
            raise _bad(f"-i/--inventory {spec!r}: {item!r} is not a valid host name for an ad-hoc host list")
        hosts.setdefault(host, {} if port is None else {"ansible_port": int(port)})
    if not hosts:
        raise _bad(f"-i/--inventory {spec!r}: the ad-hoc host list names no host")
    return {GROUP: {"hosts": hosts}}


def resolve_inventories(specs: Sequence[str]) -> tuple[str, ...]:
    """Paths for ansible: existing paths as given; an ad-hoc host list (a comma, no such path, as Ansible decides)
    becomes a YAML inventory file in a run directory of its own."""
    out: list[str] = []
    for spec in specs:
        if os.path.exists(spec) or "," not in spec:
            out.append(spec)  # a missing path is reported by list_inventory
            continue
        import yaml

        from ddpfix.ansible.rundirs import new_run_dir

        data = host_list_data(spec)
        path = new_run_dir("adhoc-inventory") / "hosts.yml"
        path.write_text(f"# ddpfix: ad-hoc host list -i {spec!r}\n" + yaml.safe_dump(data, sort_keys=False))
        out.append(str(path))
    return tuple(out)
