"""Firewall facts for ddpfix: node-side collection only (stdlib only, Python >= 3.6).

``collect(run=None)`` runs on the node (read-only, short timeouts, missing binaries
tolerated) and returns a JSON-serialisable *state* dict. The layers are read
concurrently (one thread per reader; firewalld's D-Bus client in the calling thread),
so the slowest reader bounds the time. Rule evaluation (the firewalld zone model,
iptables, nftables) runs on the controller: ``controller/ddpfix/firewall/``.

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
                              "includes": [...]}},
          "policies": {NAME: {"target": "CONTINUE"|"ACCEPT"|"DROP"|"REJECT", "priority": int,
                              "ingress_zones": [...], "egress_zones": [...], "services": [...],
                              "ports": [[p, proto]], "protocols": [...], "rich_rules": [...]}},  # >= 0.9
          "direct_rules": [[ipv, table, chain, priority, [arg, ...]], ...]},
      "iptables": str | None,          # `iptables-save` text (all tables)
      "iptables_legacy": str | None,   # `iptables-legacy-save` when it holds tables iptables-save did not print
      "ip6tables": str | None,         # `ip6tables-save` text
      "nft": {"nftables": [...]} | None,   # `nft -j list ruleset`
      "nft_text": str | None,          # `nft -a list ruleset` (rule text for evidence)
      "errors": ["..."],
      "unread": [{"source": "firewalld" | "iptables" | "ip6tables" | "iptables-legacy" | "nft",
                  "reason": "iptables-save: ... Permission denied (you must be root)"}]
    }

firewalld is asked (``firewall-cmd``, a Python program) only when a firewalld process is visible in /proc, or
when /proc cannot show every process (PID 1 hidden, hidepid): with every process visible and none of them firewalld
it is not running. A firewalld of another PID namespace programs the kernel's tables, which are read directly.

``unread`` lists every layer that could not be read (no permission, timeout, a read
that failed although the layer is there): its key above is then None, which must
never be taken as "no rules". A tool that is not installed is not unread (nothing
could have configured that layer), except when neither ``iptables-save`` nor ``nft``
exists: then netfilter as a whole is unread. ``errors`` and ``unread`` keep a fixed
order (firewalld, iptables, iptables-legacy, ip6tables, nft), whatever order the
concurrent reads finish in.
"""
from __future__ import absolute_import, division, print_function

import json
import os
import re
import shlex
import subprocess
import threading

SCHEMA = "ddpfix.firewall/v1"


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
        return 124, "", f"timeout after {timeout}s"
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _which(name):
    # type: (str) -> str
    for d in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin", "/usr/bin", "/bin"]:
        p = os.path.join(d, name)
        if d and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return name  # let run() report "not found"


class _Reader:
    """One layer's reads: their errors, unread sources and missing tools, kept apart from the other readers'."""

    def __init__(self, run):
        self.run, self.errors, self.unread, self.missing = run, [], [], []

    def text(self, argv, what, source=None):
        rc, out, err = self.run([_which(argv[0]), *argv[1:]], timeout=10)
        if rc == 0:
            return out
        if rc == 127:
            if source:
                self.missing.append(argv[0])
            return None
        line = _first_line(err or out) or f"rc={rc}"
        reason = line if line.startswith(argv[0]) else f"{what}: {line}"
        self.errors.append(f"{what}: rc={rc} {(err or out).strip()[:200]}")
        if source:
            self.unread.append({"source": source, "reason": reason})
        return None

    def guard(self, source, fn):
        """Run fn(self); an unexpected exception makes the layer unread instead of failing the fact gathering."""
        try:
            fn(self)
        except Exception as exc:  # noqa: BLE001 - any failure of one reader makes its layer unread, never the task
            self.errors.append(f"{source}: {exc}")
            self.unread.append({"source": source, "reason": f"{source}: {_first_line(str(exc))}"})


def collect(run=None, use_dbus=True, proc="/proc"):
    """Read the node's live firewall state (read-only, the layers concurrently). Returns the state dict.

    ``run(argv, timeout=...) -> (rc, stdout, stderr)``; default uses subprocess.
    ``use_dbus=False`` forces the firewall-cmd text fallback. ``proc``: where to look for a firewalld process.
    """
    run = run or _default_run
    state = {"schema": SCHEMA, "firewalld": None, "iptables": None, "iptables_legacy": None,
             "ip6tables": None, "nft": None, "nft_text": None, "errors": [], "unread": []}

    def firewalld(r):
        if _process_visible("1", proc) and not _process_running("firewalld", proc):
            return  # every process is visible and none is firewalld: not running (firewall-cmd costs ~0.1 s of CPU)
        rc, out, err = r.run([_which("firewall-cmd"), "--state"], timeout=10)
        if rc == 0 and "running" in out and "not running" not in out:
            try:
                state["firewalld"] = _collect_firewalld(r.run, use_dbus, r.errors)
            except Exception as exc:  # noqa: BLE001 - never fail the whole fact gathering: the layer is unread
                r.errors.append(f"firewalld: {exc}")
                r.unread.append({"source": "firewalld", "reason": "firewalld runs but its configuration could not "
                                 f"be read: {_first_line(str(exc))}"})
        elif rc not in (127, 252) and _process_running("firewalld", proc):
            # 252 = not running; a firewalld process that firewall-cmd cannot ask (D-Bus denied, timeout) is unread
            reason = "firewall-cmd --state: %s" % (_first_line(err or out) or f"rc={rc}")
            r.errors.append(reason)
            r.unread.append({"source": "firewalld", "reason": reason})

    def iptables(r):
        ipt = r.text(["iptables-save"], "iptables-save", "iptables")
        state["iptables"] = ipt
        # The legacy tables are read whenever iptables-legacy-save exists: iptables-nft's "iptables-legacy tables
        # present" warning goes to stderr (1.8.9) or stdout (older), and is no proof either way. Kept only when it
        # holds a table and is not what iptables-save printed already (iptables itself the legacy variant).
        legacy = r.text(["iptables-legacy-save"], "iptables-legacy-save", "iptables-legacy")
        if legacy is not None and "*" in legacy and _same_save(legacy) != _same_save(ipt):
            state["iptables_legacy"] = legacy

    def ip6tables(r):
        state["ip6tables"] = r.text(["ip6tables-save"], "ip6tables-save", "ip6tables")

    def nft(r):
        nj = r.text(["nft", "-j", "list", "ruleset"], "nft -j list ruleset", "nft")
        if nj is None:
            return
        try:
            state["nft"] = json.loads(nj) if nj.strip() else {"nftables": []}
        except ValueError as exc:
            r.errors.append(f"nft -j: unparsable JSON ({exc})")
            r.unread.append({"source": "nft", "reason": f"nft -j list ruleset: unparsable JSON ({exc})"})
        state["nft_text"] = r.text(["nft", "-a", "list", "ruleset"], "nft -a")

    jobs = [("firewalld", firewalld), ("iptables", iptables), ("ip6tables", ip6tables), ("nft", nft)]
    readers = [_Reader(run) for _ in jobs]
    threads = [threading.Thread(target=r.guard, args=(source, fn), name="ddpfix-fw-" + source)
               for r, (source, fn) in zip(readers[1:], jobs[1:])]
    for t in threads:
        t.daemon = True
        t.start()
    readers[0].guard(*jobs[0])  # firewalld's D-Bus client stays in the calling thread
    for t in threads:
        t.join()
    missing = set()
    for r in readers:  # a fixed order, whichever read finished first
        state["errors"].extend(r.errors)
        state["unread"].extend(r.unread)
        missing.update(r.missing)
    if "iptables-save" in missing and "nft" in missing:
        state["unread"].append({"source": "netfilter", "reason": "neither iptables-save nor nft is installed"})
    return state


def _same_save(text):
    """iptables-save text without what differs between two reads of the same tables (comments, counters)."""
    lines = (re.sub(r"\[\d+:\d+\]", "", ln).strip() for ln in (text or "").splitlines())
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _first_line(text):
    """The most telling line of a tool's error output (the first non-empty one), at most 200 characters."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _process_visible(pid, proc="/proc"):
    """Whether process ``pid`` shows in ``proc`` (PID 1 hidden: hidepid, so absent processes prove nothing)."""
    return os.path.exists(os.path.join(proc, pid, "comm"))


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
        except OSError:
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
          "default_zone": None, "allow_zone_drifting": False, "zones": {}, "services": {}, "policies": {},
          "direct_rules": []}
    try:
        with open("/etc/firewalld/firewalld.conf") as fh:
            m = re.search(r"^\s*AllowZoneDrifting\s*=\s*(\S+)", fh.read(), re.M)
            fw["allow_zone_drifting"] = bool(m and m.group(1).lower() in ("yes", "true"))
    except OSError:
        pass
    get_service = None
    if use_dbus:
        try:
            get_service = _collect_firewalld_dbus(fw)
        except Exception as exc:  # noqa: BLE001 - ImportError, DBusException, FirewallError: use firewall-cmd
            errors.append(f"firewalld D-Bus client unavailable, using firewall-cmd: {exc}")
            fw.update(zones={}, policies={}, direct_rules=[], source="cli")
    get_service = get_service or _collect_firewalld_cli(fw, run)
    if fw["source"] == "cli":
        _collect_firewalld_cli_more(fw, run, errors)
    # services used by the zones directly or in rich rules, with their includes
    todo = set()
    for z in list(fw["zones"].values()) + list(fw["policies"].values()):
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
        except Exception as exc:  # noqa: BLE001 - a service that cannot be read is reported, the zone still is
            errors.append(f"firewalld service {name!r}: {exc}")
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
    if hasattr(client, "getPolicies"):  # firewalld >= 0.9
        for name in sorted(client.getPolicies() or []):
            fw["policies"][str(name)] = _norm_policy(client.getPolicySettings(name).getSettingsDict())
    fw["direct_rules"] = _norm_direct(client.getAllRules() or [])
    return lambda name: client.getServiceSettings(name).getSettingsDict()


def _norm_policy(d):
    """Policy settings (D-Bus dict or parsed text) -> the contract's policy dict."""
    pairs = lambda v: [[str(p), str(q)] for p, q in (v or [])]  # noqa: E731
    try:
        prio = int(d.get("priority") if d.get("priority") not in (None, "") else -1)
    except (TypeError, ValueError):
        prio = -1
    return {"target": str(d.get("target") or "CONTINUE"), "priority": prio,
            "ingress_zones": [str(z) for z in d.get("ingress_zones") or []],
            "egress_zones": [str(z) for z in d.get("egress_zones") or []],
            "services": [str(x) for x in d.get("services") or []], "ports": pairs(d.get("ports")),
            "protocols": [str(x) for x in d.get("protocols") or []],
            "rich_rules": [str(x) for x in d.get("rich_rules") or d.get("rules_str") or []]}


def _norm_direct(rules):
    """(ipv, table, chain, priority, args) of each direct rule (D-Bus tuples, or `--get-all-rules` lines)."""
    out = []
    for r in rules:
        if isinstance(r, str):
            try:
                r = shlex.split(r)
            except ValueError:
                continue
            r = [*r[:4], r[4:]] if len(r) >= 4 else r
        if isinstance(r, (list, tuple)) and len(r) == 5:
            try:
                out.append([str(r[0]), str(r[1]), str(r[2]), int(r[3]), [str(a) for a in r[4]]])
            except (TypeError, ValueError):
                continue
    return out


def parse_list_all_policies(text):
    """Parse `firewall-cmd --list-all-policies` output -> {policy: contract policy dict}."""
    out = {}
    for name, d in _list_all_blocks(text).items():
        out[name] = _norm_policy(dict(d, target=(d.get("target") or [None])[0],
                                      priority=(d.get("priority") or [None])[0],
                                      ingress_zones=d.get("ingress-zones"), egress_zones=d.get("egress-zones"),
                                      ports=[p.split("/", 1) for p in d.get("ports") or [] if "/" in p],
                                      rich_rules=d.get("rich rules")))
    return out


def _list_all_blocks(text):
    """`firewall-cmd --list-all-*` text -> {name: {key: [values], "rich rules": [rule lines], "_flags": str}}."""
    blocks, cur, key = {}, None, None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            name = line.split()[0]
            cur, key = blocks.setdefault(name, {"_flags": line[len(name):].strip(" ()")}), None
        elif cur is not None and line.startswith("\t") and key == "rich rules":
            cur[key].append(line.strip())
        elif cur is not None and ":" in line:
            key, _, val = line.strip().partition(":")
            cur[key] = [] if key == "rich rules" else val.split()
    return blocks


def _collect_firewalld_cli_more(fw, run, errors):
    """Policies (firewalld >= 0.9) and direct rules from firewall-cmd's text output."""
    fc = _which("firewall-cmd")
    rc, out, err = run([fc, "--list-all-policies"], timeout=15)
    if rc == 0:
        fw["policies"] = parse_list_all_policies(out)
    elif "--list-all-policies" not in err:  # an older firewalld has no policies (usage error)
        errors.append(f"firewall-cmd --list-all-policies: rc={rc} {_first_line(err)}")
    rc, out, err = run([fc, "--direct", "--get-all-rules"], timeout=15)
    if rc == 0:
        fw["direct_rules"] = _norm_direct(out.splitlines())
    else:
        errors.append(f"firewall-cmd --direct --get-all-rules: rc={rc} {_first_line(err)}")


def parse_list_all(text):
    """Parse `firewall-cmd --list-all-zones` / `--zone=Z --list-all` output -> {zone: dict}
    (contract zone dicts plus "_flags", e.g. "default, active")."""
    zones = _list_all_blocks(text)
    out = {}
    def pp(z, k):
        return [p.split("/", 1) for p in z.get(k) or [] if "/" in p]
    for name, z in zones.items():
        d = dict(z, ports=pp(z, "ports"), source_ports=pp(z, "source-ports"), rich_rules=z.get("rich rules"),
                 target=(z.get("target") or [None])[0],
                 ingress_priority=(z.get("ingress-priority") or [0])[0])
        out[name] = dict(_norm_zone(d), _flags=z["_flags"])
    return out


def _collect_firewalld_cli(fw, run):
    """Fill fw from firewall-cmd text output; returns the service getter."""
    def fc(*args):
        rc, out, err = run([_which("firewall-cmd"), *list(args)], timeout=15)
        if rc != 0:
            raise RuntimeError("firewall-cmd {}: rc={} {}".format(" ".join(args), rc, err.strip()[:200]))
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
