"""The inventory contract: the `ddp_*` variables and the roles' `ddpfix_*` inputs an inventory may set, each
validated on its own (one line naming the variable and the value, exit 2). Only inputs are checked here, nothing that
depends on host facts (kubespray's rule)."""

from __future__ import annotations

import functools
import ipaddress
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ddpfix import paths
from ddpfix.ansible import collection
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.factguard.grammar import is_hostname, one_line
from ddpfix.model import pyargv
from ddpfix.model.cluster import DEFAULT_ENV_PATH
from ddpfix.model.net import is_ip, valid_ifname

GROUP = "ddp_nodes"
FIREWALL_CHOICES = ("auto", "firewalld", "iptables", "nftables", "none")
ENV_SCOPES = ("cluster", "node")


def refused(msg: str) -> DdpfixError:
    """A refused inventory value: one printable line (a value's line break or escape is shown escaped), exit 2."""
    return DdpfixError(one_line(msg, 1000), ExitCode.INVALID_INPUT)


#: ddp_backup_keep: 1 (the last backup only) .. this many backups per written file.
BACKUP_KEEP_MAX = 1000


def int_var(value: Any, what: str, lo: int, hi: int) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        v = int(str(value).strip())
    except (TypeError, ValueError):
        raise refused(f"{what} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise refused(f"{what} must be between {lo} and {hi}, got {v}")
    return v


def bool_var(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise refused(f"{what} must be a boolean, got {value!r}")


#: Private networks: RFC 1918, CGNAT (RFC 6598), IPv6 ULA. A cluster CIDR outside them needs the ack variable.
PRIVATE_NETS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                         "100.64.0.0/10", "fc00::/7"))
#: The broadest cluster CIDR accepted without the ack variable.
MAX_PREFIX_WITHOUT_ACK = 16
ACK_BROAD = "ddp_cluster_cidr_ack_broad"
ABS_PATH = re.compile(r"^(/[A-Za-z0-9._+@:-]+)+$")
#: ddp_env_path must not lie under these (tmpfs, per-user, kernel trees).
ENV_PATH_FORBIDDEN = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run/user")


def parse_cidr(value: Any, what: str = "ddp_cluster_cidr") -> str:
    text = str(value).strip()
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise refused(f"{what} is not a valid CIDR: {value!r}") from None
    if net.prefixlen == 0:
        raise refused(f"{what} {value!r} is the whole address space: name the cluster's private network")
    if str(net) != text and "/" in text and ipaddress.ip_interface(text).ip != net.network_address:
        raise refused(f"{what} {text!r} has host bits set: did you mean {net}?")
    if net.version == 6:
        raise refused(f"{what} {text!r} is IPv6: ddpfix's firewall fixes are IPv4 (iptables) only; "
                      "use the cluster's IPv4 network")
    return str(net)


def parse_skip(value: Any, what: str) -> tuple[str, ...]:
    """Accepted findings: a list (or comma-separated text) of `ID` or `ID@HOST`; unknown ids are refused."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise refused(f"{what} must be a list of finding ids, got {value!r}")
    texts = [text for text in (str(item).strip() for item in items) if text]
    if not texts:
        return ()
    # the rule registry loads only when there is a finding id to check (the CLI's start; the cluster task's worker)
    from ddpfix.rules.registry import RULES

    out: list[str] = []
    for text in texts:
        rid = text.split("@", 1)[0]
        if rid not in RULES:
            raise refused(f"{what}: unknown finding id {rid!r} (in {text!r})")
        out.append(text)
    return tuple(out)


def parse_port_range(value: Any, where: str) -> tuple[int, int]:
    """`LO-HI` (1024 <= LO <= HI <= 65535) -> (LO, HI); anything else: exit 2 naming `where` and the value."""
    m = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", str(value))
    if not m or not 1024 <= int(m.group(1)) <= int(m.group(2)) <= 65535:
        raise DdpfixError(f"{where} must be a port range LO-HI with 1024 <= LO <= HI <= 65535, got {value!r}",
                          ExitCode.INVALID_INPUT)
    return int(m.group(1)), int(m.group(2))


def cidr_needs_ack(cidr: str) -> str | None:
    """Why opening firewalls to `cidr` needs ddp_cluster_cidr_ack_broad (None: it does not)."""
    net = ipaddress.ip_network(cidr)
    if not any(net.subnet_of(p) for p in PRIVATE_NETS if p.version == net.version):  # type: ignore[arg-type]
        return "is not a private network (RFC 1918, CGNAT 100.64.0.0/10 or ULA)"
    if net.prefixlen < MAX_PREFIX_WITHOUT_ACK:
        return f"is broader than /{MAX_PREFIX_WITHOUT_ACK}"
    return None


def check_env_path(value: Any) -> str:
    p = str(value)
    what = f"ddp_env_path {p!r}"
    if not p.startswith("/"):
        raise refused(f"{what} must be an absolute path")
    if p.endswith("/"):
        raise refused(f"{what} names a directory: give the file's path")
    if not ABS_PATH.match(p):
        raise refused(f"{what} contains whitespace or shell characters")
    if posixpath.normpath(p) != p or "/../" in p + "/" or "/./" in p + "/":
        raise refused(f"{what} is not normalized (no '.', '..' or '//' components): "
                      f"did you mean {posixpath.normpath(p)!r}?")
    for root in ENV_PATH_FORBIDDEN:
        if p == root or p.startswith(root + "/"):
            raise refused(f"{what} lies under {root}: choose a persistent system path such as {DEFAULT_ENV_PATH}")
    return p


def check_env_template(value: Any, inventories: Sequence[str]) -> str | None:
    """ddp_env_template: a readable file on the controller (relative: to the first inventory's directory)."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise refused(f"ddp_env_template must be a path, got {value!r}")
    p = os.path.expanduser(value)
    if not os.path.isabs(p):
        base = next((i for i in inventories if os.path.exists(i)), None)
        if base:
            p = os.path.join(base if os.path.isdir(base) else os.path.dirname(os.path.abspath(base)), p)
    p = os.path.abspath(p)
    if not os.path.isfile(p) or not os.access(p, os.R_OK):
        raise refused(f"ddp_env_template {value!r}: no readable file at {p}")
    return p


def check_ntp_server(value: Any) -> str:
    s = str(value).strip() if isinstance(value, str) else value
    if not isinstance(s, str) or not s or not (is_hostname(s) or is_ip(s, scoped=False)):
        raise refused(f"ddp_ntp_servers entry {value!r} is not a hostname or an IP address")
    return s


def check_hosts_domains(value: Any) -> tuple[str, ...]:
    """ddp_hosts_domains: the DNS domains under which a node's hostname may be the short form of its inventory name
    (or its inventory name the short form of its hostname); a list (or one domain), each an RFC 1123 name."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise refused(f"ddp_hosts_domains must be a list of DNS domains, got {value!r}")
    out: list[str] = []
    for item in items:
        d = item.strip().strip(".").lower() if isinstance(item, str) else item
        if not isinstance(d, str) or not d or not is_hostname(d):
            raise refused(f"ddp_hosts_domains entry {item!r} is not a DNS domain (an RFC 1123 name)")
        out.append(d)
    return tuple(dict.fromkeys(out))


def check_ifname(value: Any, host: str) -> str:
    s = str(value)
    prefix = next((p for p in ("^=", "^", "=") if s.startswith(p)), "")
    names = s[len(prefix) :].split(",") if prefix else [s]  # a list only in NCCL's explicit grammar
    if not all(valid_ifname(n) for n in names):
        raise refused(
            f"ddp_socket_ifname of {host} {s!r} is not an interface name (at most 15 characters, no '/', "
            "whitespace or shell characters) or an NCCL spec written with an explicit ^ or = prefix"
        )
    return s


@functools.lru_cache(maxsize=1)
def role_var_specs() -> dict[str, dict[str, Any]]:
    """Every role input (`ddpfix_<role>_*`) of the roles' meta/argument_specs.yml: name -> its type, elements and
    choices. An inventory that sets one is checked against it here, before any node is contacted, rather than by
    the role's argument validation when the role starts (after other roles changed the node)."""
    import yaml  # CLI start: PyYAML only when an inventory is checked

    # libyaml's loader when PyYAML has it (the same documents, a tenth of the time: this runs in the audit play's
    # first task, before any node is contacted)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(paths.roles_dir().glob("*/meta/argument_specs.yml")):
        doc = yaml.load(f.read_text(), Loader=loader) or {}  # a safe loader (C or Python)
        for entry in (doc.get("argument_specs") or {}).values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                if str(name).startswith("ddpfix_"):
                    out[str(name)] = {k: spec[k] for k in ("type", "elements", "choices") if k in spec}
    return out


#: The role inputs (and ddp_ variables) that say where a fix writes (and what of the limits drop-ins, which the
#: controller renders): the remediation's plan reads them from the inventory (`Node.role_vars`,
#: `ddpfix.remediate.writes`), the roles' defaults where the inventory does not set them.
WRITE_VARS = frozenset({
    "ddpfix_hosts_path", "ddpfix_env_cluster_path", "ddpfix_ifname_link_file", "ddpfix_limits_path",
    "ddpfix_limits_units", "ddpfix_limits_nofile_path", "ddpfix_sysctl_arp_path", "ddpfix_firewall_zone",
    "ddpfix_firewall_nft_layouts", "ddpfix_firewall_iptables_rules_paths", "ddp_launcher_units",
    "ddpfix_limits_memlock",
})


#: A firewalld zone or policy name as firewall-cmd takes it (a zone becomes a file name and an nft chain name, which
#: limits it to 17 characters): letters, digits, `_` and `-`.
FIREWALLD_NAME = re.compile(r"^[A-Za-z0-9_-]{1,17}$")
#: The grammar of every role input that reaches a command on a node (besides its type): name -> (pattern, what it
#: is). Checked before any node is contacted; the role checks it again before its first command (ansible-playbook).
ROLE_VAR_GRAMMAR: dict[str, tuple[re.Pattern[str], str]] = {
    "ddpfix_firewall_zone": (FIREWALLD_NAME, "a firewalld zone name: 1-17 letters, digits, '_' or '-'"),
    "ddpfix_verify_python": (re.compile(r"^(?:[A-Za-z0-9._+-]+|(?:/[A-Za-z0-9._+@:-]+)+)$"),
                             "an absolute path or a command name, without whitespace or shell characters"),
    "ddpfix_verify_nproc": (re.compile(r"^(?:gpu|cpu|auto|[1-9][0-9]{0,3})$"),
                            "torchrun's --nproc_per_node: gpu, cpu, auto or a number"),
    # its keys become shell assignments (its values are quoted)
    "ddpfix_verify_override": (re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$"), "a mapping of env names ([A-Z_][A-Z0-9_]*)"),
}


def check_role_var(host: str, name: str, value: Any, spec: Mapping[str, Any]) -> None:
    """One role input set in the inventory: its declared type (and choices), one line of text without control
    characters, and for an input that reaches a command its grammar (`ROLE_VAR_GRAMMAR`). A value that is still a
    template (Ansible renders it when the play runs) is left to the role."""
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        return
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # ansible-core: slow (CLI start)

    shown = "(env file content: not shown)" if name.startswith("ddpfix_env_") else repr(value)
    try:
        result = ArgumentSpecValidator({name: dict(spec)}).validate({name: value})
    except (OverflowError, ValueError) as exc:  # ansible-core's int check raises on 'INFINITY', 'NaN'
        kind = spec.get("type", "raw")
        raise refused(f"{name} of {host} {shown}: not of type {kind} ({one_line(str(exc))})") from None
    if result.error_messages:
        raise refused(f"{name} of {host} {shown}: {result.error_messages[0]} (roles/*/meta/argument_specs.yml)")

    def texts(v: Any) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, Mapping):
            return [t for k, x in v.items() for t in texts(k) + texts(x)]
        if isinstance(v, (list, tuple)):
            return [t for x in v for t in texts(x)]
        return []

    if any(ord(c) < 32 or ord(c) == 127 for t in texts(value) for c in t):
        raise refused(f"{name} of {host} {shown} contains a newline or another control character")
    grammar = ROLE_VAR_GRAMMAR.get(name)
    words = [str(k) for k in value] if isinstance(value, Mapping) else [str(value)]
    if grammar and not all(grammar[0].match(w) for w in words):
        raise refused(f"{name} of {host} {shown} is not {grammar[1]}")


def check_host_name(name: str) -> str:
    """An inventory host name: it names the node in the env file's comment, the plan and every report, so no
    whitespace, control character, quote, shell or template character (`{`, `}`, `$`, ...)."""
    if not name or len(name) > 253 or BAD_HOST_CHARS & set(name) or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise refused(f"inventory host name {name!r} is not a host name (no whitespace, quotes, shell or template "
                      "characters)")
    return name


def check_python(value: Any, host: str, var: str = "ddp_python") -> list[str]:
    """ddp_python (or a role's copy of it) as the argv the jobs' interpreter starts with (`ddpfix.model.pyargv`)."""
    why = pyargv.argv_problem(value)
    if why:
        raise refused(f"{var} of {host} {pyargv.shown_value(value)} {why}")
    return pyargv.argv(value)





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
    if not isinstance(key, str) or not ENV_KEY.fullmatch(key) or len(key) > ENV_KEY_MAX:
        raise refused(f"{where}: key {key!r} is not an environment name ([A-Z_][A-Z0-9_]*, at most {ENV_KEY_MAX} "
                      "characters)")
    lib = collection.module_utils("ddpfix_envfile")
    if env_key_reserved(key):
        instead = _RESERVED_INSTEAD.get(key)
        why = (f"set {instead} instead" if instead else
               "torchrun and torch.distributed read it for ranks and rendezvous; ddpfix writes the keys they need "
               "per node (RANK/WORLD_SIZE/LOCAL_RANK with ddp_env_process_vars: true)")
        raise refused(f"{where}: {key}={_shown(lib, key, value)} is reserved (derived by ddpfix per node: {why})")
    if isinstance(value, (dict, list, tuple)) or value is None:
        raise refused(f"{where}: {key} must be a string or number, got {_shown(lib, key, value)}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise refused(f"{where}: {key} must be one line, got {_shown(lib, key, text)}")
    bad = lib.check_values({key: text})
    if bad:
        if _secret(lib, key, text):  # the module's message quotes the value: a secret stays in the inventory
            bad = (f"env value of {key} ({lib.REDACTED}: a secret-looking value is not shown) is outside the env "
                   "file's grammar (it would need quoting, or is longer than 4096 characters): only letters, digits "
                   "and _ . , : / = @ % + ^ - are written")
        raise refused(f"{where}: {bad}")
    return key, text


ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
UNIT = re.compile(r"^[A-Za-z0-9@_.:-]+\.service$")
IB_HCA = re.compile(r"^\^?=?[A-Za-z0-9_.-]+(:[0-9]+)?(,[A-Za-z0-9_.-]+(:[0-9]+)?)*$")


def fabric_vars(host: str, hv: Mapping[str, Any]) -> dict[str, Any]:
    """ddp_nccl_ib_hca, ddp_nccl_ib_gid_index and ddp_env_extra of one host, validated."""
    out: dict[str, Any] = {}
    hca = hv.get("ddp_nccl_ib_hca")
    if hca not in (None, ""):
        if not isinstance(hca, str) or not IB_HCA.match(hca):
            raise refused(f"ddp_nccl_ib_hca of {host} must be an NCCL_IB_HCA list like '=mlx5_0:1,mlx5_1:1', "
                          f"got {hca!r}")
        out["nccl_ib_hca"] = hca
    gid = hv.get("ddp_nccl_ib_gid_index")
    if gid not in (None, ""):
        out["nccl_ib_gid_index"] = int_var(gid, f"ddp_nccl_ib_gid_index of {host}", 0, 255)
    units = hv.get("ddp_launcher_units")
    if units not in (None, "", []) and (
        not isinstance(units, list) or not all(isinstance(u, str) and UNIT.match(u) for u in units)
    ):
        raise refused(
            f"ddp_launcher_units of {host} must be a list of systemd unit names ending in .service, got {units!r}"
        )
    extra = hv.get("ddp_env_extra")
    if extra not in (None, "", {}):
        if not isinstance(extra, Mapping):
            raise refused(f"ddp_env_extra of {host} must be a mapping of NAME: value, got {extra!r}")
        items = [check_env_extra(host, k, v) for k, v in extra.items()]
        out["env_extra"] = tuple(sorted(items))
    return out



# ---------------------------------------------------------------------------- inventory sources (-i, DDPFIX_INVENTORY)
BAD_HOST_CHARS = frozenset(" \t\r\n\"'`$;&|<>(){}\\/*?")
