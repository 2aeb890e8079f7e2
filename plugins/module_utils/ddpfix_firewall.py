# -*- coding: utf-8 -*-
"""Firewall facts and evaluation for ddpfix (stdlib only, Python >= 3.6).

Two halves:

* ``collect(run=None)`` runs on the node (read-only, short timeouts, missing
  binaries tolerated) and returns a JSON-serialisable *state* dict;
* ``evaluate`` / ``ports_blocked`` / ``world_open`` / ``sample_ports`` are pure
  functions over that dict (no I/O) and run on the node or the controller.

State contract (``"schema": "ddpfix.firewall/v1"``)::

    {
      "schema": "ddpfix.firewall/v1",
      "firewalld": None | {            # None: not installed or not running
          "running": True, "version": "1.3.3", "source": "dbus" | "cli",
          "default_zone": "public", "allow_zone_drifting": False,
          "zones": {NAME: {"target": "default"|"ACCEPT"|"DROP"|"%%REJECT%%",
                           "interfaces": [...], "sources": [...],
                           "services": [...], "ports": [["29500", "tcp"], ...],
                           "protocols": [...], "source_ports": [[p, proto]],
                           "rich_rules": ["rule family=...", ...],
                           "ingress_priority": int}},   # active zones + default
          "services": {NAME: {"ports": [[p, proto]], "protocols": [...],
                              "includes": [...]}}},
      "iptables": str | None,          # `iptables-save` text (all tables)
      "iptables_legacy": str | None,   # `iptables-legacy-save` when both exist
      "ip6tables": str | None,         # `ip6tables-save` text
      "nft": {"nftables": [...]} | None,   # `nft -j list ruleset`
      "nft_text": str | None,          # `nft -a list ruleset` (rule text for evidence)
      "errors": ["..."],
      "unread": [{"source": "firewalld" | "iptables" | "ip6tables" | "iptables-legacy" | "nft",
                  "reason": "iptables-save: ... Permission denied (you must be root)"}]
    }

``unread`` lists every layer that could not be read (no permission, timeout, a read
that failed although the layer is there): its key above is then None, which must
never be taken as "no rules". A tool that is not installed is not unread (nothing
could have configured that layer), except when neither ``iptables-save`` nor ``nft``
exists: then netfilter as a whole is unread.

Evaluation models one NEW TCP (or UDP) packet (conntrack state NEW, a SYN,
not DNATed, unicast to a local address) from ``src`` arriving on ``iface``
to local port ``dport``. Netfilter semantics: every active layer / base chain
must accept; the first drop/reject is final. Layers: the firewalld zone model
(firewalld's own nft tables / iptables chains are then skipped), iptables
(filter table, INPUT and the user chains it reaches), nftables (base chains
of type filter on the prerouting and input hooks, by hook then priority;
tables created by iptables-nft are skipped when iptables-save was evaluated).

Unknowns are conservative and always reported: a rule containing a match we
cannot decide (ipsets, limits, recent, marks, source ports, destination
addresses when ``dst`` is not given, ``fib``, ``xt`` expressions, ...) is
treated as NOT matching and listed in ``notes`` / the evidence. ``iface=None``
means "some non-loopback interface": ``-i lo`` does not match, ``! -i lo``
does, any other interface match is unknown; firewalld then uses the source
zone or the default zone.
"""
from __future__ import absolute_import, division, print_function

import ipaddress
import json
import os
import re
import shlex
import subprocess

SCHEMA = "ddpfix.firewall/v1"
TEST_NET_SOURCES = ("203.0.113.7", "198.51.100.7", "192.0.2.7", "2001:db8::7")
_PROTO_NUM = {"tcp": 6, "udp": 17, "icmp": 1, "ipv6-icmp": 58, "icmpv6": 58,
              "sctp": 132, "udplite": 136, "dccp": 33, "gre": 47, "esp": 50, "ah": 51}
_IPT_CONTINUE = {"LOG", "NFLOG", "ULOG", "AUDIT", "MARK", "CONNMARK", "CT", "TRACE",
                 "CLASSIFY", "SET", "TCPMSS", "CHECKSUM", "TEE", "SECMARK", "CONNSECMARK"}
_NFT_CONTINUE = {"counter", "log", "meta", "ct", "mangle", "notrack", "set", "quota",
                 "dup", "comment", "synproxy", "continue"}


# --------------------------------------------------------------------------
# collection (runs on the node)
# --------------------------------------------------------------------------

def _default_run(argv, timeout=10):
    """Run argv; return (rc, stdout, stderr). rc 127 = not found, 124 = timeout."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env)
    except OSError as exc:
        return 127, "", str(exc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return 124, "", "timeout after %ss" % timeout
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _which(name):
    # type: (str) -> str
    for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]:
        p = os.path.join(d, name)
        if d and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return name  # let run() report "not found"


def collect(run=None, use_dbus=True, proc="/proc"):
    """Read the node's live firewall state (read-only). Returns the state dict.

    ``run(argv, timeout=...) -> (rc, stdout, stderr)``; default uses subprocess.
    ``use_dbus=False`` forces the firewall-cmd text fallback. ``proc``: where to look for a firewalld process.
    """
    run = run or _default_run
    state = {"schema": SCHEMA, "firewalld": None, "iptables": None, "iptables_legacy": None,
             "ip6tables": None, "nft": None, "nft_text": None, "errors": [], "unread": []}
    errors, unread = state["errors"], state["unread"]
    missing = []

    def text(argv, what, source=None):
        rc, out, err = run([_which(argv[0])] + argv[1:], timeout=10)
        if rc == 0:
            return out
        if rc == 127:
            if source:
                missing.append(argv[0])
            return None
        line = _first_line(err or out) or "rc=%s" % rc
        reason = line if line.startswith(argv[0]) else "%s: %s" % (what, line)
        errors.append("%s: rc=%s %s" % (what, rc, (err or out).strip()[:200]))
        if source:
            unread.append({"source": source, "reason": reason})
        return None

    rc, out, err = run([_which("firewall-cmd"), "--state"], timeout=10)
    if rc == 0 and "running" in out and "not running" not in out:
        try:
            state["firewalld"] = _collect_firewalld(run, use_dbus, errors)
        except Exception as exc:  # never fail the whole fact gathering
            errors.append("firewalld: %s" % exc)
            unread.append({"source": "firewalld", "reason": "firewalld runs but its configuration could not be read: %s"
                           % _first_line(str(exc))})
    elif rc not in (127, 252) and _process_running("firewalld", proc):
        # 252 = not running; a firewalld process that firewall-cmd cannot ask (D-Bus denied, timeout) is unread
        reason = "firewall-cmd --state: %s" % (_first_line(err or out) or "rc=%s" % rc)
        errors.append(reason)
        unread.append({"source": "firewalld", "reason": reason})
    ipt = text(["iptables-save"], "iptables-save", "iptables")
    state["iptables"] = ipt
    if ipt is not None and "iptables-legacy tables present" in ipt:
        state["iptables_legacy"] = text(["iptables-legacy-save"], "iptables-legacy-save", "iptables-legacy")
    state["ip6tables"] = text(["ip6tables-save"], "ip6tables-save", "ip6tables")
    nj = text(["nft", "-j", "list", "ruleset"], "nft -j list ruleset", "nft")
    if nj is not None:
        try:
            state["nft"] = json.loads(nj) if nj.strip() else {"nftables": []}
        except ValueError as exc:
            errors.append("nft -j: unparsable JSON (%s)" % exc)
            unread.append({"source": "nft", "reason": "nft -j list ruleset: unparsable JSON (%s)" % exc})
        state["nft_text"] = text(["nft", "-a", "list", "ruleset"], "nft -a")
    if "iptables-save" in missing and "nft" in missing:
        unread.append({"source": "netfilter", "reason": "neither iptables-save nor nft is installed"})
    return state


def _first_line(text):
    """The most telling line of a tool's error output (the first non-empty one), at most 200 characters."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _process_running(comm, proc="/proc"):
    """Whether a process named ``comm`` (``/proc/PID/comm``) is visible."""
    try:
        pids = [d for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "comm")) as fh:
                if fh.read().strip() == comm:
                    return True
        except (IOError, OSError):
            continue
    return False


def _norm_zone(d):
    """Zone settings (D-Bus dict or parsed text) -> the contract's zone dict."""
    target = d.get("target") or "default"
    pairs = lambda v: [[str(p), str(q)] for p, q in (v or [])]  # noqa: E731
    return {"target": "default" if "{chain}" in target else target,  # DEFAULT_ZONE_TARGET
            "interfaces": list(d.get("interfaces") or []), "sources": list(d.get("sources") or []),
            "services": list(d.get("services") or []), "ports": pairs(d.get("ports")),
            "protocols": list(d.get("protocols") or []), "source_ports": pairs(d.get("source_ports")),
            "rich_rules": list(d.get("rules_str") or d.get("rich_rules") or []),
            "ingress_priority": int(d.get("ingress_priority") or 0)}


def _collect_firewalld(run, use_dbus, errors):
    fw = {"running": True, "version": None, "source": "dbus" if use_dbus else "cli",
          "default_zone": None, "allow_zone_drifting": False, "zones": {}, "services": {}}
    try:
        with open("/etc/firewalld/firewalld.conf") as fh:
            m = re.search(r"^\s*AllowZoneDrifting\s*=\s*(\S+)", fh.read(), re.M)
            fw["allow_zone_drifting"] = bool(m and m.group(1).lower() in ("yes", "true"))
    except (IOError, OSError):
        pass
    get_service = None
    if use_dbus:
        try:
            get_service = _collect_firewalld_dbus(fw)
        except Exception as exc:  # ImportError, DBusException, FirewallError
            errors.append("firewalld D-Bus client unavailable, using firewall-cmd: %s" % exc)
            fw.update(zones={}, source="cli")
    get_service = get_service or _collect_firewalld_cli(fw, run)
    # services used by the zones directly or in rich rules, with their includes
    todo = set()
    for z in fw["zones"].values():
        todo.update(z["services"])
        for r in z["rich_rules"]:
            todo.update(re.findall(r'service name="?([^"\s]+)', r))
    todo = sorted(todo)
    while todo:
        name = todo.pop()
        if name in fw["services"]:
            continue
        try:
            s = get_service(name)
        except Exception as exc:
            errors.append("firewalld service %r: %s" % (name, exc))
            continue
        fw["services"][name] = {"ports": [[str(p), str(q)] for p, q in s.get("ports") or []],
                                "protocols": list(s.get("protocols") or []),
                                "includes": list(s.get("includes") or [])}
        todo.extend(fw["services"][name]["includes"])
    return fw


def _collect_firewalld_dbus(fw):
    """Fill fw from python3-firewall's FirewallClient (as linux-system-roles/firewall does)."""
    from firewall.client import FirewallClient
    client = FirewallClient()
    if not client.connected:
        raise RuntimeError("not connected")
    fw["version"] = str(client.get_property("version"))
    fw["default_zone"] = str(client.getDefaultZone())
    for name in sorted(set(client.getActiveZones() or {}) | {fw["default_zone"]}):
        fw["zones"][name] = _norm_zone(client.getZoneSettings(name).getSettingsDict())
    return lambda name: client.getServiceSettings(name).getSettingsDict()


def parse_list_all(text):
    """Parse `firewall-cmd --list-all-zones` / `--zone=Z --list-all` output -> {zone: dict}
    (contract zone dicts plus "_flags", e.g. "default, active")."""
    zones, cur, key = {}, None, None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            name = line.split()[0]
            cur, key = zones.setdefault(name, {"_flags": line[len(name):].strip(" ()")}), None
        elif cur is not None and line.startswith("\t") and key == "rich rules":
            cur[key].append(line.strip())
        elif cur is not None and ":" in line:
            key, _, val = line.strip().partition(":")
            cur[key] = [] if key == "rich rules" else val.split()
    out = {}
    for name, z in zones.items():
        pp = lambda k: [p.split("/", 1) for p in z.get(k) or [] if "/" in p]  # noqa: E731
        d = dict(z, ports=pp("ports"), source_ports=pp("source-ports"), rich_rules=z.get("rich rules"),
                 target=(z.get("target") or [None])[0],
                 ingress_priority=(z.get("ingress-priority") or [0])[0])
        out[name] = dict(_norm_zone(d), _flags=z["_flags"])
    return out


def _collect_firewalld_cli(fw, run):
    """Fill fw from firewall-cmd text output; returns the service getter."""
    def fc(*args):
        rc, out, err = run([_which("firewall-cmd")] + list(args), timeout=15)
        if rc != 0:
            raise RuntimeError("firewall-cmd %s: rc=%s %s" % (" ".join(args), rc, err.strip()[:200]))
        return out

    def service(name):  # `firewall-cmd --info-service=NAME`: "  ports: 80/tcp" lines
        info = dict(line.strip().partition(":")[::2] for line in fc("--info-service=" + name).splitlines()[1:])
        return {"ports": [p.split("/", 1) for p in info.get("ports", "").split() if "/" in p],
                "protocols": info.get("protocols", "").split(), "includes": info.get("includes", "").split()}
    fw["version"] = fc("--version").strip()
    fw["default_zone"] = fc("--get-default-zone").strip()
    for name, z in parse_list_all(fc("--list-all-zones")).items():
        if "active" in z.pop("_flags") or name == fw["default_zone"] or z["interfaces"] or z["sources"]:
            fw["zones"][name] = z
    return service


# --------------------------------------------------------------------------
# packet & helpers
# --------------------------------------------------------------------------

class _Pkt(object):
    """The modelled packet: NEW, SYN, unicast to a local address, not DNATed."""

    def __init__(self, src, dport, iface=None, proto="tcp", dst=None):
        self.src = ipaddress.ip_address(u"%s" % src)
        self.dst = ipaddress.ip_address(u"%s" % dst) if dst else None
        self.family = self.src.version
        self.dport = int(dport)
        self.proto = (proto or "tcp").lower()
        self.iface = iface


def _in_net(addr, spec):
    """addr (ip_address) in spec ('a.b.c.d[/n]'); False on family mismatch, None if unparsable."""
    try:
        net = ipaddress.ip_network(u"%s" % spec, strict=False)
    except ValueError:
        return None
    return net.version == addr.version and addr in net


def _iface_match(pattern, iface, plus="+"):
    """Interface name match with a trailing wildcard ('+' iptables/firewalld, '*' nft)."""
    if iface is None:
        return False if pattern.rstrip(plus) == "lo" else None
    if pattern.endswith(plus):
        return iface.startswith(pattern[:-1])
    return iface == pattern


def _in_ports(port, spec, sep):
    """port in '80' / '1000<sep>2000' (sep ':' iptables, '-' firewalld)."""
    a, s, b = str(spec).partition(sep)
    try:
        lo = int(a) if a else 0
        hi = int(b) if s and b else (65535 if s else lo)
    except ValueError:
        return None
    return lo <= port <= hi


def _tri_and(values):
    """Three-valued AND: False if any False, else None if any None, else True."""
    if False in values:
        return False
    return None if None in values else True


# --------------------------------------------------------------------------
# firewalld zone model
# --------------------------------------------------------------------------

def _parse_rich(rule):
    """'rule family="ipv4" source NOT address="…" port port="…" protocol="tcp" accept' -> dict
    {"family", "priority", "elements": [{"kind", "not", attr...}], "action", "limit", "raw"};
    None if the string cannot be tokenised."""
    try:
        toks = shlex.split(rule)
    except ValueError:
        return None
    r = {"family": None, "priority": 0, "elements": [], "action": None, "limit": False, "raw": rule}
    cur, last = None, None
    for t in toks:
        k, eq, v = t.partition("=")
        k = k.lower()
        if eq:
            if cur is None:
                r[k] = int(v) if k == "priority" else v  # family=, priority=
            else:
                cur[k] = v
        elif k == "rule":
            cur = None
        elif k == "not":
            if cur is not None:
                cur["not"] = True
        elif k == "limit":
            r["limit"] = r["limit"] or last == "action"  # a limited action decides only sometimes
            cur = {"kind": "limit"}
        elif k in ("accept", "reject", "drop", "mark"):
            r["action"], cur, last = k, {"kind": "action"}, "action"
        else:
            cur, last = {"kind": k, "not": False}, k
            if k not in ("log", "audit", "nflog"):
                r["elements"].append(cur)
    return r


def _service_ports(fw, name, seen=None):
    """-> (ports [[p, proto]], protocols) of a service incl. includes, or None if unknown."""
    seen = seen or set()
    svc = (fw.get("services") or {}).get(name)
    if svc is None or name in seen:
        return None if svc is None else ([], [])
    seen.add(name)
    ports, protos = list(svc.get("ports") or []), list(svc.get("protocols") or [])
    for inc in svc.get("includes") or []:
        sub = _service_ports(fw, inc, seen)
        if sub:
            ports += sub[0]
            protos += sub[1]
    return ports, protos


def _rich_match(fw, r, pkt):
    if r["family"] and r["family"] != "ipv%d" % pkt.family:
        return False
    res = []
    for e in r["elements"]:
        kind, neg = e["kind"], e.get("not")
        if kind in ("source", "destination"):
            if "address" not in e:
                res.append(None)  # mac= / ipset=
                continue
            if kind == "destination" and pkt.dst is None:
                res.append(None)
                continue
            m = _in_net(pkt.src if kind == "source" else pkt.dst, e["address"])
            res.append(None if m is None else m != bool(neg))
        elif kind == "port":
            res.append(e.get("protocol") == pkt.proto and _in_ports(pkt.dport, e.get("port"), "-"))
        elif kind == "protocol":
            res.append(e.get("value") == pkt.proto)
        elif kind == "service":
            sp = _service_ports(fw, e.get("name"))
            res.append(None if sp is None else
                       any(q == pkt.proto and _in_ports(pkt.dport, p, "-") for p, q in sp[0])
                       or pkt.proto in sp[1])
        elif kind in ("icmp-block", "icmp-type"):
            res.append(False)
        else:  # source-port, forward-port, masquerade, tcp-mss-clamp ...
            res.append(None)
    return _tri_and(res)


def _eval_firewalld(fw, pkt):
    """Zone model: select zone(s) like firewalld, walk rich rules / ports / services / target."""
    zones, notes = fw.get("zones") or {}, []
    if pkt.iface == "lo":
        return _res("firewalld", "accept", True, "firewalld accepts all traffic on loopback (iifname lo)")
    chosen = []
    for name in sorted(zones, key=lambda n: (zones[n].get("ingress_priority", 0), n)):
        for s in zones[name].get("sources") or []:
            m = _in_net(pkt.src, s)
            if m is None:
                notes.append("zone %r source %s not evaluated" % (name, s))
            elif m and not chosen:
                chosen.append((name, "source %s" % s))
    izone = None
    if pkt.iface is not None:
        for name in sorted(zones):
            if any(_iface_match(i, pkt.iface) for i in zones[name].get("interfaces") or []):
                izone = (name, "interface %s" % pkt.iface)
                break
    dz = fw.get("default_zone")
    if izone is None:
        why = "default zone; interface %s" % (pkt.iface if pkt.iface else "unknown")
        izone = (dz, why)
    elif izone[0] == dz:
        izone = (dz, "default zone; " + izone[1])
    drifting = fw.get("allow_zone_drifting") and _version_lt(fw.get("version"), (1, 0))
    if not chosen or drifting:
        chosen.append(izone)
    for i, (name, why) in enumerate(chosen):
        z = zones.get(name)
        if z is None:
            notes.append("zone %r not collected" % name)
            continue
        verdict, explicit, ev = _eval_zone(fw, name, z, why, pkt, notes)
        if verdict is None and i + 1 < len(chosen) and z["target"] == "default":
            notes.append("AllowZoneDrifting: %s" % ev)
            continue
        return _res("firewalld", verdict or "reject", explicit, ev, notes)
    return _res("firewalld", "reject", False, "firewalld: no zone matched", notes)


def _version_lt(v, ref):
    try:
        return tuple(int(x) for x in str(v).split(".")[:2]) < ref
    except ValueError:
        return False


def _eval_zone(fw, name, z, why, pkt, notes):
    head = "firewalld zone %r (%s)" % (name, why)
    rich = [r for r in (_parse_rich(x) for x in z.get("rich_rules") or []) if r]
    bad = [x for x, r in zip(z.get("rich_rules") or [], rich) if r is None]
    notes.extend("unparsable rich rule %r" % x for x in bad)
    terminal = [r for r in rich if r["action"] in ("accept", "reject", "drop")]
    pre = sorted([r for r in terminal if r["priority"] < 0], key=lambda r: r["priority"])
    post = sorted([r for r in terminal if r["priority"] > 0], key=lambda r: r["priority"])
    zero = [r for r in terminal if r["priority"] == 0]
    deny = [r for r in zero if r["action"] != "accept"]
    allow = [r for r in zero if r["action"] == "accept"]

    def walk(rules):
        for r in rules:
            m = _rich_match(fw, r, pkt)
            if m and r["limit"]:
                m = None
            if m is None:
                notes.append("rich rule not evaluated (unsupported element): %s" % r["raw"])
            elif m:
                return r["action"], True, "%s: rich rule: %s" % (head, r["raw"])
        return None
    hit = walk(pre) or walk(deny) or walk(allow)
    if hit:
        return hit
    for p, q in z.get("ports") or []:
        if q == pkt.proto and _in_ports(pkt.dport, p, "-"):
            return "accept", True, "%s: port %s/%s" % (head, p, q)
    for s in z.get("services") or []:
        sp = _service_ports(fw, s)
        if sp is None:
            notes.append("service %r definition not collected" % s)
            continue
        for p, q in sp[0]:
            if q == pkt.proto and _in_ports(pkt.dport, p, "-"):
                return "accept", True, "%s: service %s (%s/%s)" % (head, s, p, q)
        if pkt.proto in sp[1]:
            return "accept", True, "%s: service %s (protocol %s)" % (head, s, pkt.proto)
    if pkt.proto in (z.get("protocols") or []):
        return "accept", True, "%s: protocol %s" % (head, pkt.proto)
    if z.get("source_ports"):
        notes.append("zone %r source-ports not evaluated" % name)
    hit = walk(post)
    if hit:
        return hit
    t = z.get("target") or "default"
    miss = "%d/%s not in ports [%s] / services [%s]" % (
        pkt.dport, pkt.proto, ", ".join("/".join(p) for p in z.get("ports") or []),
        ", ".join(z.get("services") or []))
    ev = "%s: target %s, %s" % (head, t, miss)
    if t == "ACCEPT":
        return "accept", True, "%s: target ACCEPT" % head
    if t == "DROP":
        return "drop", True, ev
    if t in ("%%REJECT%%", "REJECT"):
        return "reject", True, ev
    return None, False, ev  # default: rejected by firewalld's filter_INPUT tail


# --------------------------------------------------------------------------
# iptables (iptables-save text)
# --------------------------------------------------------------------------

def parse_iptables_save(text, table="filter"):
    """-> {chain: {"policy": "ACCEPT"|"DROP"|"-", "rules": [(line, tokens)]}} for one table."""
    chains, on = {}, False
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("*"):
            on = line[1:] == table
        elif not on or not line or line.startswith("#"):
            continue
        elif line == "COMMIT":
            on = False
        elif line.startswith(":"):
            parts = line[1:].split()
            chains[parts[0]] = {"policy": parts[1] if len(parts) > 1 else "-", "rules": []}
        else:
            line = re.sub(r"^\[\d+:\d+\]\s*", "", line)
            try:
                toks = shlex.split(line)
            except ValueError:
                toks = line.split()
            if len(toks) >= 2 and toks[0] in ("-A", "--append"):
                chains.setdefault(toks[1], {"policy": "-", "rules": []})["rules"].append((line, toks[2:]))
    return chains


_IPT_ALIASES = {"--source": "-s", "--src": "-s", "--destination": "-d", "--dst": "-d",
                "--in-interface": "-i", "--out-interface": "-o", "--protocol": "-p",
                "--jump": "-j", "--goto": "-g", "--match": "-m", "--fragment": "-f",
                "--destination-port": "--dport", "--source-port": "--sport",
                "--destination-ports": "--dports", "--source-ports": "--sports"}


def _ipt_rule(toks):
    """tokens -> (list of (negated, option, args), target, is_goto)."""
    opts, target, goto, neg, i = [], None, False, False, 0
    while i < len(toks):
        t = toks[i]
        i += 1
        if t == "!":
            neg = True
            continue
        name = _IPT_ALIASES.get(t, t)
        args = []
        while i < len(toks) and toks[i] != "!" and not (toks[i].startswith("-") and len(toks[i]) > 1
                                                          and not toks[i][1:].isdigit()):
            args.append(toks[i])
            i += 1
        if name in ("-j", "-g"):
            target, goto = (args[0] if args else None), name == "-g"
            break  # the rest are target options (--reject-with, --log-prefix, ...)
        opts.append((neg, name, args))
        neg = False
    return opts, target, goto


def _ipt_opt(neg, name, args, pkt):
    """Decide one iptables match option: True/False/None(unknown)."""
    a = args[0] if args else ""
    if name in ("-m", "--comment", "--limit-iface-in", "--log-prefix"):
        return True
    if name == "-s":
        r = _in_net(pkt.src, a)
    elif name == "-d":
        if pkt.dst is None:
            return True if a.endswith("/0") else None
        r = _in_net(pkt.dst, a)
    elif name == "-i":
        r = _iface_match(a, pkt.iface)
    elif name == "-p":
        a = a.lower()
        r = a in ("all", "0") or a == pkt.proto or a == str(_PROTO_NUM.get(pkt.proto))
    elif name == "--dport":
        r = _in_ports(pkt.dport, a, ":")
    elif name in ("--dports", "--ports"):
        r = any(_in_ports(pkt.dport, p, ":") for p in a.split(","))
        if name == "--ports" and not r:
            r = None  # could still match the (unknown) source port
    elif name in ("--state", "--ctstate"):
        r = "NEW" in a.upper().split(",")
    elif name == "--ctstatus":
        r = False  # a fresh, non-DNATed connection has no status bits
    elif name == "--syn":
        r = pkt.proto == "tcp"
    elif name == "--tcp-flags" and len(args) == 2:
        every = {"SYN", "ACK", "FIN", "RST", "URG", "PSH"}
        sets = [every if x == "ALL" else set() if x == "NONE" else set(x.split(",")) for x in args]
        r = (sets[0] & {"SYN"}) == sets[1]
    elif name in ("--src-range", "--dst-range"):
        addr = pkt.src if name == "--src-range" else pkt.dst
        lo, _, hi = a.partition("-")
        try:
            lo, hi = ipaddress.ip_address(u"%s" % lo), ipaddress.ip_address(u"%s" % (hi or lo))
        except ValueError:
            return None
        r = None if addr is None else lo.version == addr.version and lo <= addr <= hi
    elif name == "--dst-type":
        r = "LOCAL" in a.split(",")
    elif name == "--pkt-type":
        r = a == "unicast"
    elif name == "-f":
        r = False
    else:
        return None
    return None if r is None else r != neg


def _walk(start, rules_of, decide):
    """Netfilter chain traversal shared by iptables and nft: rules in order, jump pushes a
    return point, goto does not, RETURN / end of a called chain pops, end of the base
    chain (or RETURN in it) falls to the policy. ``decide(chain, n, rule)`` ->
    (action, target, ref) with action None (no match / non-terminal), "accept", "drop",
    "reject", "return", "jump" or "goto" (target = an existing chain).
    -> (verdict or None for "policy", ref of the deciding rule + how it was reached)."""
    stack, chain, idx, via = [], start, 0, []
    for _ in range(100000):  # loop guard; nft and iptables both reject chain loops anyway
        rules = rules_of(chain)
        if idx >= len(rules):
            if not stack:
                break
            chain, idx, via = stack.pop()
            continue
        idx += 1
        action, target, ref = decide(chain, idx, rules[idx - 1])
        if action in ("accept", "drop", "reject"):
            return action, ref + (" (via %s)" % ", ".join(via) if via else "")
        if action == "return":
            if not stack:
                break
            chain, idx, via = stack.pop()
        elif action in ("jump", "goto"):
            if action == "jump":
                stack.append((chain, idx, via))
            chain, idx, via = target, 0, via + ["%s #%d" % (chain, idx)]
    return None, None


def _eval_iptables(text, pkt, label, notes):
    """Walk filter INPUT like the kernel. -> layer result or None (no filter table / empty)."""
    chains = parse_iptables_save(text)
    if "INPUT" not in chains:
        return None
    if not chains["INPUT"]["rules"] and chains["INPUT"]["policy"] in ("ACCEPT", "-"):
        return None  # nothing reachable from INPUT: not an active firewall

    def decide(chain, n, rule):
        line, toks = rule
        opts, target, goto = _ipt_rule(toks)
        m = _tri_and([_ipt_opt(neg, o, a, pkt) for neg, o, a in opts])
        ref = "%s filter %s #%d: %s" % (label, chain, n, line)
        if m is None:
            notes.append("not evaluated (unsupported match, treated as non-matching): " + ref)
        elif m and target in ("ACCEPT", "DROP", "REJECT", "RETURN"):
            return target.lower(), None, ref
        elif m and target in chains:
            return "goto" if goto else "jump", target, ref
        elif m and target and target not in _IPT_CONTINUE:
            notes.append("unknown target, ignored: " + ref)
        return None, None, ref
    verdict, ref = _walk("INPUT", lambda c: chains.get(c, {"rules": []})["rules"], decide)
    if verdict:
        return _res(label, verdict, True, ref, notes)
    pol = chains["INPUT"]["policy"]
    verdict = {"DROP": "drop", "REJECT": "reject"}.get(pol, "accept")
    return _res(label, verdict, verdict != "accept", "%s filter INPUT policy %s" % (label, pol), notes)


# --------------------------------------------------------------------------
# nftables (nft -j list ruleset)
# --------------------------------------------------------------------------

def _nft_index(nft):
    """-> {(family, table): {"chains": {name: chain}, "rules": {chain: [rule]}, "sets": {name: elems}}}"""
    tables = {}
    for obj in (nft or {}).get("nftables") or []:
        if not isinstance(obj, dict) or len(obj) != 1:
            continue
        kind, o = list(obj.items())[0]
        if kind == "table":
            tables.setdefault((o["family"], o["name"]), {"chains": {}, "rules": {}, "sets": {}})
        elif kind in ("chain", "rule", "set", "map"):
            t = tables.setdefault((o["family"], o["table"]), {"chains": {}, "rules": {}, "sets": {}})
            if kind == "chain":
                t["chains"][o["name"]] = o
            elif kind == "rule":
                t["rules"].setdefault(o["chain"], []).append(o)
            else:
                t["sets"][o["name"]] = o.get("elem") or []
    return tables


def _nft_text_index(text):
    """`nft -a list ruleset` -> {(family, table, chain, handle): 'rule text'}."""
    out, table, chain = {}, None, None
    for line in (text or "").splitlines():
        s = line.strip()
        m = re.match(r"table (\S+) (\S+) \{", s)
        if m:
            table, chain = (m.group(1), m.group(2)), None
            continue
        m = re.match(r"chain (\S+) \{", s)
        if m:
            chain = m.group(1).strip('"')
            continue
        if s == "}":
            chain = None
            continue
        m = re.match(r"(.*\S)\s+# handle (\d+)$", s)
        if m and table and chain:
            out[(table[0], table[1], chain, int(m.group(2)))] = m.group(1)
    return out


def _nft_left(left, pkt):
    """-> (kind, value) of the packet field; value None = unknown; kind 'false' = cannot apply."""
    if isinstance(left, dict) and "payload" in left:
        p = left["payload"]
        proto, field = p.get("protocol"), p.get("field")
        if proto in ("ip", "ip6"):
            if (proto == "ip") != (pkt.family == 4):
                return "false", None
            if field == "saddr":
                return "addr", pkt.src
            if field == "daddr":
                return "addr", pkt.dst
            if field in ("protocol", "nexthdr"):
                return "proto", pkt.proto
            return "?", None
        if proto in ("ether", "vlan", "arp", "ll", "nh"):
            return "?", None
        if proto != "th" and proto != pkt.proto:
            return "false", None  # e.g. icmpv6 type / udp dport on a TCP packet
        return ("port", pkt.dport) if field == "dport" else ("port", None)
    if isinstance(left, dict) and "meta" in left:
        return {"iifname": ("iface", pkt.iface), "iif": ("iface", pkt.iface), "l4proto": ("proto", pkt.proto),
                "protocol": ("str", "ip" if pkt.family == 4 else "ip6"),
                "nfproto": ("str", "ipv%d" % pkt.family), "pkttype": ("str", "host"),
                }.get(left["meta"].get("key"), ("?", None))
    if isinstance(left, dict) and "ct" in left:  # a NEW, non-DNATed connection
        return {"state": ("str", "new"), "status": ("flags", set()), "direction": ("str", "original"),
                }.get(left["ct"].get("key"), ("?", None))
    return "?", None


def _nft_elems(right, sets):
    if isinstance(right, str) and right.startswith("@"):
        return [e["elem"]["val"] if isinstance(e, dict) and "elem" in e else e
                for e in sets.get(right[1:], [])]
    if isinstance(right, dict) and "set" in right:
        return list(right["set"])
    if isinstance(right, list):
        return list(right)
    return [right]


def _nft_elem_match(kind, val, el):
    if isinstance(el, dict) and "elem" in el:
        el = el["elem"].get("val")
    if kind == "addr":
        if isinstance(el, dict) and "prefix" in el:
            return _in_net(val, "%s/%s" % (el["prefix"]["addr"], el["prefix"]["len"]))
        if isinstance(el, dict) and "range" in el:
            try:
                lo, hi = [ipaddress.ip_address(u"%s" % x) for x in el["range"]]
            except ValueError:
                return None
            return lo.version == val.version and lo <= val <= hi
        return _in_net(val, el) if isinstance(el, str) else None
    if kind == "port":
        if isinstance(el, dict) and "range" in el:
            return int(el["range"][0]) <= val <= int(el["range"][1])
        try:
            return val == int(el)
        except (TypeError, ValueError):
            return None
    if kind == "proto":
        return el == val or el == _PROTO_NUM.get(val) or str(el) == str(_PROTO_NUM.get(val))
    if kind == "iface":
        return _iface_match(el, val, "*") if isinstance(el, str) else None
    if kind == "flags":
        return el in val
    return el == val if isinstance(el, (str, int)) else None


def _nft_match(m, pkt, sets):
    kind, val = _nft_left(m.get("left"), pkt)
    if kind == "false":
        return False
    if val is None and kind != "iface" or kind == "?":
        return None
    op, right = m.get("op", "=="), m.get("right")
    if op in ("<", ">", "<=", ">="):
        try:
            r = int(right)
        except (TypeError, ValueError):
            return None
        return {"<": val < r, ">": val > r, "<=": val <= r, ">=": val >= r}[op]
    if op not in ("==", "!=", "in"):
        return None
    res = [_nft_elem_match(kind, val, e) for e in _nft_elems(right, sets)]
    hit = True if True in res else (None if None in res else False)
    if hit is None:
        return None
    return hit if op != "!=" else not hit


def _nft_verdict(e):
    for k in ("accept", "drop", "reject", "return", "queue"):
        if k in e:
            return k, None
    for k in ("jump", "goto"):
        if k in e:
            return k, e[k].get("target")
    return None


def _nft_rule(rule, pkt, sets):
    """-> ('nomatch'|'unknown'|verdict, target). Statements before the verdict are ignored."""
    unknown = False
    for e in rule.get("expr") or []:
        if not isinstance(e, dict) or not e:
            continue
        k = list(e)[0]
        if k == "match":
            r = _nft_match(e["match"], pkt, sets)
            if r is False:
                return "nomatch", None
            unknown = unknown or r is None
        elif k == "vmap":
            if unknown:
                return "unknown", None
            kind, val = _nft_left(e["vmap"].get("key"), pkt)
            if kind == "false":
                return "nomatch", None
            data = e["vmap"].get("data")
            pairs = _nft_elems(data, sets) if not isinstance(data, dict) else data.get("set", [])
            for pair in pairs:
                if isinstance(pair, list) and len(pair) == 2:
                    r = _nft_elem_match(kind, val, pair[0]) if kind != "?" else None
                    if r is None:
                        return "unknown", None
                    if r:
                        return _nft_verdict(pair[1]) or ("unknown", None)
            return "nomatch", None
        elif _nft_verdict(e):
            return ("unknown", None) if unknown else _nft_verdict(e)
        elif k in ("xt", "limit"):
            unknown = True
        elif k not in _NFT_CONTINUE:
            unknown = True
    return ("unknown", None) if unknown else ("nomatch", None)


def _is_iptables_nft(key, t):
    return key[1] == "filter" and key[0] in ("ip", "ip6") and (
        {"INPUT", "FORWARD", "OUTPUT"} & set(t["chains"])
        or any("xt" in e for rs in t["rules"].values() for r in rs for e in r.get("expr") or []))


def _nft_render(rule):
    """Fallback evidence when `nft -a list ruleset` text is missing: the rule's JSON."""
    return json.dumps([e for e in rule.get("expr") or [] if "counter" not in e], sort_keys=True)


def _eval_nft(nft, pkt, text, skip_firewalld, skip_ipt_families, notes):
    tables = _nft_index(nft)
    texts = _nft_text_index(text)
    fams = ("ip", "inet") if pkt.family == 4 else ("ip6", "inet")
    hooks = {"prerouting": 0, "input": 1}
    bases = []
    for key, t in sorted(tables.items()):
        if key[0] not in fams:
            continue
        if skip_firewalld and key[1] == "firewalld":
            continue
        if key[0] in skip_ipt_families and _is_iptables_nft(key, t):
            continue
        for c in t["chains"].values():
            if c.get("hook") in hooks and c.get("type", "filter") == "filter":
                bases.append((hooks[c["hook"]], int(c.get("prio", 0)), key, c["name"]))
    bases.sort()
    if not bases or all(not tables[k]["rules"].get(n) and tables[k]["chains"][n].get("policy", "accept")
                        == "accept" for _, _, k, n in bases):
        return None
    explicit, last = None, None
    for _, _, key, base in bases:
        t, label = tables[key], "nft %s %s" % key

        def decide(chain, n, rule):
            txt = texts.get((key[0], key[1], chain, rule.get("handle"))) or _nft_render(rule)
            ref = "%s %s: %s" % (label, chain, txt)
            v, target = _nft_rule(rule, pkt, t["sets"])
            if v == "unknown":
                notes.append("not evaluated (unsupported expression, treated as non-matching): " + ref)
            elif v == "queue":
                notes.append("queue verdict (userspace decides), ignored: " + ref)
            elif v in ("jump", "goto") and target not in t["chains"]:
                notes.append("jump to unknown chain, ignored: " + ref)
            elif v in ("accept", "drop", "reject", "return", "jump", "goto"):
                return v, target, ref
            return None, None, ref
        verdict, ref = _walk(base, lambda c: t["rules"].get(c, []), decide)
        by_rule = verdict is not None
        if not by_rule:
            verdict = t["chains"][base].get("policy", "accept")
            ref = "%s %s policy %s" % (label, base, verdict)
        if verdict != "accept":
            return _res("nftables", verdict, True, ref, notes)
        if by_rule:
            explicit = explicit or ref
        else:
            last = last or ref
    return _res("nftables", "accept", bool(explicit), explicit or last, notes)


# --------------------------------------------------------------------------
# public evaluation API
# --------------------------------------------------------------------------

def _res(layer, verdict, explicit, evidence, notes=None):
    return {"layer": layer, "verdict": verdict, "explicit": explicit, "evidence": evidence,
            "notes": list(notes or [])}


def _firewalld_active(state):
    fw = state.get("firewalld")
    return bool(fw and fw.get("running", True) and fw.get("zones"))


def evaluate(state, src, dport, iface=None, proto="tcp", dst=None):
    """Would a NEW packet src -> local dport (on iface) be accepted by every active layer?

    Returns {"allowed", "layer", "verdict", "evidence", "explicit", "notes", "layers"}:
    ``layer``/``evidence`` name the deciding rule (the first drop/reject, else the
    first explicit accept, else a policy accept); ``explicit`` is True when an
    explicit rule (not a chain policy / empty ruleset) made the decision.
    """
    pkt = _Pkt(src, dport, iface, proto, dst)
    notes, layers = [], []
    fw_on = _firewalld_active(state)
    if fw_on:
        layers.append(_eval_firewalld(state["firewalld"], pkt))
    skip_ipt = []
    texts = [("iptables", state.get("iptables"), "ip")] if pkt.family == 4 else [
        ("ip6tables", state.get("ip6tables"), "ip6")]
    if pkt.family == 4:
        texts.append(("iptables-legacy", state.get("iptables_legacy"), None))
    for label, text, fam in texts:
        if not text:
            continue
        if fw_on and re.search(r"^:INPUT_ZONES\b", text, re.M):
            notes.append("%s: firewalld iptables backend, evaluated via the zone model" % label)
            skip_ipt.append(fam)
            continue
        r = _eval_iptables(text, pkt, label, [])
        if fam and "*filter" in text and "(legacy)" not in text.split("\n", 1)[0]:
            skip_ipt.append(fam)  # iptables-nft: its nft tables would be counted twice
        if r:
            layers.append(r)
    if state.get("nft"):
        r = _eval_nft(state["nft"], pkt, state.get("nft_text"), fw_on, skip_ipt, [])
        if r:
            layers.append(r)
    for lr in layers:
        notes.extend("%s: %s" % (lr["layer"], n) for n in lr.pop("notes"))
    deny = [lr for lr in layers if lr["verdict"] != "accept"]
    expl = [lr for lr in layers if lr["verdict"] == "accept" and lr["explicit"]]
    pick = (deny or expl or layers or [None])[0]
    if pick is None:
        return {"allowed": True, "layer": None, "verdict": "accept", "explicit": False,
                "evidence": "no active firewall rules", "notes": notes, "layers": []}
    ev = pick["evidence"]
    if notes:
        ev += " [%d rule(s) not evaluated, treated as non-matching: %s]" % (
            len(notes), "; ".join(notes[:3]) + ("; ..." if len(notes) > 3 else ""))
    return {"allowed": not deny, "layer": pick["layer"], "verdict": pick["verdict"],
            "explicit": bool(pick["explicit"]), "evidence": ev, "notes": notes, "layers": layers}


def ports_blocked(state, src, ports, iface=None, proto="tcp", dst=None):
    """-> [(port, result)] for each port in ``ports`` that would NOT be accepted."""
    out = []
    for p in ports:
        r = evaluate(state, src, p, iface=iface, proto=proto, dst=dst)
        if not r["allowed"]:
            out.append((int(p), r))
    return out


def _port_marks(state):
    """Every port number that appears in a port match anywhere in the state."""
    marks = set()
    blobs = [state.get(k) or "" for k in ("iptables", "iptables_legacy", "ip6tables")]
    for b in blobs:
        for m in re.finditer(r"--(?:dports?|ports|destination-ports?)\s+(\S+)", b):
            marks.update(int(x) for x in re.findall(r"\d+", m.group(1)))
    fw = state.get("firewalld") or {}
    for z in (fw.get("zones") or {}).values():
        for spec in [p for p, _ in z.get("ports") or []] + list(z.get("rich_rules") or []):
            marks.update(int(x) for x in re.findall(r"\b\d{1,5}\b", spec) if int(x) <= 65535)
    for s in (fw.get("services") or {}).values():
        for p, _ in s.get("ports") or []:
            marks.update(int(x) for x in re.findall(r"\d+", p))

    def walk(o, in_port):  # ints on the right of a "... dport" match in nft JSON
        if isinstance(o, dict) and isinstance(o.get("match"), dict):
            walk(o["match"].get("right"), '"dport"' in json.dumps(o["match"].get("left")))
        elif isinstance(o, (dict, list)):
            for v in (o.values() if isinstance(o, dict) else o):
                walk(v, in_port)
        elif in_port and isinstance(o, int) and not isinstance(o, bool):
            marks.add(o)
    walk(state.get("nft"), False)
    return marks


def sample_ports(state, lo, hi, extra=5):
    """Representative ports of [lo, hi]: the ends, ``extra`` evenly spaced points and,
    for every port number the rule sets mention, n-1, n, n+1. Because every supported
    port predicate is a union of intervals bounded by those numbers, testing these
    points decides the whole range exactly."""
    lo, hi = int(lo), int(hi)
    pts = {lo, hi}
    if extra and hi > lo:
        pts.update(lo + (hi - lo) * i // (extra + 1) for i in range(1, extra + 1))
    for m in _port_marks(state):
        pts.update(p for p in (m - 1, m, m + 1) if lo <= p <= hi)
    return sorted(pts)


def world_open(state, port_or_range, cidr, iface=None, dst=None):
    """Evidence string if an explicit active-firewall rule admits the port (or any port of
    a ``(lo, hi)`` range) from anywhere, else None.

    Counts as world-open: a NEW TCP packet from a TEST-NET documentation address outside
    ``cidr`` (203.0.113.7 / 198.51.100.7 / 192.0.2.7, and 2001:db8::7 for ::/0) would be
    accepted by every active layer AND the decisive accept is an explicit rule (iptables /
    nft accept rule, firewalld port/service/rich rule/ACCEPT target), not a policy accept
    of a chain whose rules did not match, and not the absence of any firewall.
    """
    if isinstance(port_or_range, (list, tuple)):
        ports = sample_ports(state, port_or_range[0], port_or_range[1])
    else:
        ports = [int(port_or_range)]
    try:
        net = ipaddress.ip_network(u"%s" % cidr, strict=False)
    except ValueError:
        net = None
    srcs = [s for s in TEST_NET_SOURCES if net is None or ipaddress.ip_address(u"%s" % s) not in net]
    v4 = [s for s in srcs if ":" not in s][:1]
    for src in v4 + [s for s in srcs if ":" in s]:
        for p in ports:
            r = evaluate(state, src, p, iface=iface, dst=dst)
            if r["allowed"] and r["layer"] and r["explicit"]:
                return "%d/tcp from %s (outside %s) accepted: %s" % (p, src, cidr, r["evidence"])
    return None
