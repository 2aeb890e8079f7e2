"""The readers of ddpfix_node_facts: one per fact source, each returning (facts, unread).

`READERS` runs in order, each as `reader(p, got)`: `p` the module's parameters, `got` what the readers before it
returned (keys starting with `_` are passed between readers and never returned as facts). A reader returns the facts
it read (a dict merged into `got`) and what it could not read, as a list of `{source, reason}` (the value kept for
an unread source is a placeholder, never evidence of "nothing there"). Nothing here writes to the node but the
torch reading's cache (ddpfix_hostenv) and the probe's listeners and prober (ddpfix_nodeprobe).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import socket
import time

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import (
    managed_text,
    new_salt,
    outside_keys,
    ownership,
    redact,
    redact_values,
    secret_digests,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fabric import collect as collect_fabric
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_firewall import collect as collect_firewall
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_hostenv import (
    arp_sysctls,
    nofile_limit,
    torch_info,
    unit_nofile,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_launchenv import shm_facts, stray_env_facts
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import (
    cluster_interface,
    listening_ports,
    parse_chronyc_tracking,
    parse_env_file,
    parse_hosts_file,
    relevant_hosts_entries,
    resolve,
    run_command,
    running_time_daemons,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeprobe import (
    command_why,
    finish_probe,
    ip_addr_show,
    probe_facts,
    read_or_why,
    start_probe,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_writable import unwritable

#: The largest env file or cluster file whose text the facts carry (for the dry run's diff).
PREVIEW_MAX = 65536


def _unread(source, reason):
    return [{"source": source, "reason": reason}]


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return default


def sysctl(name):
    v = read("/proc/sys/" + name.replace(".", "/"))
    return v.split() if v is not None else None


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def block_digest(text):
    """SHA-256 (hex) of ddpfix's managed block in `text`, None when it has none."""
    if ownership(text) != "block":
        return None
    return hashlib.sha256(managed_text(text).encode()).hexdigest()


def read_interfaces(p, got):
    """interfaces (`ip -j -d addr show`), the master's address as this node resolves it, the cluster interface."""
    ifaces, _, why = ip_addr_show()
    master_ips = resolve(p["master_address"]) or []
    # None when the master's name does not resolve here (the controller's resolution check says so): never the name
    # itself
    master_ip = next((a for a in master_ips if ":" not in a), master_ips[0]) if master_ips else None
    cluster = cluster_interface(ifaces, p["cluster_cidr"], master_ip, p["socket_ifname"])
    return {"interfaces": ifaces, "master_ip": master_ip, "cluster": cluster}, _unread("interfaces", why) if why else []


def read_names(p, got):
    """hostname, fqdn, machine_id."""
    hostname = socket.gethostname()
    try:
        fqdn = socket.getfqdn()
    except OSError:
        fqdn = hostname
    machine_id = (read("/etc/machine-id") or read("/var/lib/dbus/machine-id") or "").strip()
    return {"hostname": hostname, "fqdn": fqdn, "machine_id": machine_id}, []


def read_sysctls(p, got):
    """sysctl: the ephemeral port range, somaxconn, IPv6, rp_filter and ARP of all/default/each interface."""
    unread = []
    names = [i["name"] for i in got["interfaces"] if i.get("name")]
    port_range = sysctl("net.ipv4.ip_local_port_range")
    somaxconn = sysctl("net.core.somaxconn")
    if not port_range or not somaxconn:
        unread += _unread("sysctl", "/proc/sys/net: net.ipv4.ip_local_port_range or net.core.somaxconn unreadable")
    port_range = port_range or ["32768", "60999"]
    rp_filter = {}  # net.ipv4.conf.{all,default,IFACE}.rp_filter (per network namespace)
    for conf in ["all", "default", *names]:
        text, why = read_or_why(f"/proc/sys/net/ipv4/conf/{conf}/rp_filter")
        if text is None and why is None and conf not in ("all", "default"):
            continue  # an interface without IPv4 configuration (or gone meanwhile)
        try:
            rp_filter[conf] = int(text)
        except (TypeError, ValueError):
            unread += _unread("rp_filter", why or f"/proc/sys/net/ipv4/conf/{conf}/rp_filter: {text!r} is not a number")
            break
    arp, why = arp_sysctls(names)
    if why:
        unread += _unread("arp", why)
    return {
        "sysctl": {
            "ip_local_port_range": [int(port_range[0]), int(port_range[1])],
            "somaxconn": int((somaxconn or ["4096"])[0]),
            "ipv6_disabled": (sysctl("net.ipv6.conf.all.disable_ipv6") or ["0"])[0] == "1",
            "rp_filter": rp_filter,
            "arp": arp,
        },
    }, unread


def read_listening(p, got):
    """listening: the TCP ports listened on (/proc/net/tcp, tcp6)."""
    tcp, why4 = read_or_why("/proc/net/tcp")
    tcp6, _ = read_or_why("/proc/net/tcp6")
    unread = _unread("listening", why4 or "/proc/net/tcp: missing") if tcp is None else []
    return {"listening": listening_ports(tcp or "", tcp6 or "")}, unread


def start_probing(p, got):
    """probe: the listeners and the prober, started before the slower readers so that the dials and accepts overlap
    them (`finish_probing` collects it)."""
    cluster = got["cluster"]
    probe, started = probe_facts(cluster), None
    if p.get("probe") and cluster.get("address"):
        started = start_probe(p["probe"], cluster, p["master_port"] if p["is_master"] else None, got["listening"],
                              p["lock_path"], p["run_id"], got["interfaces"])
        probe.update(started["facts"])
    return {"probe": probe, "_started": started}, []


def read_time(p, got):
    """time: the running time-sync daemons (/proc/*/comm) and `chronyc -c -n tracking`."""
    unread = []
    daemons = running_time_daemons("/proc")
    if os.geteuid() != 0 and not os.path.exists("/proc/1/comm"):
        unread += _unread("processes", f"/proc hides other users' processes from {_user()} (mounted with hidepid)")
    rc, out, err = run_command(["chronyc", "-c", "-n", "tracking"], timeout=3)
    tracking = parse_chronyc_tracking(out) if rc == 0 else None
    if "chronyd" in daemons and rc in (124, 127):  # other failures ("506 Cannot talk to daemon") are chrony's state
        unread += _unread("chronyc", command_why("chronyc -c -n tracking", rc, err))
    return {"time": {"daemons": daemons, "chrony_tracking": tracking}}, unread


def read_hosts_file(p, got):
    """/etc/hosts: its text (kept for `finish_probing`, which returns its entries), the managed block's digest."""
    text, why = read_or_why("/etc/hosts")
    return {
        "_hosts_text": text,
        "hosts_block_sha256": block_digest(text) if text is not None else None,
        "hosts_file_is_mountpoint": os.path.ismount("/etc/hosts"),
    }, _unread("hosts_file", why) if why else []


def read_env_file(p, got):
    """env_file: the ddpfix env file, secret values redacted."""
    text, why = read_or_why(p["env_path"])
    return {"env_file": env_file_facts(p["env_path"], text)}, _unread("env_file", why) if why else []


def read_firewall(p, got):
    """firewall: every layer (its own `unread`, which the facts' `unread` lists after the other sources')."""
    return {"firewall": collect_firewall()}, []


def read_torch(p, got):
    """torch: version, CUDA/ROCm build and NCCL version of ddp_python (none asked for: not collected)."""
    if not p["python"]:  # ddpfix check --local
        return {"torch": None}, []
    torch, why = torch_info(p["python"], p.get("torch_cache_dir", "/run/ddpfix/torch"))
    return {"torch": torch}, _unread("torch", why) if why else []


def read_limits(p, got):
    """limits: the open-file limit of the SSH session and of each launcher unit."""
    units_nofile, whys = unit_nofile(p["launcher_units"])
    unread = [u for w in whys for u in _unread("nofile_units", w)]
    dropins = nofile_dropins(p.get("nofile_path") or NOFILE_PATH, p["launcher_units"])
    return {"limits": {"nofile": nofile_limit(), "nofile_units": units_nofile, "nofile_dropins": dropins}}, unread


#: The open-file limit's drop-ins that `ddpfix remediate` writes (role ddpfix_limits, tasks_from nofile): the
#: pam_limits file (the module's nofile_path, the role's ddpfix_limits_nofile_path) and one per launcher unit.
NOFILE_PATH = "/etc/security/limits.d/90-ddpfix-nofile.conf"
UNIT_NOFILE_PATH = "/etc/systemd/system/{}.d/90-ddpfix-nofile.conf"


def nofile_dropins(path, units):
    """For remediate's dry run, computed on the controller (no check-mode play): the open-file limit's drop-ins as
    they are now (text None: unreadable or over PREVIEW_MAX) and what of them cannot be written (the pre-flight)."""
    unit_files = {u: preview_file(UNIT_NOFILE_PATH.format(u)) for u in units or []}
    return {"pam": preview_file(path), "units": unit_files,
            "unwritable": unwritable([path] + [f["path"] for f in unit_files.values()], [])}


def read_fabric(p, got):
    """fabric: RDMA/EFA devices, memlock, peer memory, the NCCL version (from the torch reading)."""
    fabric, unread = collect_fabric(
        p["sysfs_root"],
        p["dev_root"],
        python=p["python"] or None,
        nccl=(got.get("torch") or {}).get("nccl"),
        units=p["launcher_units"],
        fi_info=p["fi_info"] or None,
    )
    return {"fabric": fabric}, list(unread)


def read_shm(p, got):
    """shm: /dev/shm's size, mount and the GPUs (the controller's /dev/shm size check)."""
    shm, unread = shm_facts()
    return {"shm": shm}, list(unread)


def read_shell_env(p, got):
    """shell_env: launcher variables assigned in the shell start files (the controller's stray-variable check)."""
    shell_env, unread = stray_env_facts()
    return {"shell_env": shell_env}, list(unread)


def finish_probing(p, got):
    """The prober's result; the /etc/hosts entries the audit uses (with a probe, only the relevant lines); the own
    names' resolution."""
    probe, started, cluster, listening = dict(got["probe"]), got["_started"], got["cluster"], got["listening"]
    hostname, fqdn = got["hostname"], got["fqdn"]
    if started is not None:
        probe.update(finish_probe(p["probe"], started, cluster))
    entries, scope = parse_hosts_file(got["_hosts_text"] or ""), "whole"
    if started is not None and "resolve" in probe:  # the deviations are known: only the lines the audit uses
        spec = p["probe"]
        entries = relevant_hosts_entries(
            entries,
            [hostname, fqdn, *probe["resolve"]],
            [t.get("address") for t in spec.get("targets") or []]
            + list(spec.get("hosts_addresses") or [])
            + [cluster.get("address")],
        )
        scope = "relevant"
    if probe["master_port_listening"] is False and p["is_master"] and probe.get("error") is None and started:
        listening = sorted(set(listening) | {p["master_port"]})  # a job took it just now
    return {
        "probe": probe,
        "hosts_file": entries,
        "hosts_file_scope": scope,
        "listening": listening,
        "resolve_self": {hostname: resolve(hostname), fqdn: resolve(fqdn)},
    }, []


#: The readers, in the order they run (the probe starts early, its result is collected last).
READERS = (
    read_interfaces,
    read_names,
    read_sysctls,
    read_listening,
    start_probing,
    read_time,
    read_hosts_file,
    read_env_file,
    read_firewall,
    read_torch,
    read_limits,
    read_fabric,
    read_shm,
    read_shell_env,
    finish_probing,
)


def run_readers(p, readers=READERS, profile=None):
    """(got, unread): every reader's facts and what they could not read, in order. With a `profile` dict, each
    reader's wall time (ms) is put in it under the reader's name."""
    got, unread = {}, []
    for reader in readers:
        t0 = time.monotonic()
        facts, missing = reader(p, got)
        got.update(facts)
        unread.extend(missing)
        if profile is not None:
            profile[reader.__name__] = round((time.monotonic() - t0) * 1000, 1)
    return got, unread


def env_file_facts(path, text):
    """The env file as the audit needs it, secret values redacted (its content never leaves the node)."""
    target = os.path.realpath(path)
    error = None
    if text is None and os.path.lexists(path):
        if os.path.islink(path) and not os.path.exists(target):
            error = f"a symlink to {target}, which does not exist"
        elif os.path.isdir(target):
            error = "a directory"
        else:
            error = "not readable"
    values = parse_env_file(text or "")
    managed = parse_env_file(managed_text(text or ""))
    salt = new_salt()
    return {
        "path": path,
        "target": target if target != path else None,
        "exists": text is not None or os.path.lexists(path),
        "readable": text is not None,
        "error": error,
        # every key as bash `set -a; . FILE` leaves it (the last assignment wins)
        "values": redact_values(values),
        # ddpfix's part: block (or older whole-file format), foreign (a file ddpfix did not write)
        "owner": ownership(text) if text is not None else None,
        "managed": redact_values(managed),
        "outside_keys": outside_keys(text or ""),
        # the redacted values' HMACs under a fresh random salt: the controller compares the planned value's
        # digest with them (the value itself never leaves the node; no precomputed table fits a fresh salt)
        "secrets": {"salt": salt, "values": secret_digests(values, salt), "managed": secret_digests(managed, salt)},
        # for remediate's dry run, computed on the controller from these (no second round trip): the file redacted
        # as the write's diff shows it (secret values ***), the cluster file next to it, and what of the two could
        # not be written (the write pre-flight). Left out over PREVIEW_MAX characters: the dry run then asks the node.
        "text": redact(text) if text is not None and len(text) <= PREVIEW_MAX else None,
        "cluster_file": preview_file(os.path.join(os.path.dirname(path), "cluster.json")),
        "unwritable": unwritable([path, os.path.join(os.path.dirname(path), "cluster.json")], []),
    }


def preview_file(path):
    """A file ddpfix writes whose text is not secret (the cluster file next to the env file: the cluster's view, names
    and addresses; the open-file limit's drop-ins): whether it exists and its text, None when unreadable or over
    PREVIEW_MAX."""
    text, why = read_or_why(path)
    return {"path": path, "exists": os.path.lexists(path),
            "text": text if why is None and text is not None and len(text) <= PREVIEW_MAX else None}
