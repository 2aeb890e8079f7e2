"""The checks of the facts' sections that have a structure of their own: interfaces, the RDMA fabric, limits, ARP
sysctls, torch, the env file (and its text for the dry run's diff), /dev/shm and the shell environment."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ddpfix.factguard.grammar import (
    MAC,
    UNPRINTABLE,
    Checker,
    int_in,
    is_number,
    matches,
    optional,
)
from ddpfix.model import pyargv
from ddpfix.model.net import is_ip, valid_ifname

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



_RDMA = matches(_RDMA_NAME)
_NAME_WHY = "not an RDMA device name (letters, digits, '_', '.', '-'; at most 64)"
_WORD_WHY = "not a sysfs value of this kind (a short word: letters, digits, spaces, ._/()+-)"


def _port(ck: Checker, where: str, p: Mapping[str, Any]) -> dict[str, Any] | None:
    if not ck.ok(f"{where}.port", p.get("port"), int_in(0, 255), "not an RDMA port number"):
        return None
    out = dict(p)
    for key, test, why in (
        ("state", optional(matches(_SYSFS_WORD)), _WORD_WHY),
        ("phys_state", optional(matches(_SYSFS_WORD)), _WORD_WHY),
        ("rate", optional(matches(_SYSFS_WORD)), _WORD_WHY),
        ("link_layer", optional(matches(_SYSFS_WORD)), _WORD_WHY),
        ("pkey0", optional(matches(_PKEY)), "not a P_Key (0x and up to 4 hex digits)"),
        ("state_num", optional(int_in(0, 255)), "not a port state number"),
        ("phys_state_num", optional(int_in(0, 255)), "not a physical state number"),
        ("rate_gbps", optional(is_number), "not a rate"),
    ):
        if key in out and not ck.ok(f"{where}.{key}", out[key], test, why):
            out[key] = None
    gids = []
    for g in p.get("gids") or []:
        gw = f"{where}.gids[{g.get('index') if isinstance(g, Mapping) else '?'}]"
        if not isinstance(g, Mapping):
            ck.ok(gw, g, lambda _: False, "not a GID entry")
            continue
        if not (ck.ok(f"{gw}.index", g.get("index"), int_in(0, 65535), "not a GID index")
                and ck.ok(f"{gw}.gid", g.get("gid"), matches(_GID), "not a GID (8 groups of 4 hex digits)")
                and ck.ok(f"{gw}.type", g.get("type"), optional(matches(_SYSFS_WORD)), _WORD_WHY)
                and ck.ok(f"{gw}.ndev", g.get("ndev"), optional(valid_ifname), "not an interface name")
                and ck.ok(f"{gw}.ipv4", g.get("ipv4"), optional(is_ip), "not an IP address")):
            continue
        gids.append(dict(g))
    out["gids"] = gids
    return out


def check_fabric(ck: Checker, fab: Mapping[str, Any]) -> dict[str, Any]:
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
        if not ck.ok(f"{where}.driver", d.get("driver"), optional(_RDMA), "not a driver name"):
            dev["driver"] = None
        if not ck.ok(f"{where}.numa_node", d.get("numa_node"), optional(int_in(-1, 4096)), "not a NUMA node"):
            dev["numa_node"] = None
        dev["netdevs"] = [n for n in d.get("netdevs") or []
                          if ck.ok(f"{where}.netdevs", n, valid_ifname, "not an interface name")]
        ports = [_port(ck, f"{where}.ports[{j}]", p) if isinstance(p, Mapping) else None
                 for j, p in enumerate(d.get("ports") or [])]
        dev["ports"] = [p for p in ports if p is not None]
        devices.append(dev)
    out["devices"] = devices
    for key, rx in (("uverbs", _DEVNODE), ("umad", _DEVNODE)):
        out[key] = [n for n in fab.get(key) or [] if ck.ok(f"fabric.{key}", n, matches(rx), "not an RDMA device node")]
    efa = dict(fab.get("efa") or {})
    efa["devices"] = [n for n in efa.get("devices") or [] if ck.ok("fabric.efa.devices", n, _RDMA, _NAME_WHY)]
    fi = efa.get("fi_info")
    if isinstance(fi, Mapping):
        efa["fi_info"] = dict(fi, providers=[p for p in fi.get("providers") or []
                                             if ck.ok("fabric.efa.fi_info.providers", p, _RDMA, "not a provider name")])
    out["efa"] = efa
    for key, test, why in (
        ("mad_abi", optional(matches(re.compile(r"\d{1,4}"))), "not an ABI version"),
        ("nccl_version", optional(matches(_VERSION)), "not a version (digits and dots)"),
    ):
        if not ck.ok(f"fabric.{key}", fab.get(key), test, why):
            out[key] = None
    out["memlock_units"] = {u: v for u, v in (fab.get("memlock_units") or {}).items()
                            if ck.ok("fabric.memlock_units", u, matches(_UNIT), "not a systemd unit name")}
    out["modules"] = {m: v for m, v in (fab.get("modules") or {}).items()
                      if ck.ok("fabric.modules", m, _RDMA, "not a kernel module name")}
    return out


#: torch's version (PEP 440 as torch prints it: 2.13.0+cpu, 2.5.0a0+git1a2b3c4, 2.4.0.dev20240101+cu121)
_TORCH_VERSION = re.compile(r"\d+(\.\d+){0,3}(\.?(a|b|rc|dev|post)\d*)*(\+[A-Za-z0-9.]{1,40})?")
_HIP_VERSION = re.compile(r"\d+(\.\d+){0,3}(-[0-9a-f]{1,40})?")
_RLIMIT = int_in(-1, 2**63 - 1)


def _rlimit_entry(ck: Checker, where: str, v: Any) -> dict[str, Any] | None:
    if not isinstance(v, Mapping):
        ck.ok(where, v, lambda _: False, "not a limit entry")
        return None
    if not (ck.ok(f"{where}.soft", v.get("soft"), _RLIMIT, "not a resource limit (-1 or a count)")
            and ck.ok(f"{where}.hard", v.get("hard"), _RLIMIT, "not a resource limit (-1 or a count)")):
        return None
    return dict(v)


def check_limits(ck: Checker, lim: Mapping[str, Any]) -> dict[str, Any]:
    """The launch path's limits (ddpfix_hostenv): counts only, unit names of the systemd grammar."""
    out: dict[str, Any] = {"nofile": _rlimit_entry(ck, "limits.nofile", lim.get("nofile"))
                           if lim.get("nofile") is not None else None, "nofile_units": {}}
    units = lim.get("nofile_units") or {}
    for u, v in (units.items() if isinstance(units, Mapping) else []):
        if ck.ok("limits.nofile_units", u, matches(_UNIT), "not a systemd unit name") and (
                e := _rlimit_entry(ck, f"limits.nofile_units[{u}]", v)) is not None:
            out["nofile_units"][u] = e
    dropins = check_nofile_dropins(lim.get("nofile_dropins"), out["nofile_units"])
    if dropins is not None:
        out["nofile_dropins"] = dropins
    return out


#: where the role ddpfix_limits writes a launcher unit's open-file limit (its tasks_from nofile)
UNIT_NOFILE_PATH = "/etc/systemd/system/{}.d/90-ddpfix-nofile.conf"


def check_nofile_dropins(d: Any, units: Mapping[str, Any]) -> dict[str, Any] | None:
    """What remediate's dry run previews the open-file limit's fix from (ddpfix_readers.nofile_dropins): the pam_limits
    drop-in and each launcher unit's (read by this run: the units of `limits.nofile_units`), their text and what of
    them cannot be written. Anything ill-formed drops the whole entry: the dry run then asks the node itself."""
    if not isinstance(d, Mapping):
        return None

    def file(f: Any, path_ok: Any) -> dict[str, Any] | None:
        if (isinstance(f, Mapping) and isinstance(f.get("path"), str) and path_ok(f["path"])
                and isinstance(f.get("exists"), bool) and preview_text_ok(f.get("text"), none=True)):
            return {"path": f["path"], "exists": f["exists"], "text": f.get("text")}
        return None

    pam = file(d.get("pam"), lambda p: bool(_PATH.fullmatch(p)) and ".." not in p.split("/"))
    got_units = d.get("units")
    if pam is None or not isinstance(got_units, Mapping) or set(got_units) != set(units):
        return None
    unit_files = {u: file(f, lambda p, u=u: p == UNIT_NOFILE_PATH.format(u)) for u, f in got_units.items()}
    uw = unwritable_entry(d.get("unwritable"))
    if any(f is None for f in unit_files.values()) or uw is None:
        return None
    return {"pam": pam, "units": unit_files, "unwritable": uw}


def _port_range(v: object) -> bool:
    """net.ipv4.ip_local_port_range as the kernel takes it: [low, high], 1 <= low <= high <= 65535."""
    return (isinstance(v, list) and len(v) == 2 and all(int_in(1, 65535)(x) for x in v)
            and v[0] <= v[1])


def check_sysctl_numbers(ck: Checker, sc: Mapping[str, Any]) -> dict[str, Any]:
    """net.ipv4.ip_local_port_range and net.core.somaxconn: the numbers the checks and the firewall plans compute
    with (every node's range goes into its peers' egress accepts). An ill-formed value is left out: the finding
    names it, and the node's own value is then not known (the reader's default stands in, as when unreadable)."""
    out = dict(sc)
    if "ip_local_port_range" in sc and not ck.ok("sysctl.ip_local_port_range", sc["ip_local_port_range"],
                                                 _port_range, "not a port range [low, high] within 1-65535"):
        out.pop("ip_local_port_range")
    if "somaxconn" in sc and not ck.ok("sysctl.somaxconn", sc["somaxconn"], int_in(0, 2**31 - 1),
                                       "not a listen backlog"):
        out.pop("somaxconn")
    return out


def check_arp(ck: Checker, arp: Any) -> dict[str, dict[str, int]]:
    """net.ipv4.conf.{all,IFACE}.arp_ignore/arp_announce: interface names of the kernel's alphabet, values 0-8."""
    out: dict[str, dict[str, int]] = {}
    for conf, v in (arp.items() if isinstance(arp, Mapping) else []):
        if not ck.ok("sysctl.arp", conf, valid_ifname, "not an interface name"):
            continue
        if not (isinstance(v, Mapping)
                and ck.ok(f"sysctl.arp[{conf}].arp_ignore", v.get("arp_ignore"), int_in(0, 8),
                          "not an arp_ignore value")
                and ck.ok(f"sysctl.arp[{conf}].arp_announce", v.get("arp_announce"), int_in(0, 2),
                          "not an arp_announce value")):
            continue
        out[conf] = {"arp_ignore": v["arp_ignore"], "arp_announce": v["arp_announce"]}
    return out


def check_torch(ck: Checker, t: Mapping[str, Any]) -> dict[str, Any]:
    """torch's build as ddp_python reported it; an ill-formed version drops the whole entry (it is compared)."""
    out = dict(t)
    if not ck.ok("torch.python", t.get("python"), lambda v: v is None or pyargv.argv_problem(v) is None,
                 "not a ddp_python (an interpreter path, a command name or an argv list)"):
        out["python"] = None
    if not ck.ok("torch.absent", t.get("absent"), lambda v: v is None or isinstance(v, bool), "not a boolean"):
        out["absent"] = False
    for key, rx, why in (("version", _TORCH_VERSION, "not a torch version"), ("cuda", _VERSION, "not a CUDA version"),
                         ("hip", _HIP_VERSION, "not a ROCm version"), ("nccl", _VERSION, "not an NCCL version")):
        if not ck.ok(f"torch.{key}", t.get(key), optional(matches(rx)), why):
            out[key] = None
            out["version"] = None  # compared as a whole: a part missing is no version
    return out


def check_interfaces(ck: Checker, interfaces: Any) -> list[dict[str, Any]]:
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
            if key in iface and not ck.ok(f"{where}.{key}", iface[key], optional(matches(MAC)), "not a MAC address"):
                iface[key] = None
        if not ck.ok(f"{where}.kind", iface.get("kind"), optional(matches(_SYSFS_WORD)), "not an interface kind"):
            iface["kind"] = None
        iface["addrs"] = [a for a in i.get("addrs") or []
                          if isinstance(a, Mapping)
                          and ck.ok(f"{where}.addrs", a.get("local"), is_ip, "not an IP address")
                          and ck.ok(f"{where}.addrs", a.get("prefixlen"), int_in(0, 128), "not a prefix length")
                          and ck.ok(f"{where}.addrs", a.get("family"), lambda v: v in ("inet", "inet6"),
                                    "not an address family (inet, inet6)")]
        out.append(iface)
    return out


def check_env_file(ck: Checker, ef: Mapping[str, Any]) -> dict[str, Any]:
    """Env-file keys must be shell names and values free of control characters (a line break or an escape in a value
    read back would be shown to the operator and compared as if it were the file's)."""
    out = dict(ef)
    for part in ("values", "managed"):
        kept = {}
        for k, v in (ef.get(part) or {}).items():
            if (ck.ok(f"env_file.{part}", k, matches(_ENV_KEY), "not an environment variable name")
                    and ck.ok(f"env_file.{part}.{k}", v,
                              lambda s: isinstance(s, str) and not UNPRINTABLE.search(s) and len(s) <= 4096,
                              "a value with a control character (line break, escape, NUL) or over 4096 characters")):
                kept[k] = v
        out[part] = kept
    out["outside_keys"] = [k for k in ef.get("outside_keys") or []
                           if ck.ok("env_file.outside_keys", k, matches(_ENV_KEY), "not an environment variable name")]
    sec = ef.get("secrets")
    if sec is not None:  # the HMACs of the redacted values (plan.env_differs compares them)
        if not isinstance(sec, Mapping) or not ck.ok("env_file.secrets.salt", sec.get("salt"), matches(_HEX_SALT),
                                                     "not a hex salt"):
            out.pop("secrets")
        else:
            out["secrets"] = {"salt": sec["salt"], **{
                part: {k: d for k, d in (sec.get(part) or {}).items()
                       if ck.ok(f"env_file.secrets.{part}", k, matches(_ENV_KEY), "not an environment variable name")
                       and ck.ok(f"env_file.secrets.{part}.{k}", d, matches(_HEX_DIGEST), "not a SHA-256 hex digest")}
                for part in ("values", "managed") if isinstance(sec.get(part) or {}, Mapping)}}
    # what remediate's dry run previews from (its diff; never written back, never run): text without control
    # characters but line breaks and tabs, within the size the node sends; else left out (the dry run then asks the
    # node itself, as if the node had not said)
    if not preview_text_ok(ef.get("text"), none=True):
        out.pop("text", None)
    cf = ef.get("cluster_file")
    if isinstance(cf, Mapping) and isinstance(cf.get("exists"), bool) and preview_text_ok(cf.get("text"), none=True):
        out["cluster_file"] = {"exists": cf["exists"], "text": cf.get("text")}
    else:
        out.pop("cluster_file", None)
    uw = unwritable_entry(ef.get("unwritable"))
    if uw is not None:
        out["unwritable"] = uw
    else:
        out.pop("unwritable", None)
    return out


def unwritable_entry(uw: Any) -> dict[str, str] | None:
    """A write pre-flight's result as a node reports it ({path: why it cannot be written}, shown in one line each),
    or None when it is not one."""
    if isinstance(uw, Mapping) and all(preview_text_ok(k) and preview_text_ok(v) and "\n" not in k + v
                                       for k, v in uw.items()):
        return {str(k): str(v) for k, v in uw.items()}
    return None


#: the most text of a file the facts carry (the node's PREVIEW_MAX)
PREVIEW_MAX = 65536
_PREVIEW_BAD = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")  # UNPRINTABLE but \n


def preview_text_ok(v: Any, none: bool = False) -> bool:
    return (none and v is None) or (isinstance(v, str) and len(v) <= PREVIEW_MAX and not _PREVIEW_BAD.search(v))


#: a start-file path as the node reports it: absolute, printable, no `..` (shown only, never opened)
_PATH = re.compile(r"/[A-Za-z0-9@%+=:,./_~ -]{0,4095}")
_LAUNCH_KEY = re.compile(r"(MASTER_ADDR|MASTER_PORT|NODE_RANK|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK"
                         r"|NNODES|NPROC_PER_NODE|NCCL_COMM_ID|PET_[A-Z0-9_]{1,64}|[A-Z0-9_]{0,64}_SOCKET_IFNAME)")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")
_MOUNT_OPTS = re.compile(r"[A-Za-z0-9=,._:/+-]{0,1024}")


def check_shm(ck: Checker, shm: Mapping[str, Any]) -> dict[str, Any]:
    """/dev/shm facts (``ddpfix_launchenv.shm_facts``): byte counts and the GPU count are numbers in range, the mount
    type and options short words; an ill-formed size is dropped (the check then does not look: not a pass)."""
    out = dict(shm)
    for key, test, why in (
        ("size_bytes", optional(int_in(0, 2**62)), "not a byte count"),
        ("avail_bytes", optional(int_in(0, 2**62)), "not a byte count"),
        ("gpus", optional(int_in(0, 4096)), "not a GPU count"),
        ("fstype", optional(matches(_RDMA_NAME)), "not a file system type"),
        ("options", optional(matches(_MOUNT_OPTS)), "not mount options"),
        ("gpus_source", optional(matches(_PATH)), "not a path"),
        ("path", optional(matches(_PATH)), "not a path"),
    ):
        if not ck.ok(f"shm.{key}", out.get(key), test, why):
            out[key] = None
    if out.get("size_bytes") is None:
        out["avail_bytes"] = None
    return out


def check_shell_env(ck: Checker, se: Mapping[str, Any]) -> dict[str, Any]:
    """Launcher variables set in shell start files (``ddpfix_launchenv.stray_env_facts``): each entry a watched key, a
    printable path, a line number and a one-line value (an entry with any ill-formed field is dropped whole)."""
    out = dict(se)
    kept = []
    for i, a in enumerate(se.get("assignments") or []):
        where = f"shell_env.assignments[{i}]"
        if not isinstance(a, Mapping):
            ck.ok(where, a, lambda _: False, "not an assignment entry")
            continue
        if (ck.ok(f"{where}.key", a.get("key"), matches(_LAUNCH_KEY), "not a launcher variable name")
                and ck.ok(f"{where}.file", a.get("file"), lambda v: matches(_PATH)(v) and "/../" not in f"{v}/",
                          "not an absolute path of printable characters")
                and ck.ok(f"{where}.line", a.get("line"), int_in(1, 10**7), "not a line number")
                and ck.ok(f"{where}.value", a.get("value"),
                          lambda v: isinstance(v, str) and not UNPRINTABLE.search(v) and len(v) <= 4096,
                          "a value with a control character (line break, escape, NUL) or over 4096 characters")):
            kept.append({"file": a["file"], "line": a["line"], "key": a["key"], "value": a["value"],
                         **{k: a.get(k) is True for k in ("dynamic", "conditional", "exported", "secret")}})
    out["assignments"] = kept
    out["files"] = [p for p in se.get("files") or [] if ck.ok("shell_env.files", p, matches(_PATH), "not a path")]
    out["users"] = [u for u in se.get("users") or []
                    if ck.ok("shell_env.users", u, matches(_USER), "not a user name")]
    return out
