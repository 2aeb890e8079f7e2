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
    sysctls (ephemeral port range, somaxconn, IPv6), listening TCP ports and an existing ddpfix env file.
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
    sysctl, listening, time, firewall, env_file, probe, now.
  returned: always
  type: dict
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfix_firewall import collect as collect_firewall
from ansible.module_utils.ddpfix_nodeinfo import (
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
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return default


def sysctl(name):
    v = read("/proc/sys/" + name.replace(".", "/"))
    return v.split() if v is not None else None


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
        ),
        supports_check_mode=True,
    )
    p = module.params
    errors = []
    rc, out, err = run(["ip", "-j", "-d", "addr", "show"])  # -d: linkinfo.info_kind (bridge, bond, vlan, veth...)
    try:
        interfaces = json.loads(out) if rc == 0 else []
    except ValueError:
        interfaces = []
    if rc != 0:
        errors.append("ip -j -d addr: " + (err.strip() or "failed"))
    ifaces = interface_facts(interfaces, lambda name: os.path.exists("/sys/class/net/%s/device" % name))
    master_ips = resolve(p["master_address"]) or []
    master_ip = p["master_address"] if not master_ips else next((a for a in master_ips if ":" not in a), master_ips[0])
    cluster = cluster_interface(ifaces, p["cluster_cidr"], master_ip, p["socket_ifname"])

    hostname = socket.gethostname()
    try:
        fqdn = socket.getfqdn()
    except OSError:
        fqdn = hostname
    port_range = sysctl("net.ipv4.ip_local_port_range") or ["32768", "60999"]
    lo, hi = int(port_range[0]), int(port_range[1])
    listening = listening_ports(read("/proc/net/tcp", ""), read("/proc/net/tcp6", ""))

    rc, out, _ = run(["chronyc", "-c", "-n", "tracking"], timeout=3)
    tracking = parse_chronyc_tracking(out) if rc == 0 else None
    daemons = running_time_daemons("/proc")

    env_text = read(p["env_path"])
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
        "hosts_file": parse_hosts_file(read("/etc/hosts", "")),
        "hosts_file_is_mountpoint": os.path.ismount("/etc/hosts"),
        "sysctl": {
            "ip_local_port_range": [lo, hi],
            "somaxconn": int((sysctl("net.core.somaxconn") or ["4096"])[0]),
            "ipv6_disabled": (sysctl("net.ipv6.conf.all.disable_ipv6") or ["0"])[0] == "1",
        },
        "listening": listening,
        "time": {"daemons": daemons, "chrony_tracking": tracking},
        "firewall": collect_firewall(),
        "env_file": {"path": p["env_path"], "exists": env_text is not None, "values": parse_env_file(env_text or ""),
                     "sha256": hashlib.sha256(env_text.encode()).hexdigest() if env_text is not None else None},
        "probe": probe,
        "now": time.time(),
        "errors": errors,
    }
    module.exit_json(changed=False, ansible_facts={"ddpfix_node": facts})


if __name__ == "__main__":
    main()
