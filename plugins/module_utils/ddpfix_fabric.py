"""Read-only GPU fabric facts (InfiniBand, RoCE, EFA) from sysfs and /dev, for ddpfix_node_facts.

Layout read (kernel ABI, Documentation/ABI/stable/sysfs-class-infiniband; drivers/infiniband/core/sysfs.c):

    <sysfs>/class/infiniband/<dev>/ports/<p>/{state,phys_state,rate,link_layer}
    <sysfs>/class/infiniband/<dev>/ports/<p>/pkeys/0
    <sysfs>/class/infiniband/<dev>/ports/<p>/gids/<n>, gid_attrs/types/<n>, gid_attrs/ndevs/<n>
    <sysfs>/class/infiniband/<dev>/device/{numa_node,net/<netdev>,driver -> .../efa}
    <sysfs>/class/infiniband_mad/abi_version, <sysfs>/module/{nvidia_peermem,gdrdrv,nvidia}
    <dev>/infiniband/{uverbs*,umad*}

Pure functions of the paths given (the roots are parameters so tests read recorded trees). When
<sysfs>/class/infiniband does not exist nothing else is read and no command runs (cost ~0 without fabric).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import os
import re
import resource
import shutil

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import run_command

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
PEERMEM_MODULES = ("nvidia_peermem", "gdrdrv")
FI_INFO_PATHS = ("/opt/amazon/efa/bin/fi_info",)
NCCL_VERSION_CODE = (
    "try:\n"
    "    import torch.cuda.nccl as n\n"
    "    v = n.version()\n"
    "except Exception:\n"
    "    v = None\n"
    "print('.'.join(str(x) for x in v) if isinstance(v, tuple) else (v or ''))\n"
)


def _read(path):
    """(text stripped, None) | (None, None) when missing | (None, why) on any other failure."""
    try:
        with open(path) as f:
            return f.read().strip(), None
    except OSError as exc:
        if getattr(exc, "errno", None) in (errno.ENOENT, errno.ENOTDIR):
            return None, None
        return None, "{}: {}".format(path, getattr(exc, "strerror", None) or exc)
    except UnicodeDecodeError as exc:
        return None, f"{path}: not text ({exc})"


def _listdir(path):
    try:
        return sorted(os.listdir(path)), None
    except OSError as exc:
        if getattr(exc, "errno", None) in (errno.ENOENT, errno.ENOTDIR):
            return [], None
        return [], "{}: {}".format(path, getattr(exc, "strerror", None) or exc)


def _numkey(s):
    return (0, int(s)) if s.isdigit() else (1, s)


def parse_state(text):
    """`4: ACTIVE` -> (4, 'ACTIVE'); `5: LinkUp` -> (5, 'LinkUp')."""
    if not text:
        return None, None
    m = re.match(r"\s*(\d+)\s*:\s*(\S.*)$", text)
    if m:
        return int(m.group(1)), m.group(2).strip()
    return None, text.strip()


def parse_rate(text):
    """`200 Gb/sec (4X HDR)` -> 200.0 (Gb/s); None when unparsable."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def ipv4_of_gid(gid):
    """The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), else None."""
    parts = (gid or "").split(":")
    if len(parts) != 8 or [p.lower() for p in parts[:6]] != ["0000"] * 5 + ["ffff"]:
        return None
    try:
        hi, lo = int(parts[6], 16), int(parts[7], 16)
    except ValueError:
        return None
    return f"{hi >> 8}.{hi & 255}.{lo >> 8}.{lo & 255}"


def read_port(pdir, unread):
    def get(rel):
        text, why = _read(os.path.join(pdir, rel))
        if why:
            unread.append(why)
        return text

    state_num, state = parse_state(get("state"))
    phys_num, phys = parse_state(get("phys_state"))
    rate = get("rate")
    gids = []
    names, why = _listdir(os.path.join(pdir, "gids"))
    if why:
        unread.append(why)
    for n in sorted(names, key=_numkey):
        gid = get(os.path.join("gids", n))
        if not gid or gid.lower() == ZERO_GID:
            continue
        gtype, _ = _read(os.path.join(pdir, "gid_attrs", "types", n))
        ndev, _ = _read(os.path.join(pdir, "gid_attrs", "ndevs", n))
        gids.append({"index": int(n) if n.isdigit() else n, "gid": gid.lower(), "type": gtype, "ndev": ndev,
                     "ipv4": ipv4_of_gid(gid)})
    return {
        "state": state, "state_num": state_num, "phys_state": phys, "phys_state_num": phys_num,
        "rate": rate, "rate_gbps": parse_rate(rate), "link_layer": get("link_layer"),
        "pkey0": get(os.path.join("pkeys", "0")), "gids": gids,
    }


def read_devices(sysfs_root):
    """([device], [why]) for every RDMA device under <sysfs_root>/class/infiniband."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    unread = []
    names, why = _listdir(base)
    if why:
        return [], [why]
    devices = []
    for dev in names:
        ddir = os.path.join(base, dev)
        driver = None
        with contextlib.suppress(OSError):
            driver = os.path.basename(os.readlink(os.path.join(ddir, "device", "driver")))
        netdevs, _ = _listdir(os.path.join(ddir, "device", "net"))
        numa, _ = _read(os.path.join(ddir, "device", "numa_node"))
        ports = []
        pnames, why = _listdir(os.path.join(ddir, "ports"))
        if why:
            unread.append(why)
        for p in sorted(pnames, key=_numkey):
            port = read_port(os.path.join(ddir, "ports", p), unread)
            port["port"] = int(p) if p.isdigit() else p
            ports.append(port)
        for port in ports:  # RoCE: the netdevs the GIDs sit on name the device's netdev too
            for g in port["gids"]:
                if g["ndev"] and g["ndev"] not in netdevs:
                    netdevs.append(g["ndev"])
        try:
            numa_node = int(numa) if numa is not None else None
        except ValueError:
            numa_node = None
        devices.append({"name": dev, "driver": driver, "netdevs": netdevs, "numa_node": numa_node, "ports": ports})
    return devices, unread


def memlock_limit():
    """RLIMIT_MEMLOCK of this process (the SSH session's): soft, hard in bytes, -1 for unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    return {"soft": -1 if soft == inf else int(soft), "hard": -1 if hard == inf else int(hard), "source": "ssh session"}


def unit_memlock(units, timeout=5):
    """({unit: {soft, hard, source}}, [why]) from `systemctl show -p LimitMEMLOCK,LimitMEMLOCKSoft UNIT` (bytes, -1
    unlimited): the limit a systemd launcher unit's processes get."""
    out, whys = {}, []
    for unit in units or []:
        rc, text, err = run_command(
            ["systemctl", "show", "-p", "LimitMEMLOCK", "-p", "LimitMEMLOCKSoft", "--", unit], timeout
        )
        if rc != 0:
            whys.append("systemctl show {}: {}".format(unit, (err.strip().splitlines() or [f"rc={rc}"])[-1][:200]))
            continue
        vals = dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)

        def num(v):
            v = (v or "").strip()
            return -1 if v in ("infinity", "") else int(v) if v.isdigit() else None

        hard, soft = num(vals.get("LimitMEMLOCK")), num(vals.get("LimitMEMLOCKSoft") or vals.get("LimitMEMLOCK"))
        if soft is None or hard is None:
            whys.append("systemctl show {}: unparsable LimitMEMLOCK {!r}".format(unit, vals.get("LimitMEMLOCK")))
            continue
        out[unit] = {"soft": soft, "hard": hard, "source": f"systemd unit {unit}"}
    return out, whys


def fi_info_efa(timeout=5, path=None):
    """Run `fi_info -p efa` when libfabric is installed: {ran, ok, providers, error} (ran False: not installed).
    `path`: the fi_info to run (else PATH, then the AWS EFA installer's /opt/amazon/efa/bin)."""
    exe = path or shutil.which("fi_info") or next((p for p in FI_INFO_PATHS if os.access(p, os.X_OK)), None)
    if not exe:
        return {"ran": False, "ok": False, "path": None,
                "error": "fi_info not installed (libfabric / the EFA installer)"}
    rc, out, err = run_command([exe, "-p", "efa"], timeout)
    providers = sorted(set(re.findall(r"^\s*provider:\s*(\S+)", out, re.M)))
    line = next((ln.strip() for ln in (err or out).splitlines() if ln.strip()), "") or f"rc={rc}"
    return {"ran": True, "ok": rc == 0 and "efa" in providers, "path": exe, "providers": providers,
            "error": None if rc == 0 and "efa" in providers else line[:200]}


def nccl_version(python, timeout=20):
    """The NCCL version torch was built with, from `python` (ddp_python: a word or an argv list); (version, why-not)."""
    argv = [python] if isinstance(python, str) else list(python or [])
    if not argv or not all(isinstance(a, str) and a for a in argv):
        return None, "no ddp_python"
    rc, out, err = run_command([*argv, "-c", NCCL_VERSION_CODE], timeout)
    if rc != 0:
        line = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), f"rc={rc}")
        return None, f"{' '.join(argv)}: {line[:200]}"
    v = out.strip().splitlines()[-1] if out.strip() else ""
    return (v if re.match(r"^\d+(\.\d+)*$", v) else None), (None if v else "no version printed")


def collect(sysfs_root="/sys", dev_root="/dev", proc_root="/proc", python=None, run_tools=True, units=(),
            fi_info=None, nccl=None):
    """The node's fabric facts and the sources that could not be read ([{source, reason}]). `nccl`: torch's NCCL
    version already read from `python` (ddpfix_hostenv.torch_info), so the interpreter is not started again."""
    facts = {"sysfs_root": sysfs_root, "present": False, "devices": [], "uverbs": [], "umad": [], "mad_abi": None,
             "memlock": None, "memlock_units": {}, "modules": {}, "gpu": False, "efa": {"devices": [], "fi_info": None},
             "nccl_version": None, "nccl_error": None}
    unread = []
    base = os.path.join(sysfs_root, "class", "infiniband")
    if not os.path.isdir(base):
        if os.path.exists(base) or os.path.lexists(base):
            unread.append({"source": "fabric", "reason": f"{base}: not a directory"})
        return facts, unread
    devices, whys = read_devices(sysfs_root)
    for why in whys:
        unread.append({"source": "fabric", "reason": why})
    facts["devices"] = devices
    facts["present"] = bool(devices)
    if not devices:
        return facts, unread
    ib = os.path.join(dev_root, "infiniband")
    names, why = _listdir(ib)
    if why:
        unread.append({"source": "fabric_dev", "reason": why})
    facts["uverbs"] = [n for n in names if n.startswith("uverbs")]
    facts["umad"] = [n for n in names if n.startswith("umad")]
    facts["mad_abi"], _ = _read(os.path.join(sysfs_root, "class", "infiniband_mad", "abi_version"))
    facts["memlock"] = memlock_limit()
    if units and run_tools:
        facts["memlock_units"], whys = unit_memlock(units)
        unread.extend({"source": "memlock_units", "reason": w} for w in whys)
    facts["modules"] = {m: os.path.isdir(os.path.join(sysfs_root, "module", m)) for m in PEERMEM_MODULES}
    facts["gpu"] = (os.path.isdir(os.path.join(sysfs_root, "module", "nvidia"))
                    or os.path.isdir(os.path.join(proc_root, "driver", "nvidia")))
    efa = [d["name"] for d in devices if d.get("driver") == "efa"]
    facts["efa"]["devices"] = efa
    if efa and run_tools:
        fi = fi_info_efa(path=fi_info)
        facts["efa"]["fi_info"] = fi
        if not fi["ran"]:
            unread.append({"source": "fi_info", "reason": fi["error"]})
    if nccl:
        facts["nccl_version"] = nccl
    elif run_tools and python:
        facts["nccl_version"], facts["nccl_error"] = nccl_version(python)
    return facts, unread
