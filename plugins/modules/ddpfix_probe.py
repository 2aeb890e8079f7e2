#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Active probes between cluster nodes: name resolution, routes and TCP connects; stop probe listeners."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_probe
short_description: Probe the cluster network from one node (read-only)
description:
  - C(mode=check) resolves every peer's hostname here (getaddrinfo), asks the kernel for the route to every peer
    address (C(ip -j -batch - route get)) and opens TCP connections, bound to the cluster address and interface,
    to the master port and to a bounded set of peers' probe listeners. Short timeouts; nothing is sent but a TCP handshake.
  - C(mode=stop) stops this node's probe listener (by the PID ddpfix_node_facts recorded).
options:
  mode: {description: check or stop., type: str, choices: [check, stop], default: check}
  bind_address: {description: Local cluster address to bind to., type: str, default: ''}
  bind_ifname: {description: Local cluster interface (SO_BINDTODEVICE)., type: str, default: ''}
  names: {description: Peer hostnames to resolve., type: list, elements: str, default: []}
  route_to: {description: Peer addresses to route., type: list, elements: str, default: []}
  connect: {description: "Targets: list of {name, address, port, kind}.", type: list, elements: dict, default: []}
  timeout: {description: Connect timeout in seconds., type: float, default: 2.0}
  pid: {description: Listener PID to stop (mode=stop)., type: int}
"""

EXAMPLES = r"""
- ddpfix_probe:
    bind_address: 192.168.77.12
    connect: [{name: node1, address: 192.168.77.11, port: 29500, kind: master}]
"""

RETURN = r"""
resolve: {description: "name -> list of addresses", returned: mode=check, type: dict}
routes: {description: "address -> {dev, via, src} or {error}", returned: mode=check, type: dict}
connects: {description: "list of {name, address, port, kind, ok, error}", returned: mode=check, type: list}
"""

import errno
import json
import os
import signal
import socket
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import resolve


def tcp_connect(address, port, bind_address, bind_ifname, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    started = time.time()
    try:
        if bind_ifname:
            try:
                s.setsockopt(socket.SOL_SOCKET, 25, bind_ifname.encode() + b"\0")  # SO_BINDTODEVICE
            except OSError:
                pass
        if bind_address:
            s.bind((bind_address, 0))
        s.connect((address, int(port)))
        return {"ok": True, "error": None, "seconds": round(time.time() - started, 3)}
    except socket.timeout:
        return {"ok": False, "error": "timed out after %.1fs" % timeout, "seconds": round(time.time() - started, 3)}
    except OSError as exc:
        name = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        reason = {"ECONNREFUSED": "connection refused", "EHOSTUNREACH": "no route to host (ICMP host prohibited/unreachable)",
                  "ENETUNREACH": "network unreachable", "ECONNRESET": "connection reset"}.get(name, exc.strerror or str(exc))
        return {"ok": False, "error": "%s (%s)" % (reason, name) if name else reason, "seconds": round(time.time() - started, 3)}
    finally:
        s.close()


def routes(addresses):
    if not addresses:
        return {}
    script = "".join("route get %s\n" % a for a in addresses)
    try:
        p = subprocess.run(["ip", "-j", "-batch", "-"], input=script.encode(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=10)
        out = p.stdout.decode("utf-8", "replace")
        err = p.stderr.decode("utf-8", "replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return dict((a, {"error": str(exc)}) for a in addresses)
    docs = []
    dec = json.JSONDecoder()
    i = 0
    while i < len(out):
        while i < len(out) and out[i].isspace():
            i += 1
        if i >= len(out):
            break
        try:
            obj, i = dec.raw_decode(out, i)
        except ValueError:
            break
        docs.append(obj)
    result = {}
    # ip -batch prints one JSON array per successful command; failures go to stderr.
    for doc in docs:
        for r in doc:
            dst = r.get("dst")
            if dst:
                result[dst] = {"dev": r.get("dev"), "via": r.get("gateway"), "src": r.get("prefsrc"), "type": r.get("type")}
    for a in addresses:
        if a not in result:
            result[a] = {"error": (err.strip().splitlines() or ["no route"])[0]}
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", choices=["check", "stop"], default="check"),
            bind_address=dict(type="str", default=""),
            bind_ifname=dict(type="str", default=""),
            names=dict(type="list", elements="str", default=[]),
            route_to=dict(type="list", elements="str", default=[]),
            connect=dict(type="list", elements="dict", default=[]),
            timeout=dict(type="float", default=2.0),
            pid=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["mode"] == "stop":
        stopped = False
        pid = p.get("pid")
        if pid:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmd = f.read()
                if b"deadline" in cmd:  # only our own listener (its script mentions the deadline)
                    os.kill(pid, signal.SIGTERM)
                    stopped = True
                    # wait (briefly) until it is gone, so its ports are free when this task returns
                    for _ in range(40):
                        try:
                            with open("/proc/%d/stat" % pid) as f:
                                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                                    break
                        except (OSError, IOError, IndexError):
                            break
                        time.sleep(0.05)
            except (OSError, IOError):
                pass
        module.exit_json(changed=False, stopped=stopped)
    resolved = dict((n, resolve(n)) for n in p["names"])
    connects = []
    for t in p["connect"]:
        r = tcp_connect(t["address"], t["port"], p["bind_address"], p["bind_ifname"], p["timeout"])
        r.update(name=t.get("name"), address=t["address"], port=int(t["port"]), kind=t.get("kind", "peer"))
        connects.append(r)
    module.exit_json(changed=False, resolve=resolved, routes=routes(p["route_to"]), connects=connects)


if __name__ == "__main__":
    main()
