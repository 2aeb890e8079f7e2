"""The trust boundary: every value a node returned is checked like an inventory value before any use.

A node's facts are hostile input (a compromised node, a user with write access to /etc or /sys there): a string it
returns may carry template syntax, shell metacharacters, line breaks or terminal escapes, and would then travel into
peers' files, the env files, the plan a play reads and the operator's terminal. `validate_facts` lists every value
that is not of its field's grammar, as (field, value, why), the audit's `facts.invalid` findings; `sanitize_facts`
returns the copy the checks and the plan read, with each such value removed. Only well-formed values survive:

- names: hostnames and FQDNs (RFC 1123), interface names (the kernel's alphabet), RDMA device and driver names;
- numbers: ports, indexes, NUMA nodes, states (no bool posing as int);
- fixed formats: IP addresses, CIDRs, MACs, GIDs, P_Keys, digests, NCCL versions, uverbs/umad device names;
- short words read from sysfs (port states, link layers, rates, GID types);
- env-file keys (shell names) and values without control characters.

Free text (error messages, tool output, /etc/hosts lines) is never written anywhere: it is kept as one printable
line (`one_line`: control characters, line separators and undecodable bytes escaped, length cut), so a report,
a terminal or a JUnit file never shows a forged line. Firewall rule text stays as read (it is parsed line by line).
Everything ddpfix hands a play is data, never a template (`ansible.rundirs.as_data`). Pure functions, no hosts needed.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

from ddpfix.model.facts import NodeFacts

Problem = tuple[str, str, str]  # (field, value, why)

#: Names the hosts block never manages (and a node's hostname must not be): the loopback and IPv6 well-known names.
RESERVED_NAMES = ("localhost", "localhost.localdomain", "localhost4", "localhost4.localdomain4", "localhost6",
                  "localhost6.localdomain6")
MAC = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5,19}$")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # hosts_block_sha256
_IFNAME_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:@+-")
#: RDMA device and driver names (kernel IB_DEVICE_NAME_MAX 64: mlx5_0, rxe0, efa_0, irdma1, bnxt_re0, rocep1s0f0)
_RDMA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_GID = re.compile(r"[0-9a-f]{4}(:[0-9a-f]{4}){7}")
_PKEY = re.compile(r"0x[0-9a-fA-F]{1,4}")
#: a short word or phrase sysfs prints: `ACTIVE`, `LinkUp`, `InfiniBand`, `RoCE v2`, `IB/RoCE v1`, `200 Gb/sec (4X HDR)`
_SYSFS_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._/()+-]{0,63}")
_DEVNODE = re.compile(r"(uverbs|umad|issm|rdma_cm)[0-9]*")
_VERSION = re.compile(r"\d+(\.\d+){0,3}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEX_SALT = re.compile(r"[0-9a-f]{16,64}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_UNIT = re.compile(r"[A-Za-z0-9@_.:\\-]{1,255}")
#: what a shown value must not carry: C0/C1 controls but tab (line breaks, escapes, NUL), Unicode line separators
#: and lone surrogates (undecodable bytes): `one_line` writes them as Python escapes
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
#: the longest free-text value kept (error messages, /etc/hosts lines); longer ones are cut, marked with '...'
FREE_TEXT_MAX = 2000
#: fact subtrees that are machine text parsed on the controller, line by line (iptables-save, nft), not shown whole
_PARSED_TEXT = ("firewall",)


def one_line(text: str, limit: int = FREE_TEXT_MAX) -> str:
    """`text` as one printable line: control characters, line separators and lone surrogates as Python escapes
    (`\\n`, `\\x1b`, `\\udcff`), cut at `limit` characters."""
    out = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)
    return out if len(out) <= limit else out[:limit] + "..."


def _line(text: str) -> str:
    return text if len(text) <= FREE_TEXT_MAX and not _UNPRINTABLE.search(text) else one_line(text)


def _neutral(value: Any) -> Any:
    """Every string of a (free-text) fact subtree as one printable line; dict keys too. (JSON types only: what a
    module returns.)"""
    if isinstance(value, str):
        return _line(value)
    if isinstance(value, dict):
        return {(_line(k) if isinstance(k, str) else k): _neutral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_neutral(v) for v in value]
    return value


_JSON_ESCAPE = re.compile(rf'\\[^"\\/t]|"[^"]{{{FREE_TEXT_MAX},}}"')  # not \t: a tab stays


def _printable_json(value: Any) -> bool:
    """Whether `value` surely holds no string `_line` would change, from its JSON text alone (escapes of a control
    character, line separator or non-ASCII character, or a string that long), a scan at C speed; False: walk it."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return False
    return _JSON_ESCAPE.search(text) is None


def is_reserved_name(name: str) -> bool:
    n = name.lower()
    return n in RESERVED_NAMES or n.startswith("ip6-")


def is_hostname(s: str) -> bool:
    """An RFC 1123 host name (labels of letters, digits and inner hyphens; at most 253 characters)."""
    if not s or len(s) > 253 or s.endswith("."):
        return False
    labels = s.split(".")
    if all(lbl.isdigit() for lbl in labels):
        return False
    return all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", lbl) for lbl in labels)


def valid_ifname(s: object) -> bool:
    return isinstance(s, str) and 0 < len(s) <= 15 and set(s) <= _IFNAME_OK and s not in (".", "..")


def valid_ip(s: object) -> bool:
    if not isinstance(s, str):
        return False
    try:
        ipaddress.ip_address(s.split("%")[0])
        return True
    except ValueError:
        return False


def _valid_cidr(s: object) -> bool:
    if not isinstance(s, str):
        return False
    try:
        ipaddress.ip_network(s, strict=False)
        return True
    except ValueError:
        return False


def _int(lo: int, hi: int) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _match(rx: re.Pattern[str]) -> Callable[[object], bool]:
    return lambda v: isinstance(v, str) and rx.fullmatch(v) is not None


def _opt(ok: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or ok(v)


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(v: object) -> str:
    return str(v)[:200]


class _Checker:
    """Collects problems while walking one node's facts; `ok(field, value, test, why)` says whether to keep it."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def ok(self, fld: str, value: object, test: Callable[[object], bool], why: str) -> bool:
        if test(value):
            return True
        self.problems.append((fld, _show(value), why))
        return False


_RDMA = _match(_RDMA_NAME)
_NAME_WHY = "not an RDMA device name (letters, digits, '_', '.', '-'; at most 64)"
_WORD_WHY = "not a sysfs value of this kind (a short word: letters, digits, spaces, ._/()+-)"


def _port(ck: _Checker, where: str, p: Mapping[str, Any]) -> dict[str, Any] | None:
    if not ck.ok(f"{where}.port", p.get("port"), _int(0, 255), "not an RDMA port number"):
        return None
    out = dict(p)
    for key, test, why in (
        ("state", _opt(_match(_SYSFS_WORD)), _WORD_WHY),
        ("phys_state", _opt(_match(_SYSFS_WORD)), _WORD_WHY),
        ("rate", _opt(_match(_SYSFS_WORD)), _WORD_WHY),
        ("link_layer", _opt(_match(_SYSFS_WORD)), _WORD_WHY),
        ("pkey0", _opt(_match(_PKEY)), "not a P_Key (0x and up to 4 hex digits)"),
        ("state_num", _opt(_int(0, 255)), "not a port state number"),
        ("phys_state_num", _opt(_int(0, 255)), "not a physical state number"),
        ("rate_gbps", _opt(_num), "not a rate"),
    ):
        if key in out and not ck.ok(f"{where}.{key}", out[key], test, why):
            out[key] = None
    gids = []
    for g in p.get("gids") or []:
        gw = f"{where}.gids[{g.get('index') if isinstance(g, Mapping) else '?'}]"
        if not isinstance(g, Mapping):
            ck.ok(gw, g, lambda _: False, "not a GID entry")
            continue
        if not (ck.ok(f"{gw}.index", g.get("index"), _int(0, 65535), "not a GID index")
                and ck.ok(f"{gw}.gid", g.get("gid"), _match(_GID), "not a GID (8 groups of 4 hex digits)")
                and ck.ok(f"{gw}.type", g.get("type"), _opt(_match(_SYSFS_WORD)), _WORD_WHY)
                and ck.ok(f"{gw}.ndev", g.get("ndev"), _opt(valid_ifname), "not an interface name")
                and ck.ok(f"{gw}.ipv4", g.get("ipv4"), _opt(valid_ip), "not an IP address")):
            continue
        gids.append(dict(g))
    out["gids"] = gids
    return out


def _fabric(ck: _Checker, fab: Mapping[str, Any]) -> dict[str, Any]:
    """The fabric facts (`ddpfix_fabric.collect`) with every ill-formed value dropped (a device whose name is ill-formed
    is dropped whole: NCCL_IB_HCA and every fabric check name devices)."""
    out = dict(fab)
    devices = []
    for i, d in enumerate(fab.get("devices") or []):
        where = f"fabric.devices[{i}]"
        if not isinstance(d, Mapping):
            ck.ok(where, d, lambda _: False, "not a device entry")
            continue
        if not ck.ok(f"{where}.name", d.get("name"), _RDMA, _NAME_WHY):
            continue
        where = f"fabric.devices[{d['name']}]"
        dev = dict(d)
        if not ck.ok(f"{where}.driver", d.get("driver"), _opt(_RDMA), "not a driver name"):
            dev["driver"] = None
        if not ck.ok(f"{where}.numa_node", d.get("numa_node"), _opt(_int(-1, 4096)), "not a NUMA node"):
            dev["numa_node"] = None
        dev["netdevs"] = [n for n in d.get("netdevs") or []
                          if ck.ok(f"{where}.netdevs", n, valid_ifname, "not an interface name")]
        ports = [_port(ck, f"{where}.ports[{j}]", p) if isinstance(p, Mapping) else None
                 for j, p in enumerate(d.get("ports") or [])]
        dev["ports"] = [p for p in ports if p is not None]
        devices.append(dev)
    out["devices"] = devices
    for key, rx in (("uverbs", _DEVNODE), ("umad", _DEVNODE)):
        out[key] = [n for n in fab.get(key) or [] if ck.ok(f"fabric.{key}", n, _match(rx), "not an RDMA device node")]
    efa = dict(fab.get("efa") or {})
    efa["devices"] = [n for n in efa.get("devices") or [] if ck.ok("fabric.efa.devices", n, _RDMA, _NAME_WHY)]
    fi = efa.get("fi_info")
    if isinstance(fi, Mapping):
        efa["fi_info"] = dict(fi, providers=[p for p in fi.get("providers") or []
                                             if ck.ok("fabric.efa.fi_info.providers", p, _RDMA, "not a provider name")])
    out["efa"] = efa
    for key, test, why in (
        ("mad_abi", _opt(_match(re.compile(r"\d{1,4}"))), "not an ABI version"),
        ("nccl_version", _opt(_match(_VERSION)), "not a version (digits and dots)"),
    ):
        if not ck.ok(f"fabric.{key}", fab.get(key), test, why):
            out[key] = None
    out["memlock_units"] = {u: v for u, v in (fab.get("memlock_units") or {}).items()
                            if ck.ok("fabric.memlock_units", u, _match(_UNIT), "not a systemd unit name")}
    out["modules"] = {m: v for m, v in (fab.get("modules") or {}).items()
                      if ck.ok("fabric.modules", m, _RDMA, "not a kernel module name")}
    return out


#: torch's version (PEP 440 as torch prints it: 2.13.0+cpu, 2.5.0a0+git1a2b3c4, 2.4.0.dev20240101+cu121)
_TORCH_VERSION = re.compile(r"\d+(\.\d+){0,3}(\.?(a|b|rc|dev|post)\d*)*(\+[A-Za-z0-9.]{1,40})?")
_HIP_VERSION = re.compile(r"\d+(\.\d+){0,3}(-[0-9a-f]{1,40})?")
#: an interpreter path as the inventory's ddp_python is checked: absolute and normalized, or a bare command name
_PYTHON = re.compile(r"(/[A-Za-z0-9._+@-]+)+|[A-Za-z0-9._+-]{1,255}")
_RLIMIT = _int(-1, 2**63 - 1)


def _rlimit_entry(ck: _Checker, where: str, v: Any) -> dict[str, Any] | None:
    if not isinstance(v, Mapping):
        ck.ok(where, v, lambda _: False, "not a limit entry")
        return None
    if not (ck.ok(f"{where}.soft", v.get("soft"), _RLIMIT, "not a resource limit (-1 or a count)")
            and ck.ok(f"{where}.hard", v.get("hard"), _RLIMIT, "not a resource limit (-1 or a count)")):
        return None
    return dict(v)


def _limits(ck: _Checker, lim: Mapping[str, Any]) -> dict[str, Any]:
    """The launch path's limits (ddpfix_hostenv): counts only, unit names of the systemd grammar."""
    out: dict[str, Any] = {"nofile": _rlimit_entry(ck, "limits.nofile", lim.get("nofile"))
                           if lim.get("nofile") is not None else None, "nofile_units": {}}
    units = lim.get("nofile_units") or {}
    for u, v in (units.items() if isinstance(units, Mapping) else []):
        if ck.ok("limits.nofile_units", u, _match(_UNIT), "not a systemd unit name") and (
                e := _rlimit_entry(ck, f"limits.nofile_units[{u}]", v)) is not None:
            out["nofile_units"][u] = e
    return out


def _arp(ck: _Checker, arp: Any) -> dict[str, dict[str, int]]:
    """net.ipv4.conf.{all,IFACE}.arp_ignore/arp_announce: interface names of the kernel's alphabet, values 0-8."""
    out: dict[str, dict[str, int]] = {}
    for conf, v in (arp.items() if isinstance(arp, Mapping) else []):
        if not ck.ok("sysctl.arp", conf, valid_ifname, "not an interface name"):
            continue
        if not (isinstance(v, Mapping)
                and ck.ok(f"sysctl.arp[{conf}].arp_ignore", v.get("arp_ignore"), _int(0, 8), "not an arp_ignore value")
                and ck.ok(f"sysctl.arp[{conf}].arp_announce", v.get("arp_announce"), _int(0, 2),
                          "not an arp_announce value")):
            continue
        out[conf] = {"arp_ignore": v["arp_ignore"], "arp_announce": v["arp_announce"]}
    return out


def _torch(ck: _Checker, t: Mapping[str, Any]) -> dict[str, Any]:
    """torch's build as ddp_python reported it; an ill-formed version drops the whole entry (it is compared)."""
    out = dict(t)
    if not ck.ok("torch.python", t.get("python"), _opt(_match(_PYTHON)), "not an interpreter path or command name"):
        out["python"] = None
    for key, rx, why in (("version", _TORCH_VERSION, "not a torch version"), ("cuda", _VERSION, "not a CUDA version"),
                         ("hip", _HIP_VERSION, "not a ROCm version"), ("nccl", _VERSION, "not an NCCL version")):
        if not ck.ok(f"torch.{key}", t.get(key), _opt(_match(rx)), why):
            out[key] = None
            out["version"] = None  # compared as a whole: a part missing is no version
    return out


def _interfaces(ck: _Checker, interfaces: Any) -> list[dict[str, Any]]:
    out = []
    for i in interfaces or []:
        if not isinstance(i, Mapping):
            ck.ok("interfaces", i, lambda _: False, "not an interface entry")
            continue
        if not ck.ok("interfaces[].name", i.get("name"), valid_ifname, "not an interface name"):
            continue
        where = f"interfaces[{i['name']}]"
        iface = dict(i)
        for key in ("mac", "permaddr"):
            if key in iface and not ck.ok(f"{where}.{key}", iface[key], _opt(_match(MAC)), "not a MAC address"):
                iface[key] = None
        if not ck.ok(f"{where}.kind", iface.get("kind"), _opt(_match(_SYSFS_WORD)), "not an interface kind"):
            iface["kind"] = None
        iface["addrs"] = [a for a in i.get("addrs") or []
                          if isinstance(a, Mapping)
                          and ck.ok(f"{where}.addrs", a.get("local"), valid_ip, "not an IP address")
                          and ck.ok(f"{where}.addrs", a.get("prefixlen"), _int(0, 128), "not a prefix length")
                          and ck.ok(f"{where}.addrs", a.get("family"), lambda v: v in ("inet", "inet6"),
                                    "not an address family (inet, inet6)")]
        out.append(iface)
    return out


def _env_file(ck: _Checker, ef: Mapping[str, Any]) -> dict[str, Any]:
    """Env-file keys must be shell names and values free of control characters (a line break or an escape in a value
    read back would be shown to the operator and compared as if it were the file's)."""
    out = dict(ef)
    for part in ("values", "managed"):
        kept = {}
        for k, v in (ef.get(part) or {}).items():
            if (ck.ok(f"env_file.{part}", k, _match(_ENV_KEY), "not an environment variable name")
                    and ck.ok(f"env_file.{part}.{k}", v,
                              lambda s: isinstance(s, str) and not _UNPRINTABLE.search(s) and len(s) <= 4096,
                              "a value with a control character (line break, escape, NUL) or over 4096 characters")):
                kept[k] = v
        out[part] = kept
    out["outside_keys"] = [k for k in ef.get("outside_keys") or []
                           if ck.ok("env_file.outside_keys", k, _match(_ENV_KEY), "not an environment variable name")]
    sec = ef.get("secrets")
    if sec is not None:  # the HMACs of the redacted values (plan.env_differs compares them)
        if not isinstance(sec, Mapping) or not ck.ok("env_file.secrets.salt", sec.get("salt"), _match(_HEX_SALT),
                                                     "not a hex salt"):
            out.pop("secrets")
        else:
            out["secrets"] = {"salt": sec["salt"], **{
                part: {k: d for k, d in (sec.get(part) or {}).items()
                       if ck.ok(f"env_file.secrets.{part}", k, _match(_ENV_KEY), "not an environment variable name")
                       and ck.ok(f"env_file.secrets.{part}.{k}", d, _match(_HEX_DIGEST), "not a SHA-256 hex digest")}
                for part in ("values", "managed") if isinstance(sec.get(part) or {}, Mapping)}}
    # what remediate's dry run previews from (its diff; never written back, never run): text without control
    # characters but line breaks and tabs, within the size the node sends; else left out (the dry run then asks the
    # node itself, as if the node had not said)
    if not _preview_text(ef.get("text"), none=True):
        out.pop("text", None)
    cf = ef.get("cluster_file")
    if isinstance(cf, Mapping) and isinstance(cf.get("exists"), bool) and _preview_text(cf.get("text"), none=True):
        out["cluster_file"] = {"exists": cf["exists"], "text": cf.get("text")}
    else:
        out.pop("cluster_file", None)
    uw = ef.get("unwritable")
    if isinstance(uw, Mapping) and all(_preview_text(k) and _preview_text(v) and "\n" not in k + v
                                       for k, v in uw.items()):
        out["unwritable"] = {str(k): str(v) for k, v in uw.items()}
    else:
        out.pop("unwritable", None)
    return out


#: the most text of a file the facts carry (the node's PREVIEW_MAX)
PREVIEW_MAX = 65536
_PREVIEW_BAD = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")  # _UNPRINTABLE but \n


def _preview_text(v: Any, none: bool = False) -> bool:
    return (none and v is None) or (isinstance(v, str) and len(v) <= PREVIEW_MAX and not _PREVIEW_BAD.search(v))


#: a start-file path as the node reports it: absolute, printable, no `..` (shown only, never opened)
_PATH = re.compile(r"/[A-Za-z0-9@%+=:,./_~ -]{0,4095}")
_LAUNCH_KEY = re.compile(r"(MASTER_ADDR|MASTER_PORT|NODE_RANK|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK"
                         r"|NNODES|NPROC_PER_NODE|NCCL_COMM_ID|PET_[A-Z0-9_]{1,64}|[A-Z0-9_]{0,64}_SOCKET_IFNAME)")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")
_MOUNT_OPTS = re.compile(r"[A-Za-z0-9=,._:/+-]{0,1024}")


def _shm(ck: _Checker, shm: Mapping[str, Any]) -> dict[str, Any]:
    """/dev/shm facts (``ddpfix_launchenv.shm_facts``): byte counts and the GPU count are numbers in range, the mount
    type and options short words; an ill-formed size is dropped (the check then does not look: not a pass)."""
    out = dict(shm)
    for key, test, why in (
        ("size_bytes", _opt(_int(0, 2**62)), "not a byte count"),
        ("avail_bytes", _opt(_int(0, 2**62)), "not a byte count"),
        ("gpus", _opt(_int(0, 4096)), "not a GPU count"),
        ("fstype", _opt(_match(_RDMA_NAME)), "not a file system type"),
        ("options", _opt(_match(_MOUNT_OPTS)), "not mount options"),
        ("gpus_source", _opt(_match(_PATH)), "not a path"),
        ("path", _opt(_match(_PATH)), "not a path"),
    ):
        if not ck.ok(f"shm.{key}", out.get(key), test, why):
            out[key] = None
    if out.get("size_bytes") is None:
        out["avail_bytes"] = None
    return out


def _shell_env(ck: _Checker, se: Mapping[str, Any]) -> dict[str, Any]:
    """Launcher variables set in shell start files (``ddpfix_launchenv.stray_env_facts``): each entry a watched key, a
    printable path, a line number and a one-line value (an entry with any ill-formed field is dropped whole)."""
    out = dict(se)
    kept = []
    for i, a in enumerate(se.get("assignments") or []):
        where = f"shell_env.assignments[{i}]"
        if not isinstance(a, Mapping):
            ck.ok(where, a, lambda _: False, "not an assignment entry")
            continue
        if (ck.ok(f"{where}.key", a.get("key"), _match(_LAUNCH_KEY), "not a launcher variable name")
                and ck.ok(f"{where}.file", a.get("file"), lambda v: _match(_PATH)(v) and "/../" not in f"{v}/",
                          "not an absolute path of printable characters")
                and ck.ok(f"{where}.line", a.get("line"), _int(1, 10**7), "not a line number")
                and ck.ok(f"{where}.value", a.get("value"),
                          lambda v: isinstance(v, str) and not _UNPRINTABLE.search(v) and len(v) <= 4096,
                          "a value with a control character (line break, escape, NUL) or over 4096 characters")):
            kept.append({"file": a["file"], "line": a["line"], "key": a["key"], "value": a["value"],
                         **{k: a.get(k) is True for k in ("dynamic", "conditional", "exported", "secret")}})
    out["assignments"] = kept
    out["files"] = [p for p in se.get("files") or [] if ck.ok("shell_env.files", p, _match(_PATH), "not a path")]
    out["users"] = [u for u in se.get("users") or []
                    if ck.ok("shell_env.users", u, _match(_USER), "not a user name")]
    return out


def _peer_name(v: object) -> bool:
    """A probe target's name as the plan gave it: an inventory host name or an IP address."""
    return isinstance(v, str) and (is_hostname(v) or valid_ip(v))


def _reach(ck: _Checker, reach: Any) -> dict[str, dict[str, Any]]:
    """probe.reach: {ifname: {address, speed, device, reached: [peer], failed: {peer: error}}}. An entry with an
    invalid interface name or address is dropped whole (its results cannot be attributed); an invalid peer name is
    dropped from its list; an error is kept as one line."""
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(reach, Mapping):
        ck.problems.append(("probe.reach", _show(reach), "not a mapping of interfaces"))
        return out
    for ifname, e in reach.items():
        if not ck.ok("probe.reach", ifname, valid_ifname, "not an interface name"):
            continue
        where = f"probe.reach.{ifname}"
        if not isinstance(e, Mapping):
            ck.problems.append((where, _show(e), "not a mapping"))
            continue
        if not ck.ok(f"{where}.address", e.get("address"), valid_ip, "not an IP address"):
            continue
        speed = e.get("speed")
        if not ck.ok(f"{where}.speed", speed, _opt(_int(1, 10_000_000)), "not a link speed (Mb/s)"):
            speed = None
        got, fails = e.get("reached"), e.get("failed")
        reached: list[Any] = got if isinstance(got, list) else []
        failed: Mapping[Any, Any] = fails if isinstance(fails, Mapping) else {}
        out[ifname] = {
            "address": e["address"],
            "speed": speed,
            "device": e.get("device") is True,
            "reached": [p for p in reached if ck.ok(f"{where}.reached", p, _peer_name, "not a host name or IP")],
            "failed": {p: one_line(str(why), 200) for p, why in failed.items()
                       if ck.ok(f"{where}.failed", p, _peer_name, "not a host name or IP")},
        }
    return out


def guard_reach(reach: Any) -> tuple[list[Problem], dict[str, dict[str, Any]]]:
    """(the problems of a probe's `reach` as a node returned it, the well-formed part): interface names by the
    kernel's grammar, addresses by ipaddress, peers as host names or IPs, errors as one line."""
    ck = _Checker()
    return ck.problems, _reach(ck, reach)


def guard_facts(node_facts: Mapping[str, Any]) -> tuple[list[Problem], NodeFacts]:
    """(every value of the node's facts that is not of its field's grammar, the facts without them)."""
    ck = _Checker()
    f: dict[str, Any] = dict(node_facts)
    hn = f.get("hostname")
    if hn is not None:
        if not (isinstance(hn, str) and is_hostname(hn)):
            ck.problems.append(("hostname", _show(hn), "not an RFC 1123 host name"))
            f["hostname"] = None
        elif is_reserved_name(hn):
            ck.problems.append(("hostname", hn, "a reserved loopback name: give the node a unique hostname"))
            f["hostname"] = None
    fq = f.get("fqdn")
    if fq is not None and not (isinstance(fq, str) and is_hostname(fq)):
        ck.problems.append(("fqdn", _show(fq), "not an RFC 1123 host name"))
        f["fqdn"] = None
    elif isinstance(fq, str) and is_reserved_name(fq):
        f["fqdn"] = None  # a loopback name is no peer's name to write: left out, no finding (Debian's default)
    c = dict(f.get("cluster") or {})
    if not ck.ok("cluster.address", c.get("address"), _opt(valid_ip), "not an IP address"):
        c["address"] = None
    if not ck.ok("cluster.ifname", c.get("ifname"), _opt(valid_ifname), "not an interface name"):
        c["ifname"] = None
    if not ck.ok("cluster.cidr", c.get("cidr"), _opt(_valid_cidr), "not a CIDR"):
        c["cidr"] = None
    if "cluster" in f:
        f["cluster"] = c
    if "master_ip" in f and not ck.ok("master_ip", f["master_ip"], _opt(valid_ip), "not an IP address"):
        f["master_ip"] = None
    pr = f.get("probe")
    if isinstance(pr, Mapping):
        addr_ok = ck.ok("probe.address", pr.get("address") or None, _opt(valid_ip), "not an IP address")
        port_ok = ck.ok("probe.port", pr.get("port"), _opt(_int(1, 65535)), "not a TCP port")
        if not (addr_ok and port_ok):
            f["probe"] = {**pr, "address": None, "port": None}
        if "reach" in pr:
            f["probe"] = {**f["probe"], "reach": _reach(ck, pr["reach"])}
    digest = f.get("hosts_block_sha256")
    if digest is not None and not ck.ok("hosts_block_sha256", digest, _match(SHA256_HEX), "not a SHA-256 digest"):
        f.pop("hosts_block_sha256")  # not compared: as if the node had not said
    if "interfaces" in f:
        f["interfaces"] = _interfaces(ck, f.get("interfaces"))
    if isinstance(f.get("env_file"), Mapping):
        f["env_file"] = _env_file(ck, f["env_file"])
    if isinstance(f.get("fabric"), Mapping):
        f["fabric"] = _fabric(ck, f["fabric"])
    if isinstance(f.get("limits"), Mapping):
        f["limits"] = _limits(ck, f["limits"])
    if isinstance(f.get("sysctl"), Mapping) and "arp" in f["sysctl"]:
        f["sysctl"] = {**f["sysctl"], "arp": _arp(ck, f["sysctl"]["arp"])}
    if isinstance(f.get("torch"), Mapping):
        f["torch"] = _torch(ck, f["torch"])
    if isinstance(f.get("shm"), Mapping):
        f["shm"] = _shm(ck, f["shm"])
    if isinstance(f.get("shell_env"), Mapping):
        f["shell_env"] = _shell_env(ck, f["shell_env"])
    # the files' text for the dry run's diff, checked above (_preview_text): lines, kept as lines
    ef = f.get("env_file")
    texts = {k: ef[k] for k in _PREVIEW_KEYS if k in ef} if isinstance(ef, Mapping) else {}
    if texts:
        f["env_file"] = {k: v for k, v in ef.items() if k not in texts}  # type: ignore[union-attr]
    # what is left is well-formed or free text a node reports about itself: shown only, and then as one line
    shown = {k: v for k, v in f.items() if k not in _PARSED_TEXT}
    if not _printable_json(shown):
        f = {k: (v if k in _PARSED_TEXT else _neutral(v)) for k, v in f.items()}
    if texts:
        f["env_file"] = {**f["env_file"], **texts}
    return ck.problems, cast(NodeFacts, f)  # values as returned: every message shows them with repr()


#: env_file's parts that are a file's text (validated by _preview_text in _env_file)
_PREVIEW_KEYS = ("text", "cluster_file")


def validate_facts(node_facts: Mapping[str, Any]) -> list[Problem]:
    """Problems with the values a node returned: [(field, value, why)], the audit's facts.invalid findings."""
    return guard_facts(node_facts)[0]


def sanitize_facts(node_facts: Mapping[str, Any]) -> NodeFacts:
    """A copy with every invalid value removed (what the checks and the plan read)."""
    return guard_facts(node_facts)[1]
