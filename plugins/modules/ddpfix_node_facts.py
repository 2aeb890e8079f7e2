#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Collect, in one pass and read-only, every host fact the ddpfix audit needs."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_node_facts
short_description: Collect the facts ddpfix needs from one cluster node (read-only)
description:
  - Reads interfaces and addresses (C(ip -j addr)), the node's hostname and how it resolves (C(getaddrinfo), as Gloo and c10d do),
    C(/etc/hosts), the time-sync daemon and C(chronyc -c tracking), the firewall state (firewalld, C(iptables-save), C(nft -j)),
    sysctls (ephemeral port range, somaxconn, IPv6, rp_filter of all/default/each interface), listening TCP ports and an existing ddpfix env file.
  - With I(probe_listen), also starts short-lived TCP listeners (a probe port in the ephemeral range, and the master port on the
    master when it is free) bound to the cluster address. They exit by themselves after I(listen_seconds); the C(ddpfix_probe)
    module stops them earlier. Nothing else on the node is changed. Runs the same in check mode.
options:
  cluster_cidr: {description: The cluster network; empty to derive it from the interface holding I(master_address)., type: str, default: ''}
  master_address: {description: The master's ansible_host (address or name)., type: str, required: true}
  master_port: {description: MASTER_PORT., type: int, default: 29500}
  is_master: {description: Whether this node is rank 0., type: bool, default: false}
  socket_ifname: {description: Inventory override of the socket interface., type: str, default: ''}
  env_path: {description: Path of the ddpfix env file., type: str, default: /etc/ddpfix/ddp.env}
  probe_listen: {description: Start the probe listeners., type: bool, default: true}
  listen_seconds: {description: Upper bound on the listeners' life., type: int, default: 30}
  lock_path: {description: "The node lock (role ddpfix_run): the listener exits as soon as it no longer names I(run_id).", type: str, default: /run/ddpfix.lock}
  run_id: {description: This run's id (empty - the listener lives until I(listen_seconds) or the stop task)., type: str, default: ''}
  sysfs_root: {description: Root of the sysfs tree the fabric facts read (the lab and tests point it at a synthetic tree)., type: str, default: /sys}
  dev_root: {description: Root of the device tree the fabric facts read (C(<dev_root>/infiniband/uverbs*))., type: str, default: /dev}
  python: {description: Interpreter with torch (ddp_python); asked for its NCCL version only when RDMA devices exist., type: str, default: ''}
  fi_info: {description: Path of libfabric's fi_info (empty - PATH, then /opt/amazon/efa/bin)., type: str, default: ''}
  launcher_units: {description: systemd units that launch training; their LimitMEMLOCK is read when RDMA devices exist., type: list, elements: str, default: []}
"""

EXAMPLES = r"""
- name: Collect ddpfix facts
  ddpfix_node_facts:
    master_address: 192.168.77.11
    is_master: true
"""

RETURN = r"""
ansible_facts:
  description: C(ddpfix_node), a dict with keys hostname, fqdn, machine_id, interfaces, cluster, resolve_self, hosts_file,
    sysctl, listening, time, firewall, env_file, fabric, probe, now, errors, unread.
    C(fabric) holds the RDMA devices (ports, state, rate, link layer, P_Key 0, non-zero GIDs with type and netdev),
    uverbs/umad devices, the memlock limit, peer-memory modules, EFA devices and C(fi_info -p efa), the NCCL version.
    C(unread) lists every fact source that could not be read, as C({source, reason}) (sources C(interfaces), C(hosts_file),
    C(sysctl), C(rp_filter), C(listening), C(processes), C(chronyc), C(env_file), C(fabric), C(fabric_dev), C(fi_info), C(memlock_units), and the firewall layers C(firewalld), C(iptables),
    C(ip6tables), C(iptables-legacy), C(nft), C(netfilter)); the value kept for an unread source is a placeholder, never
    evidence of "nothing there".
  returned: always
  type: dict
"""

import errno
import json
import os
import socket
import subprocess
import sys
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import managed_text, outside_keys, ownership, redact_values
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fabric import collect as collect_fabric
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_firewall import collect as collect_firewall
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import (
    cluster_interface,
    interface_facts,
    parse_env_file,
    parse_hosts_file,
    parse_chronyc_tracking,
    listening_ports,
    resolve,
    running_time_daemons,
)

# argv: seconds, lock file, run id, then ADDR:PORT specs ('?ADDR:PORT': optional, skipped when the port is taken:
# the master port, which a real job may bind at any moment). Prints 'ready PORT...' (the ports it holds). Exits at
# the deadline, or as soon as the node lock no longer names its run (the audit ended, or was interrupted).
LISTENER = r"""
import errno, json, os, select, socket, sys, time
deadline = time.time() + float(sys.argv[1])
lock, run_id = sys.argv[2], sys.argv[3]
socks, ports = [], []
for spec in sys.argv[4:]:
    optional = spec.startswith('?')
    addr, port = spec.lstrip('?').rsplit(':', 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only: a live listener still fails the bind
    try:
        s.bind((addr, int(port)))
    except OSError as e:
        s.close()
        if optional and e.errno == errno.EADDRINUSE:
            continue
        raise
    s.listen(128)
    socks.append(s)
    ports.append(port)
sys.stdout.write('ready %s\n' % ' '.join(ports)); sys.stdout.flush(); os.close(1)
def ours():
    if not run_id:
        return True
    try:
        with open(lock) as f:
            return json.load(f).get('run_id') == run_id
    except (OSError, ValueError):
        return False
while time.time() < deadline and ours():
    r, _, _ = select.select(socks, [], [], 0.5)
    for s in r:
        try:
            c, _ = s.accept(); c.close()
        except OSError:
            pass
"""


def run(argv, timeout=5):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ss" % timeout
    except OSError as exc:
        return 127, "", str(exc)


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
    except (OSError, IOError) as exc:
        if getattr(exc, "errno", None) == errno.ENOENT:
            return None, None
        return None, "%s: %s" % (path, getattr(exc, "strerror", None) or exc)
    except UnicodeDecodeError as exc:
        return None, "%s: not text (%s)" % (path, exc)


def sysctl(name):
    v = read("/proc/sys/" + name.replace(".", "/"))
    return v.split() if v is not None else None


def _why(what, rc, err):
    line = next((ln.strip() for ln in (err or "").splitlines() if ln.strip()), "") or "rc=%s" % rc
    if rc == 127:
        line = "not installed (%s)" % line
    elif rc == 124 or "timed out" in line.lower():
        line = "timed out (%s)" % line
    return "%s: %s" % (what, line[:200])


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return "uid %d" % os.geteuid()


def free_port_in(addr, lo, hi, avoid):
    import random

    rnd = random.Random()
    for _ in range(50):
        port = rnd.randint(lo, hi)
        if port in avoid:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((addr, port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    return None


def start_listener(specs, seconds, lock_path="", run_id=""):
    """Start the probe listener; returns (pid, ports it holds, error)."""
    p = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(seconds), lock_path, run_id] + specs,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, close_fds=True,
    )
    line = p.stdout.readline().decode().split()
    if not line or line[0] != "ready":
        err = p.stderr.read().decode("utf-8", "replace").strip().splitlines()
        p.wait()
        return None, [], (err[-1] if err else "listener failed to start")
    return p.pid, [int(x) for x in line[1:]], None


def env_file_facts(path, text):
    """The env file as the audit needs it, secret values redacted (its content never leaves the node)."""
    target = os.path.realpath(path)
    error = None
    if text is None and os.path.lexists(path):
        if os.path.islink(path) and not os.path.exists(target):
            error = "a symlink to %s, which does not exist" % target
        elif os.path.isdir(target):
            error = "a directory"
        else:
            error = "not readable"
    return {
        "path": path,
        "target": target if target != path else None,
        "exists": text is not None or os.path.lexists(path),
        "readable": text is not None,
        "error": error,
        # every key as bash `set -a; . FILE` leaves it (the last assignment wins)
        "values": redact_values(parse_env_file(text or "")),
        # ddpfix's part: block (or older whole-file format), foreign (a file ddpfix did not write)
        "owner": ownership(text) if text is not None else None,
        "managed": redact_values(parse_env_file(managed_text(text or ""))),
        "outside_keys": outside_keys(text or ""),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cluster_cidr=dict(type="str", default=""),
            master_address=dict(type="str", required=True),
            master_port=dict(type="int", default=29500),
            is_master=dict(type="bool", default=False),
            socket_ifname=dict(type="str", default=""),
            env_path=dict(type="str", default="/etc/ddpfix/ddp.env"),
            probe_listen=dict(type="bool", default=True),
            listen_seconds=dict(type="int", default=30),
            lock_path=dict(type="str", default="/run/ddpfix.lock"),
            run_id=dict(type="str", default=""),
            sysfs_root=dict(type="str", default="/sys"),
            dev_root=dict(type="str", default="/dev"),
            python=dict(type="str", default=""),
            launcher_units=dict(type="list", elements="str", default=[]),
            fi_info=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, ansible_facts={"ddpfix_node": collect(module.params)})


def collect(p):
    """The node's facts for these parameters (the module's options); also run in-process by `ddpfix check --local`."""
    errors = []
    unread = []

    def not_read(source, reason):
        errors.append(reason)
        unread.append({"source": source, "reason": reason})

    rc, out, err = run(["ip", "-j", "-d", "addr", "show"])  # -d: linkinfo.info_kind (bridge, bond, vlan, veth...)
    try:
        interfaces = json.loads(out) if rc == 0 else []
    except ValueError:
        interfaces = []
        not_read("interfaces", "ip -j addr show: unparsable JSON")
    if rc != 0:
        not_read("interfaces", _why("ip -j -d addr show", rc, err))
    ifaces = interface_facts(interfaces, lambda name: os.path.exists("/sys/class/net/%s/device" % name))
    master_ips = resolve(p["master_address"]) or []
    master_ip = p["master_address"] if not master_ips else next((a for a in master_ips if ":" not in a), master_ips[0])
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
        text, why = read_or_why("/proc/sys/net/ipv4/conf/%s/rp_filter" % conf)
        if text is None and why is None and conf not in ("all", "default"):
            continue  # an interface without IPv4 configuration (or gone meanwhile)
        try:
            rp_filter[conf] = int(text)
        except (TypeError, ValueError):
            not_read("rp_filter", why or "/proc/sys/net/ipv4/conf/%s/rp_filter: %r is not a number" % (conf, text))
            break
    lo, hi = int(port_range[0]), int(port_range[1])
    tcp, why4 = read_or_why("/proc/net/tcp")
    tcp6, _ = read_or_why("/proc/net/tcp6")
    if tcp is None:
        not_read("listening", why4 or "/proc/net/tcp: missing")
    listening = listening_ports(tcp or "", tcp6 or "")

    daemons = running_time_daemons("/proc")
    if os.geteuid() != 0 and not os.path.exists("/proc/1/comm"):
        not_read("processes", "/proc hides other users' processes from %s (mounted with hidepid)" % _user())
    rc, out, err = run(["chronyc", "-c", "-n", "tracking"], timeout=3)
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
    fabric, fabric_unread = collect_fabric(p["sysfs_root"], p["dev_root"], python=p["python"] or None,
                                           units=p["launcher_units"], fi_info=p["fi_info"] or None)
    for u in fabric_unread:
        not_read(u["source"], u["reason"])
    probe = {"address": cluster.get("address"), "port": None, "master_port_listening": False, "pid": None, "error": None}
    if p["probe_listen"] and cluster.get("address"):
        addr = cluster["address"]
        specs = []
        port = free_port_in(addr, lo, hi, set(listening) | {p["master_port"]})
        if port:
            specs.append("%s:%d" % (addr, port))
        if p["is_master"] and p["master_port"] not in listening:
            specs.append("?%s:%d" % (addr, p["master_port"]))  # skipped if a job binds it meanwhile
        if specs:
            pid, held, error = start_listener(specs, p["listen_seconds"], p["lock_path"], p["run_id"])
            probe.update(pid=pid, error=error)
            if pid:
                probe["port"] = port if port in held else None
                probe["master_port_listening"] = p["master_port"] in held
                if p["is_master"] and not probe["master_port_listening"]:
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
        "hosts_file": parse_hosts_file(hosts_text or ""),
        "hosts_file_is_mountpoint": os.path.ismount("/etc/hosts"),
        "sysctl": {
            "ip_local_port_range": [lo, hi],
            "somaxconn": int((somaxconn or ["4096"])[0]),
            "ipv6_disabled": (sysctl("net.ipv6.conf.all.disable_ipv6") or ["0"])[0] == "1",
            "rp_filter": rp_filter,
        },
        "listening": listening,
        "time": {"daemons": daemons, "chrony_tracking": tracking},
        "firewall": firewall,
        "env_file": env_file_facts(p["env_path"], env_text),
        "fabric": fabric,
        "probe": probe,
        "now": time.time(),
        "errors": errors,
        "unread": unread + list(firewall.get("unread") or []),
    }
    return facts


if __name__ == "__main__":
    main()
