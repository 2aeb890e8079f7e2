#!/usr/bin/python
"""Collect, in one pass and read-only, every host fact the ddpfix audit needs."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_node_facts
short_description: Collect the facts ddpfix needs from one cluster node (read-only)
description:
  - Reads interfaces and addresses (C(ip -j addr)), the node's hostname and how it resolves (C(getaddrinfo), as Gloo
      and c10d do),
    C(/etc/hosts), the time-sync daemon and C(chronyc -c tracking), the firewall state (firewalld, C(iptables-save),
        C(nft -j)),
    sysctls (ephemeral port range, somaxconn, IPv6, rp_filter of all/default/each interface), listening TCP ports and
        an existing ddpfix env file.
  - With I(lock_holder), takes the ddpfix node lock (I(lock_path), as C(ddpfix_run_lock) does) for the duration of the
    call and releases it before returning (a detached probe keeps it until C(ddpfix_probe) collects the result).
  - "With I(probe), also probes the network in the same call: binds a listener on the probe port the controller chose
    (and the master port on the master when it is free), forks a prober that dials the master port and the ring peers
    in I(probe.targets) with retries until I(probe.wait) seconds and accepts its expected inbound connects, resolves
    the names of I(probe.expected) and routes to their addresses (reporting only deviations), then waits for the
    prober and returns. Only connects from the planned dialers (I(probe.sources)) count toward the expected inbound
    totals; others are closed and listed (C(ignored_inbound)). An inline prober ends when this module's process is
    gone. With I(probe.detach), the prober outlives the call (until every dial and accept is done, the node lock no
    longer names this run, or I(probe.hold) seconds, at most 120) and writes its result into a private directory
    (mkdtemp, mode 0700, in /run) that C(ddpfix_probe) reads and removes when it collects and stops it.
    Nothing else on the node is changed but the cache of the torch reading (I(python)): one small file per
    interpreter in /run/ddpfix/torch (mode 0700, on tmpfs; skipped where it cannot be made private). Runs the same in
    check mode."
  - "Interface reach: when the node has more than one candidate interface (up, not loopback, with an IPv4 address
    that is neither loopback nor link-local), the prober also dials each peer target (the I(probe.targets) of kind
    peer, k of them) once from each candidate other than its own socket's interface, bound to the candidate's device
    (SO_BINDTODEVICE, so routing cannot pick another NIC) and address, after its main dial to that peer ended, with
    the probe's connect timeout; all of a peer's extra dials run at once. That is (candidates - 1) * k more connects
    per node and at most one connect timeout more; a node with one candidate dials nothing more. C(probe.reach)
    holds, per candidate interface, its address, link speed (Mb/s), whether the device binding took effect, and
    the peers it reached (accepted or refused by the peer's host) and failed (timeout, unreachable, no route)."
options:
  cluster_cidr: {description: The cluster network; empty to derive it from the interface holding I(master_address).,
      type: str, default: ''}
  master_address: {description: The master's ansible_host (address or name)., type: str, required: true}
  master_port: {description: MASTER_PORT., type: int, default: 29500}
  is_master: {description: Whether this node is rank 0., type: bool, default: false}
  socket_ifname: {description: Inventory override of the socket interface., type: str, default: ''}
  env_path: {description: Path of the ddpfix env file., type: str, default: /etc/ddpfix/ddp.env}
  lock_path: {description: "The node lock (role ddpfix_run): a prober exits as soon as it no longer names this run.",
      type: str, default: /run/ddpfix.lock}
  lock_holder: {description: "The run (run_id, pid, controller, command, started); empty - no node lock.", type: dict,
      default: {}}
  lock_stale_minutes: {description: "The lease of a remote holder's node lock, minutes (module ddpfix_run_lock).",
      type: int, default: 20}
  probe:
    description:
      - "The probe, as the controller planned it: port (the listener port), self_address (the address peers dial
        here), targets (list of {name, address, port, kind}), expect_peers and expect_master (inbound connects),
        expected ({name: address} of every node), me (this node's name), timeout (one connect), wait (the dial and
        accept deadline, seconds), detach (bool), hold (a detached prober's hard limit, seconds, at most 120) and
        sources ({peer: [{name, address}], master: [...]}, the planned dialers of this node's listeners)."
      - Omitted or null - no probe.
    type: dict
  sysfs_root: {description: Root of the sysfs tree the fabric facts read (the lab and tests point it at a synthetic
      tree)., type: str, default: /sys}
  dev_root: {description: Root of the device tree the fabric facts read (C(<dev_root>/infiniband/uverbs*))., type: str,
      default: /dev}
  python: {description: "Interpreter with torch (ddp_python): started once for torch's version, CUDA build and NCCL
      version (C(torch)), cached in /run/ddpfix/torch by its path and mtime; its NCCL version also serves C(fabric).",
      type: str, default: ''}
  fi_info: {description: Path of libfabric's fi_info (empty - PATH, then /opt/amazon/efa/bin)., type: str, default: ''}
  launcher_units: {description: "systemd units that launch training; their LimitNOFILE is read (C(limits)), their
      LimitMEMLOCK when RDMA devices exist.", type: list, elements: str, default: []}
  probe_only:
    description:
      - Only probe (with I(probe)), reading no more than the interfaces and listening ports the probe needs, and return
        the result as C(probe) (not as facts). The audit's second task when the probes dial the nodes' cluster
        addresses, known from their facts only (I(cluster_cidr) is not the network Ansible reaches the nodes on).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Collect ddpfix facts
  ddpfix_node_facts:
    master_address: 192.168.77.11
    is_master: true
"""

RETURN = r"""
probe:
  description: With I(probe_only), the probe's facts (as C(ddpfix_node.probe) holds them otherwise).
  returned: with I(probe_only)
  type: dict
ansible_facts:
  description: C(ddpfix_node), a dict with keys hostname, fqdn, machine_id, interfaces, cluster, resolve_self,
      hosts_file (with a probe, only the lines naming the node or a name that resolved other than expected, or mapping
      an address it dials or one of I(probe.hosts_addresses), and C(hosts_file_scope) is relevant; else the whole
      file), hosts_file_scope, hosts_block_sha256 (SHA-256 of ddpfix's managed block in /etc/hosts, null without
      one, so that nodes compare blocks without returning them),
    sysctl, listening, time, firewall, env_file, fabric, probe, now, errors, unread.
    C(limits) holds the open-file limit (RLIMIT_NOFILE) of the SSH session and of each launcher unit;
    C(sysctl.arp) net.ipv4.conf.{all,IFACE}.arp_ignore/arp_announce; C(torch) the torch version, CUDA/ROCm build and
    NCCL version of I(python) (C(cached) when read from the cache).
    C(shm) holds the size and free bytes of /dev/shm (statvfs), its mount type and options (mountinfo) and the GPUs
    the NVIDIA driver lists; C(shell_env) the assignments of launcher variables (MASTER_ADDR, MASTER_PORT, NODE_RANK,
    RANK, WORLD_SIZE, LOCAL_RANK, PET_*, *_SOCKET_IFNAME, ...) in /etc/environment, /etc/profile, /etc/bash.bashrc,
    /etc/profile.d/*.sh and the bash start files of root and the login user (file, line, value; read as text, never
    evaluated; secret-looking values as ***).
    C(fabric) holds the RDMA devices (ports, state, rate, link layer, P_Key 0, non-zero GIDs with type and netdev),
    uverbs/umad devices, the memlock limit, peer-memory modules, EFA devices and C(fi_info -p efa), the NCCL version.
    C(unread) lists every fact source that could not be read, as C({source, reason}) (sources C(interfaces),
        C(hosts_file),
    C(sysctl), C(rp_filter), C(listening), C(processes), C(chronyc), C(env_file), C(fabric), C(fabric_dev), C(fi_info),
        C(memlock_units), C(nofile_units), C(arp), C(torch), C(shm), C(shell_env), and the firewall layers C(firewalld),
        C(iptables),
    C(ip6tables), C(iptables-legacy), C(nft), C(netfilter)); the value kept for an unread source is a placeholder, never
    evidence of "nothing there".
  returned: always
  type: dict
"""

import errno
import hashlib
import json
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule

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
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import absent as release_lock
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import present as take_lock
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import (
    cluster_interface,
    interface_facts,
    listening_ports,
    parse_chronyc_tracking,
    parse_env_file,
    parse_hosts_file,
    relevant_hosts_entries,
    resolve,
    run_command,
    running_time_daemons,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_probe import (
    bind_listeners,
    deviations,
    fork_prober,
    proc_start,
    reach_candidates,
    reach_extras,
    result_dir,
    wait_inline,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_writable import unwritable

_T0 = time.monotonic()  # the module's start


def block_digest(text):
    """SHA-256 (hex) of ddpfix's managed block in `text`, None when it has none."""
    if ownership(text) != "block":
        return None
    return hashlib.sha256(managed_text(text).encode()).hexdigest()


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return default


def read_or_why(path):
    """(text, None) or (None, why): a missing file is (None, None), any other failure names its reason."""
    try:
        with open(path) as f:
            return f.read(), None
    except OSError as exc:
        if getattr(exc, "errno", None) == errno.ENOENT:
            return None, None
        return None, "{}: {}".format(path, getattr(exc, "strerror", None) or exc)
    except UnicodeDecodeError as exc:
        return None, f"{path}: not text ({exc})"


def sysctl(name):
    v = read("/proc/sys/" + name.replace(".", "/"))
    return v.split() if v is not None else None


def _why(what, rc, err):
    line = next((ln.strip() for ln in (err or "").splitlines() if ln.strip()), "") or f"rc={rc}"
    if rc == 127:
        line = f"not installed ({line})"
    elif rc == 124 or "timed out" in line.lower():
        line = f"timed out ({line})"
    return f"{what}: {line[:200]}"


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def start_probe(spec, cluster, master_port, listening, lock_path, run_id, ifaces=None):
    """Bind this node's listeners (the probe port the controller chose, on the cluster address and on the address
    the controller dials, when that is another local address; the master port on the master unless a job holds it)
    and fork the prober. With more than one candidate interface among `ifaces` (`reach_candidates`), the prober also
    dials each peer target from each other candidate (the interface reach probe). Returns {facts, pid, fd,
    result_path, start}."""
    addr = cluster["address"]
    port = int(spec.get("port") or 0)
    specs = []
    if port:
        specs.append((addr, port, "peer", False))
        dialled = spec.get("self_address") or ""
        if dialled and dialled != addr and is_local_address(dialled):
            specs.append((dialled, port, "peer", False))
    if master_port and master_port not in listening:
        specs.append((addr, master_port, "master", True))  # skipped if a job binds it meanwhile
    socks, held, error = bind_listeners(specs)
    listener = {
        "port": port if any(k == "peer" for _, _, k in held) else None,
        "master_port_listening": any(k == "master" for _, _, k in held),
        "error": error,
        "mode": "detached" if spec.get("detach") else "inline",
    }
    expect = {}
    if listener["port"]:
        expect["peer"] = int(spec.get("expect_peers") or 0)
    if listener["master_port_listening"]:
        expect["master"] = int(spec.get("expect_master") or 0)
    now = time.time()
    wait = float(spec.get("wait") or 10)
    detach = bool(spec.get("detach"))
    candidates = reach_candidates(ifaces, cluster.get("cidr"))
    main_speed = next((c["speed"] for c in candidates if c["ifname"] == cluster.get("ifname")), None)
    args = dict(
        via=reach_extras(candidates, cluster.get("ifname") or ""),
        main_speed=main_speed,
        targets=list(spec.get("targets") or []),
        expect=expect,
        bind_address=addr,
        bind_ifname=cluster.get("ifname") or "",
        timeout=float(spec.get("timeout") or 2.0),
        dial_until=now + (float(spec.get("hold") or 120) if detach else wait),
        # a listener outlives the dials by one connect timeout and a margin: a peer that started a little
        # later still finds it up during its last attempt
        hold_until=now + (float(spec.get("hold") or 120) if detach else wait + float(spec.get("timeout") or 2.0) + 3),
        lock_path=lock_path,
        run_id=run_id,
        # only connects from the planned dialers count toward `expect` (a plan without them: every source)
        sources=spec.get("sources") if isinstance(spec.get("sources"), dict) else None,
    )
    result_path = None
    if detach:  # a private directory (mkdtemp, 0700) in /run, else the system's temporary directory
        result_path = result_dir(os.path.dirname(lock_path) or "/run")
    pid, fd = fork_prober(socks, args, result_path)
    start = proc_start(pid)
    if detach:
        listener.update(pid=pid, start=start, result_path=result_path)
    return {"facts": listener, "pid": pid, "fd": fd, "detach": detach}


def finish_probe(spec, started, cluster, me):
    """Resolution and route deviations, then (inline) the prober's result."""
    out = deviations(spec.get("expected") or {}, spec.get("me") or "", cluster.get("ifname") or "")
    if not started["detach"]:
        result, error = wait_inline(started["pid"], started["fd"])
        if result is None:
            out["error"] = error
        else:
            out.update(result)
    return out


def is_local_address(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((addr, 0))
        return True
    except (OSError, ValueError):
        return False
    finally:
        s.close()


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
        "cluster_file": cluster_file_facts(os.path.join(os.path.dirname(path), "cluster.json")),
        "unwritable": unwritable([path, os.path.join(os.path.dirname(path), "cluster.json")], []),
    }


#: The largest env file or cluster file whose text the facts carry (for the dry run's diff).
PREVIEW_MAX = 65536


def cluster_file_facts(path):
    """The cluster file ddpfix writes next to the env file: whether it exists and its text (not secret: the cluster's
    view, names and addresses), None when unreadable or over PREVIEW_MAX."""
    text, why = read_or_why(path)
    return {"path": path, "exists": os.path.lexists(path),
            "text": text if why is None and text is not None and len(text) <= PREVIEW_MAX else None}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cluster_cidr=dict(type="str", default=""),
            master_address=dict(type="str", required=True),
            master_port=dict(type="int", default=29500),
            is_master=dict(type="bool", default=False),
            socket_ifname=dict(type="str", default=""),
            env_path=dict(type="str", default="/etc/ddpfix/ddp.env"),
            lock_path=dict(type="str", default="/run/ddpfix.lock"),
            lock_holder=dict(type="dict", default={}),
            lock_stale_minutes=dict(type="int", default=20),
            probe=dict(type="dict", default=None),
            sysfs_root=dict(type="str", default="/sys"),
            dev_root=dict(type="str", default="/dev"),
            python=dict(type="str", default=""),
            launcher_units=dict(type="list", elements="str", default=[]),
            fi_info=dict(type="str", default=""),
            probe_only=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    holder = p["lock_holder"] or {}
    p["run_id"] = holder.get("run_id") or ""
    detached = bool((p["probe"] or {}).get("detach"))
    lock = None
    if holder.get("run_id"):
        # read-only: where /run cannot be written the facts are still read (required=False), without a lock
        lock, failure = take_lock(p["lock_path"], holder, max(0, p["lock_stale_minutes"]) * 60, required=False)
        if failure:
            module.fail_json(**failure)
        if lock.get("unlocked"):  # no lock file to watch: the prober ends by its own deadlines only
            p["run_id"] = ""
    try:
        out = {"probe": probe_only(p)} if p["probe_only"] else {"ansible_facts": {"ddpfix_node": collect(p)}}
        ef = out.get("ansible_facts", {}).get("ddpfix_node", {}).get("env_file")
        if lock is not None and lock.get("unlocked") and isinstance(ef, dict):  # remediate's pre-flight: refused
            ef["unwritable"] = dict(ef.get("unwritable") or {}, **{
                p["lock_path"]: "the node lock cannot be taken: {}".format(lock["unlocked"])})
    finally:
        if lock is not None and not detached:  # a detached prober's collect task releases it
            release_lock(p["lock_path"], holder)
    module.exit_json(changed=False, lock=lock, **out)


def probe_only(p):
    """The probe alone (option probe_only): the interfaces and listening ports it needs, then the probe, as
    `collect` runs it (its result is what `collect` returns as the facts' `probe`)."""
    rc, out, err = run_command(["ip", "-j", "-d", "addr", "show"])
    try:
        interfaces = json.loads(out) if rc == 0 else []
    except ValueError:
        interfaces = []
    ifaces = interface_facts(interfaces, lambda name: os.path.exists(f"/sys/class/net/{name}/device"))
    cluster = cluster_interface(ifaces, p["cluster_cidr"], p["master_address"], p["socket_ifname"])
    probe = {"address": cluster.get("address"), "port": None, "master_port_listening": False, "pid": None,
             "error": None if rc == 0 else _why("ip -j -d addr show", rc, err)}
    if not p.get("probe") or not cluster.get("address"):
        return probe
    tcp, _ = read_or_why("/proc/net/tcp")
    tcp6, _ = read_or_why("/proc/net/tcp6")
    started = start_probe(p["probe"], cluster, p["master_port"] if p["is_master"] else None,
                          listening_ports(tcp or "", tcp6 or ""), p["lock_path"], p["run_id"], ifaces)
    probe.update(started["facts"])
    probe.update(finish_probe(p["probe"], started, cluster, p["run_id"]))
    return probe


def collect(p):
    """The node's facts for these parameters (the module's options); also run in-process by `ddpfix check --local`."""
    errors = []
    unread = []

    def not_read(source, reason):
        errors.append(reason)
        unread.append({"source": source, "reason": reason})

    # -d: linkinfo.info_kind (bridge, bond, vlan, veth...)
    rc, out, err = run_command(["ip", "-j", "-d", "addr", "show"])
    try:
        interfaces = json.loads(out) if rc == 0 else []
    except ValueError:
        interfaces = []
        not_read("interfaces", "ip -j addr show: unparsable JSON")
    if rc != 0:
        not_read("interfaces", _why("ip -j -d addr show", rc, err))
    ifaces = interface_facts(interfaces, lambda name: os.path.exists(f"/sys/class/net/{name}/device"))
    master_ips = resolve(p["master_address"]) or []
    # None when the master's name does not resolve here (hosts.peer-unresolvable says so): never the name itself
    master_ip = next((a for a in master_ips if ":" not in a), master_ips[0]) if master_ips else None
    cluster = cluster_interface(ifaces, p["cluster_cidr"], master_ip, p["socket_ifname"])

    hostname = socket.gethostname()
    try:
        fqdn = socket.getfqdn()
    except OSError:
        fqdn = hostname
    port_range = sysctl("net.ipv4.ip_local_port_range")
    somaxconn = sysctl("net.core.somaxconn")
    if not port_range or not somaxconn:
        not_read("sysctl", "/proc/sys/net: net.ipv4.ip_local_port_range or net.core.somaxconn unreadable")
    port_range = port_range or ["32768", "60999"]
    rp_filter = {}  # net.ipv4.conf.{all,default,IFACE}.rp_filter (per network namespace)
    for conf in ["all", "default"] + [i["name"] for i in ifaces if i.get("name")]:
        text, why = read_or_why(f"/proc/sys/net/ipv4/conf/{conf}/rp_filter")
        if text is None and why is None and conf not in ("all", "default"):
            continue  # an interface without IPv4 configuration (or gone meanwhile)
        try:
            rp_filter[conf] = int(text)
        except (TypeError, ValueError):
            not_read("rp_filter", why or f"/proc/sys/net/ipv4/conf/{conf}/rp_filter: {text!r} is not a number")
            break
    arp, why = arp_sysctls([i["name"] for i in ifaces if i.get("name")])
    if why:
        not_read("arp", why)
    lo, hi = int(port_range[0]), int(port_range[1])
    tcp, why4 = read_or_why("/proc/net/tcp")
    tcp6, _ = read_or_why("/proc/net/tcp6")
    if tcp is None:
        not_read("listening", why4 or "/proc/net/tcp: missing")
    listening = listening_ports(tcp or "", tcp6 or "")
    # the prober starts first, so the dials and accepts overlap the rest of the collection
    probe = {
        "address": cluster.get("address"),
        "port": None,
        "master_port_listening": False,
        "pid": None,
        "error": None,
    }
    started = None
    if p.get("probe") and cluster.get("address"):
        started = start_probe(
            p["probe"], cluster, p["master_port"] if p["is_master"] else None, listening, p["lock_path"], p["run_id"],
            ifaces,
        )
        probe.update(started["facts"])

    daemons = running_time_daemons("/proc")
    if os.geteuid() != 0 and not os.path.exists("/proc/1/comm"):
        not_read("processes", f"/proc hides other users' processes from {_user()} (mounted with hidepid)")
    rc, out, err = run_command(["chronyc", "-c", "-n", "tracking"], timeout=3)
    tracking = parse_chronyc_tracking(out) if rc == 0 else None
    if "chronyd" in daemons and rc in (124, 127):  # other failures ("506 Cannot talk to daemon") are chrony's state
        not_read("chronyc", _why("chronyc -c -n tracking", rc, err))

    hosts_text, why = read_or_why("/etc/hosts")
    if why:
        not_read("hosts_file", why)
    env_text, why = read_or_why(p["env_path"])
    if why:
        not_read("env_file", why)
    firewall = collect_firewall()
    torch, why = None, None  # no interpreter asked for (ddpfix check --local): torch not collected
    if p["python"]:
        torch, why = torch_info(p["python"], p.get("torch_cache_dir", "/run/ddpfix/torch"))
    if why:
        not_read("torch", why)
    units_nofile, whys = unit_nofile(p["launcher_units"])
    for w in whys:
        not_read("nofile_units", w)
    fabric, fabric_unread = collect_fabric(
        p["sysfs_root"],
        p["dev_root"],
        python=p["python"] or None,
        nccl=(torch or {}).get("nccl"),
        units=p["launcher_units"],
        fi_info=p["fi_info"] or None,
    )
    for u in fabric_unread:
        not_read(u["source"], u["reason"])
    shm, shm_unread = shm_facts()  # host.shm-small
    shell_env, shell_unread = stray_env_facts()  # env.stray
    for u in shm_unread + shell_unread:
        not_read(u["source"], u["reason"])
    if started is not None:
        probe.update(finish_probe(p["probe"], started, cluster, p["run_id"]))
    hosts_entries, hosts_scope = parse_hosts_file(hosts_text or ""), "whole"
    if started is not None and "resolve" in probe:  # the deviations are known: only the lines the audit uses
        spec = p["probe"]
        hosts_entries = relevant_hosts_entries(
            hosts_entries,
            [hostname, fqdn, *probe["resolve"]],
            [t.get("address") for t in spec.get("targets") or []]
            + list(spec.get("hosts_addresses") or [])
            + [cluster.get("address")],
        )
        hosts_scope = "relevant"
    if probe["master_port_listening"] is False and p["is_master"] and probe.get("error") is None and started:
        listening = sorted(set(listening) | {p["master_port"]})  # a job took it just now

    facts = {
        "schema": 1,
        "hostname": hostname,
        "fqdn": fqdn,
        "machine_id": (read("/etc/machine-id") or read("/var/lib/dbus/machine-id") or "").strip(),
        "interfaces": ifaces,
        "cluster": cluster,
        "master_ip": master_ip,
        "resolve_self": {hostname: resolve(hostname), fqdn: resolve(fqdn)},
        "hosts_file": hosts_entries,
        "hosts_file_scope": hosts_scope,
        "hosts_block_sha256": block_digest(hosts_text) if hosts_text is not None else None,
        "hosts_file_is_mountpoint": os.path.ismount("/etc/hosts"),
        "sysctl": {
            "ip_local_port_range": [lo, hi],
            "somaxconn": int((somaxconn or ["4096"])[0]),
            "ipv6_disabled": (sysctl("net.ipv6.conf.all.disable_ipv6") or ["0"])[0] == "1",
            "rp_filter": rp_filter,
            "arp": arp,
        },
        "limits": {"nofile": nofile_limit(), "nofile_units": units_nofile},
        "torch": torch,
        "listening": listening,
        "time": {"daemons": daemons, "chrony_tracking": tracking},
        "firewall": firewall,
        "env_file": env_file_facts(p["env_path"], env_text),
        "fabric": fabric,
        "shm": shm,
        "shell_env": shell_env,
        "probe": probe,
        "now": time.time(),
        # seconds from the module's start to the clock reading above (the controller narrows its task window by it)
        "now_elapsed": round(time.monotonic() - _T0, 3),
        "errors": errors,
        "unread": unread + list(firewall.get("unread") or []),
    }
    return facts


if __name__ == "__main__":
    main()
