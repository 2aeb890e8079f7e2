"""Stdlib-only readers for node facts (run on the node inside ddpfix modules; unit-tested on the controller).

Each function turns one machine-readable source into plain data. No checks live here:
the findings are computed by the controller (``ddpfix.rules``) from this data.
"""

from __future__ import absolute_import, division, print_function

import contextlib
import ipaddress
import os
import shlex
import socket
import subprocess

__metaclass__ = type

TIME_DAEMONS = ("chronyd", "ntpd", "ntpsec", "systemd-timesyn", "openntpd", "timesyncd", "ptp4l", "phc2sys")


def _ip(s):
    try:
        return ipaddress.ip_address(str(s))
    except ValueError:
        return None


def network(cidr):
    """`cidr` as an ip_network (host bits allowed), None when empty or not a network."""
    if not cidr:
        return None
    try:
        return ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return None


def resolve(name):
    """Addresses `name` resolves to through NSS (getaddrinfo, like Gloo and c10d), in order, unique."""
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    out = []
    for info in infos:
        addr = info[4][0]
        if addr not in out:
            out.append(addr)
    return out


def cluster_interface(ifaces, cidr, master_ip, override=""):
    """Pick the node's cluster interface and address.

    The cluster network is `cidr`, or else the on-link prefix that contains `master_ip`.
    The interface is the override if given (reported even when absent), else the first
    interface (by index) holding an address inside the cluster network, preferring one that
    is up (flag UP, operstate not DOWN) and then one whose address carries the network's
    prefix over a single-host one (/32, /128: a VIP, a dummy or an isolated link), so that a
    dead or isolated interface ordered before the data NIC does not become the node's cluster
    address.
    """
    net = network(cidr)
    mip = _ip(master_ip)
    if net is None and mip is not None:
        for i in ifaces:
            for a in i.get("addrs", []):
                if a.get("family") != "inet" or not a.get("local"):
                    continue
                cand = ipaddress.ip_network("{}/{}".format(a["local"], a["prefixlen"]), strict=False)
                if mip in cand and cand.prefixlen > 0 and not ipaddress.ip_address(str(a["local"])).is_loopback:
                    net = cand
                    break
            if net is not None:
                break
    result = {"cidr": str(net) if net else None, "ifname": None, "address": None, "source": None}
    if net is None:
        return result

    def addr_in(i):
        for a in i.get("addrs", []):
            ip = _ip(a.get("local"))
            if ip is not None and ip.version == net.version and ip in net:
                return str(ip)
        return None

    if override:
        result["source"] = "override"
        result["ifname"] = override
        for i in ifaces:
            if i.get("name") == override:
                result["address"] = addr_in(i)
        return result
    def rank(i):
        up = "UP" in (i.get("flags") or []) and i.get("operstate") != "DOWN"
        host_only = all(a.get("prefixlen") == net.max_prefixlen for a in i.get("addrs", [])
                        if _ip(a.get("local")) is not None and _ip(a.get("local")) in net)
        return (not up, host_only, i.get("index") or 0)

    for i in sorted((i for i in ifaces if addr_in(i)), key=rank):
        result.update(ifname=i.get("name"), address=addr_in(i), source="cidr")
        return result
    return result


def run_command(argv, timeout=5):
    """(rc, stdout, stderr) of argv, never raising: rc 124 when it timed out, 127 when it could not start."""
    try:
        p = subprocess.run(argv, capture_output=True, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout}s"
    except OSError as exc:
        return 127, "", str(exc)


def parse_hosts_file(text):
    """/etc/hosts as a list of {line, addr, names, text} (comments and blanks dropped)."""
    entries = []
    for n, raw in enumerate(text.splitlines(), 1):
        entry = _hosts_entry(n, raw)
        if entry is not None:
            entries.append(entry)
    return entries


def _hosts_entry(n, raw):
    line = raw.split("#", 1)[0].strip()
    parts = line.split()
    if len(parts) < 2:
        return None
    return {"line": n, "addr": parts[0], "names": parts[1:], "text": raw.rstrip()}


def pack_hosts_entries(entries):
    """`parse_hosts_file`'s entries as the facts module returns them: one string, a line `<number>\t<text>` per
    entry. One value instead of six per line: ansible-core copies and tags every value of a result, in the worker,
    in ansible-playbook and again for each callback, and a fleet's /etc/hosts has a line per node on every node."""
    return "\n".join("{}\t{}".format(int(e["line"]), e["text"]) for e in entries)


def unpack_hosts_lines(packed):
    """The entries of `pack_hosts_entries`' string, parsed as `parse_hosts_file` parses a line (the controller's
    side: what a node sent is text, read here, never trusted to be parsed already); a row that is not
    `<number>\t<text>` is left out."""
    entries = []
    for row in packed.split("\n") if isinstance(packed, str) else ():
        number, sep, raw = row.partition("\t")
        if not sep or not 0 < len(number) < 10 or number.strip("0123456789"):
            continue
        entry = _hosts_entry(int(number), raw)
        if entry is not None:
            entries.append(entry)
    return entries


def relevant_hosts_entries(entries, names, addresses):
    """The /etc/hosts entries the audit uses, so that a node returns O(k) lines, not the whole file (a managed block
    on 2,000 nodes is 2,000 lines on each): those that name one of `names` (the node's own names, the names that
    resolved other than expected) or map one of `addresses` (the peers it dials: each node's address is so
    reported by the nodes that dial it, which is where `remediate` learns the names of a node it cannot reach;
    under --limit also the addresses of nodes outside the play assigned to it)."""
    names, addresses = set(names), set(addresses)
    return [e for e in entries if e["addr"] in addresses or names.intersection(e["names"])]


def parse_env_file(text):
    """KEY=value lines as bash, systemd EnvironmentFile= and docker --env-file read them (simple subset)."""
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            try:
                value = shlex.split(value)[0]
            except ValueError:
                value = value[1:-1]
        values[key] = value
    return values


TRACKING_FIELDS = (
    "ref_id", "ref_name", "stratum", "ref_time", "system_offset", "last_offset", "rms_offset",
    "frequency_ppm", "residual_freq_ppm", "skew_ppm", "root_delay", "root_dispersion",
    "update_interval", "leap_status",
)


def parse_chronyc_tracking(text):
    """`chronyc -c tracking` (CSV) to a dict; None if it cannot be read."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    parts = line.split(",")
    if len(parts) < len(TRACKING_FIELDS):
        return None
    out = dict(zip(TRACKING_FIELDS, parts))
    for k in ("stratum",):
        with contextlib.suppress(ValueError):
            out[k] = int(out[k])
    for k in ("ref_time", "system_offset", "last_offset", "rms_offset", "frequency_ppm", "residual_freq_ppm",
              "skew_ppm", "root_delay", "root_dispersion", "update_interval"):
        with contextlib.suppress(ValueError):
            out[k] = float(out[k])
    out["synchronised"] = out["leap_status"] != "Not synchronised" and out["ref_id"] not in ("00000000", "0")
    return out


def listening_ports(tcp_text, tcp6_text=""):
    """Local TCP ports in LISTEN state (from /proc/net/tcp and tcp6), sorted and unique."""
    ports = set()
    for text in (tcp_text or "", tcp6_text or ""):
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":
                try:
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
                except (IndexError, ValueError):
                    continue
    return sorted(ports)


def running_time_daemons(proc="/proc"):
    """Names of running time-sync daemons, read from /proc/<pid>/comm."""
    found = set()
    try:
        pids = [d for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "comm")) as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in TIME_DAEMONS:
            found.add(comm)
    return sorted(found)


def interface_facts(ip_json, has_device):
    """Interfaces from `ip -j -d addr show`: name, MAC, kind and whether it is a physical NIC.

    kind: linkinfo.info_kind (bridge, bond, vlan, veth, macvlan, ...) or, for devices without one, the link type
    (ether, loopback, ...). physical: the device has a bus device (/sys/class/net/IF/device, `has_device(name)`)
    and no virtual kind. permaddr: the permanent (burned-in) MAC; `ip` prints `permaddr` only when it differs from
    the current address (a bond slave), else the current address is the permanent one for a physical NIC.
    """
    out = []
    for i in ip_json or []:
        name = i.get("ifname")
        info_kind = (i.get("linkinfo") or {}).get("info_kind")
        ether = i.get("link_type") == "ether"
        physical = bool(ether and not info_kind and name and has_device(name))
        out.append({
            "name": name,
            "index": i.get("ifindex"),
            "flags": i.get("flags", []),
            "operstate": i.get("operstate"),
            "mtu": i.get("mtu"),
            "mac": i.get("address") if ether else None,
            "permaddr": (i.get("permaddr") or i.get("address")) if physical else None,
            "kind": info_kind or i.get("link_type"),
            "physical": physical,
            "addrs": [
                {"family": a.get("family"), "local": a.get("local"), "prefixlen": a.get("prefixlen")}
                for a in i.get("addr_info", [])
                if a.get("family") in ("inet", "inet6")
            ],
        })
    return out
