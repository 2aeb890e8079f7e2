"""The node side of the audit's active probes: one forked prober per node (listener + dialer), name resolution and
routes. Collection only: what a result means is decided on the controller (ddpfix.rules)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import ipaddress
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import network, resolve

_REASONS = {"ECONNREFUSED": "connection refused", "EHOSTUNREACH": "no route to host (ICMP host prohibited/unreachable)",
            "ENETUNREACH": "network unreachable", "ECONNRESET": "connection reset"}


SO_BINDTODEVICE = 25


def tcp_connect(address, port, bind_address, bind_ifname, timeout, bound=None):
    """One TCP connect from `bind_address`, on device `bind_ifname` (SO_BINDTODEVICE: the route lookup is limited to
    that device, so routing cannot pick another NIC; needs CAP_NET_RAW, skipped silently without). `bound` (a dict)
    gets `device`: whether the device binding took effect."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # The dial's local port is an ephemeral one and stays in TIME_WAIT for a minute after the close; without
    # SO_REUSEADDR that TIME_WAIT blocks a later listener bind on the same port (the next run's random probe port,
    # taken from the same range), even one with SO_REUSEADDR: "probe listener could not start", a false finding.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.settimeout(timeout)
    started = time.time()
    try:
        if bind_ifname:
            try:
                s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, bind_ifname.encode() + b"\0")
                if bound is not None:
                    bound["device"] = True
            except OSError:
                if bound is not None:
                    bound["device"] = False
        if bind_address:
            s.bind((bind_address, 0))
        s.connect((address, int(port)))
        return {"ok": True, "error": None, "seconds": round(time.time() - started, 3)}
    except socket.timeout:
        return {"ok": False, "error": f"timed out after {timeout:.1f}s", "seconds": round(time.time() - started, 3)}
    except OSError as exc:
        name = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        reason = _REASONS.get(name, exc.strerror or str(exc))
        return {"ok": False, "error": f"{reason} ({name})" if name else reason,
                "seconds": round(time.time() - started, 3)}
    finally:
        s.close()


def routes(addresses):
    """address -> {dev, via, src, type} or {error}: `ip -j -batch - route get` for every address at once."""
    if not addresses:
        return {}
    script = "".join(f"route get {a}\n" for a in addresses)
    try:
        p = subprocess.run(["ip", "-j", "-batch", "-"], input=script.encode(), capture_output=True,
                           timeout=10)
        out = p.stdout.decode("utf-8", "replace")
        err = p.stderr.decode("utf-8", "replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {a: {"error": str(exc)} for a in addresses}
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
                result[dst] = {"dev": r.get("dev"), "via": r.get("gateway"), "src": r.get("prefsrc"),
                               "type": r.get("type")}
    for a in addresses:
        if a not in result:
            result[a] = {"error": (err.strip().splitlines() or ["no route"])[0]}
    return result


def deviations(expected, me, ifname):
    """Resolution and routes, reported only where they deviate: `expected` is {name: address} of every node (as the
    controller knows it). Returns {resolve: {name: [addrs]} for names that do not resolve first to the expected
    address, routes: {addr: route} for routes that leave through a gateway, another interface than `ifname`, or
    fail, checked: number of names looked at}."""
    resolved = {}
    to_route = []
    for name, want in sorted((expected or {}).items()):
        if name == me:
            continue
        got = resolve(name)
        if not got or (want and got[0] != want):
            resolved[name] = got
        if want and ":" not in want and want not in to_route:
            to_route.append(want)
    dev = {}
    for a, r in routes(to_route).items():
        if "error" in r or r.get("via") or (ifname and r.get("dev") != ifname):
            dev[a] = r
    return {"resolve": resolved, "routes": dev, "checked": len([n for n in expected or {} if n != me])}


def proc_start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _bind_first(addr, ports):
    """A listening socket on the first of `ports` that `addr` can bind: (sock, port, None), or (None, None, the
    first port's error) when none can. Only "address in use" moves on to the next port."""
    first = None
    for port in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only: a live listener still fails the bind
        try:
            s.bind((addr, int(port)))
            s.listen(1024)
            return s, int(port), None
        except OSError as exc:
            s.close()
            first = first or exc
            if exc.errno != errno.EADDRINUSE:
                break
    return None, None, first


def bind_listeners(specs):
    """[(addr, port, kind, optional[, alternates])] -> (sockets [(sock, kind)], held [(addr, port, kind)], error or
    None). A port in use (a listener, or a connection of this node's own from the same address) moves on to the
    spec's alternates, in order; held names the port taken."""
    socks, held = [], []
    for spec in specs:
        addr, port, kind, optional = spec[:4]
        alternates = list(spec[4]) if len(spec) > 4 else []
        s, got, exc = _bind_first(addr, [port, *alternates])
        if s is None:
            if optional and exc is not None and exc.errno == errno.EADDRINUSE:
                continue
            for o, _ in socks:
                o.close()
            tried = f" (and {', '.join(str(p) for p in alternates)})" if alternates else ""
            return [], [], f"cannot listen on {addr}:{port}{tried}: {getattr(exc, 'strerror', None) or exc}"
        socks.append((s, kind))
        held.append((addr, got, kind))
    return socks, held, None


def _ours(lock_path, run_id):
    if not run_id or not lock_path:
        return True
    try:
        with open(lock_path) as f:
            return json.load(f).get("run_id") == run_id
    except (OSError, ValueError):
        return False


#: The longest a prober lives, whatever it was asked (seconds): a detached prober of a controller that died ends
#: by then at the latest (sooner: its run's node lock is gone or taken, or every planned dial and accept is done).
MAX_HOLD = 120.0
#: Foreign connect sources kept in the result, per listener kind.
MAX_IGNORED = 10


def _is_ip(a):
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in a else socket.AF_INET, a)
        return True
    except (OSError, ValueError, TypeError):
        return False


def source_dialers(sources, own, resolver=resolve):
    """{kind: {address: set of dialers}}: the addresses a listener of that kind counts connects from, each with the
    planned dialers (their names, or addresses where unnamed) it stands for: the planned dialers' addresses
    ({kind: [{name, address}]}), the addresses their names (and non-IP addresses) resolve to here, and this node's
    own address `own` (it dials its own master port). `sources` None: every source counts."""
    if sources is None:
        return None
    out = {}
    for kind, dialers in sources.items():
        ok = {own: {"\0self"}} if own else {}
        for d in dialers or []:
            who = d.get("name") or d.get("address")
            for value in (d.get("address"), d.get("name")):
                if not value or not isinstance(value, str):
                    continue
                for a in [value] if _is_ip(value) else resolver(value):
                    ok.setdefault(a, set()).add(who)
        out[kind] = ok
    return out


def allowed_sources(sources, own, resolver=resolve):
    """{kind: set of addresses} a listener of that kind counts connects from (`source_dialers`' addresses)."""
    got = source_dialers(sources, own, resolver)
    return None if got is None else {k: set(v) for k, v in got.items()}


def inbound_count(srcs, dialers):
    """How many planned dialers the accepted connects from addresses `srcs` stand for: one per connect, but never
    more than the distinct dialers those addresses belong to (`dialers`: {address: set of dialers}), so that one
    dialer's extra connects from its other interfaces (the interface reach probe) do not count as another
    dialer's."""
    who = set()
    for a in srcs:
        who |= dialers.get(a, set())
    return min(len(srcs), len(who))


def _address_of(i, net=None):
    """An interface's IPv4 address for the reach probe: its first inside `net` (the cluster network), else its first;
    loopback and link-local (169.254.0.0/16) addresses are never used."""
    found = []
    for a in i.get("addrs") or []:
        local = a.get("local")
        if a.get("family") != "inet" or not isinstance(local, str) or not _is_ip(local):
            continue
        first = int(local.split(".")[0])
        if first == 127 or local.startswith("169.254."):
            continue
        found.append(local)
    if net is not None:
        for a in found:
            if ipaddress.ip_address(a) in net:
                return a
    return found[0] if found else None


def link_speed(ifname, sysfs="/sys"):
    """/sys/class/net/IF/speed in Mb/s; None where the driver does not say (virtual devices, -1, unreadable)."""
    try:
        with open(os.path.join(sysfs, "class/net", ifname, "speed")) as f:
            v = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return v if v > 0 else None


def reach_candidates(ifaces, cidr=None, sysfs="/sys"):
    """The interfaces the reach probe dials from, in interface-index order: up (flag UP, not operstate DOWN), not
    loopback, with an IPv4 address that is neither loopback nor link-local (a link-local address is never routed,
    so it is never the cluster address a plan writes; the controller's auto-selection check reports it when NCCL
    would pick it).
    Each as {ifname, address (the first inside `cidr`, else the first), speed (Mb/s or None)}."""
    net = network(cidr)
    out = []
    for i in sorted(ifaces or [], key=lambda x: x.get("index") or 0):
        name = i.get("name")
        if not name or i.get("kind") == "loopback" or "UP" not in (i.get("flags") or []):
            continue
        if i.get("operstate") == "DOWN":
            continue
        addr = _address_of(i, net)
        if addr:
            out.append({"ifname": name, "address": addr, "speed": link_speed(name, sysfs)})
    return out


def reach_extras(candidates, main_ifname):
    """The candidates the prober dials from besides its own socket (`main_ifname`): none when the node has one
    candidate (it pays nothing extra), else every other candidate, so each peer target costs (candidates - 1) more
    connects."""
    if len(candidates) < 2:
        return []
    return [c for c in candidates if c["ifname"] != main_ifname]


def reached(r):
    """Whether a connect reached the peer's host: it was accepted or refused by it (a TCP reset: the host answered;
    its prober may already have ended). A timeout, an ICMP unreachable or no route did not reach it."""
    return bool(r.get("ok")) or "ECONNREFUSED" in (r.get("error") or "")


#: How long a rolling dial that is the last its target's prober waits for (the plan's `closes`) waits for that
#: prober's listener to close, seconds (it closes at once, unless a dial or connect it waits for never comes).
CLOSE_WAIT = 1.0


def wait_closed(address, port, bind_address, bind_ifname, until, stop):
    """Connect to `address`:`port` until it no longer accepts (the listener is closed), `until`, or `stop`."""
    pause = 0.005
    while not stop.is_set():
        r = tcp_connect(address, port, bind_address, bind_ifname, max(0.05, min(1.0, until - time.time())))
        if not r["ok"] or time.time() + pause >= until:
            return
        stop.wait(pause)
        pause = min(0.05, pause * 2)


def parent_alive(parent):
    """The process that forked an inline prober still runs (the prober's parent is still it)."""
    return parent is None or os.getppid() == parent


def prober(socks, targets, expect, bind_address, bind_ifname, timeout, dial_until, hold_until, lock_path, run_id,
           stop=None, sources=None, parent=None, via=None, main_speed=None, early=None):
    """Accept on `socks` and dial every target (retrying until `dial_until`: peers start at slightly different
    times) until every dial is done and `expect` ({kind: count}) inbound connects from the planned `sources`
    arrived, or `hold_until` (at most MAX_HOLD from now), or the node lock no longer names this run, or the
    `parent` process is gone (an inline prober), or `stop` is set. Connects from other addresses are closed and
    listed (`ignored`), never counted. With `via` (`reach_extras`: the node's other candidate interfaces), each
    peer target is also dialled once from each of them (bound to the device and its address, after the main dial
    to that peer ended), and the result's `reach` says per interface whom it reached. Returns the result dict.

    `early` (the rolling probe, `rolling_split`): {targets: indices of the targets dialled within the task,
    dialers: {kind: names of the planned dialers heard within the task}, until: the task's deadline, send: called
    once with `early_result` when those dials are done and those dialers' connects arrived (or at `until`)}; the
    prober then goes on (the later targets' dials, the later dialers' connects) until its own end."""
    stop = stop or threading.Event()
    up_at = time.time()
    hold_until = min(float(hold_until), up_at + MAX_HOLD)
    dial_until = min(float(dial_until), hold_until)
    inbound = dict.fromkeys(expect, 0)
    seen = {}  # kind -> source addresses of the connects accepted so far
    ignored = {}
    allowed = {"value": None if sources is None else {k: {bind_address: {"\0self"}} for k in sources}}
    via = list(via or [])
    extra = [[None] * len(via) for _ in targets]  # per target, per `via` candidate: (result, device bound)
    main_bound = {}
    results = [None] * len(targets)
    kinds = {id(s): k for s, k in socks}

    def learn():  # names resolve in the background: a slow resolver never delays the listener or the dials
        allowed["value"] = source_dialers(sources, bind_address)

    if sources is not None:
        resolver = threading.Thread(target=learn)
        resolver.daemon = True
        resolver.start()

    def count():
        ok = allowed["value"]
        for kind, srcs in seen.items():
            good = [a for a in srcs if ok is None or a in ok.get(kind, ())]
            inbound[kind] = len(good) if ok is None else inbound_count(good, ok.get(kind, {}))
            bad = [a for a in srcs if a not in good]
            if bad:
                ignored[kind] = {"count": len(bad), "sources": sorted(set(bad))[:MAX_IGNORED]}
            else:
                ignored.pop(kind, None)

    def dial(i, t):
        first, attempts, r, last = time.time(), 0, None, None
        # the rolling probe's task part dials within the task's window, its later targets until the prober's
        until = min(float(early["dial_until"]), dial_until) if early and i in early["targets"] else dial_until
        # the peer's listener is on its probe port, or on an alternate when its node held that port already
        ports = [int(t["port"]), *(int(p) for p in t.get("alt_ports") or [])]
        rounds, port = 0, ports[0]
        while True:
            for port in ports:
                attempts += 1
                last = time.time()  # the start of the last attempt: the controller checks the listener was up then
                r = tcp_connect(t["address"], port, bind_address, bind_ifname, timeout, main_bound)  # a full timeout
                if r["ok"] or "ECONNREFUSED" not in (r["error"] or ""):
                    break  # an alternate is tried only where the port refused
            rounds += 1
            # only "connection refused" may mean the peer's listener is not up yet; any other answer (an ICMP
            # reject, a timeout) comes from the path itself, and repeating it would only meet ICMP rate limits
            # the retry interval grows 25 ms, 50, 100, then 200 ms: a peer that starts a moment later is found at once
            pause = min(0.2, 0.025 * 2 ** (rounds - 1))
            if (r["ok"] or "ECONNREFUSED" not in (r["error"] or "") or time.time() + pause >= until
                    or stop.is_set()):
                break
            stop.wait(pause)
        refused = not r["ok"] and "ECONNREFUSED" in (r["error"] or "")
        r.update(name=t.get("name"), address=t["address"], port=ports[0] if refused else port,
                 kind=t.get("kind", "peer"), attempts=attempts, first_try=round(first, 3), last_try=round(last, 3))
        if via and t.get("kind", "peer") == "peer" and not stop.is_set():
            dial_via(i, t, r["port"])  # where the main dial reached the peer's listener
        if r["ok"] and t.get("closes") and early is not None and i in early["targets"]:
            # this node's dial is the last the earlier node's rolling prober waits for (the plan's `closes`): the
            # task returns once that prober's listener is closed, so that no port of the run is held after it
            wait_closed(t["address"], r["port"], bind_address, bind_ifname, min(time.time() + CLOSE_WAIT,
                                                                             float(early["until"])), stop)
        results[i] = r
        poke()  # the main loop sees the dial done at once (not at its next select timeout)

    def dial_via(i, t, port):  # once from each other candidate, all at once: at most one connect timeout more
        def one(j, c):
            b = {}
            extra[i][j] = (tcp_connect(t["address"], port, c["address"], c["ifname"], timeout, b),
                           b.get("device", False))

        ths = [threading.Thread(target=one, args=(j, c)) for j, c in enumerate(via)]
        for th in ths:
            th.daemon = True
            th.start()
        for th in ths:
            th.join(timeout + 0.5)

    wake_r, wake_w = os.pipe()  # a dial thread's end wakes the main loop's select
    os.set_blocking(wake_w, False)
    wake_lock = threading.Lock()
    wake = {"w": wake_w}

    def poke():
        with wake_lock, contextlib.suppress(OSError):  # (a full pipe: the loop is awake already)
            if wake["w"] is not None:
                os.write(wake["w"], b"x")

    threads = [threading.Thread(target=dial, args=(i, t)) for i, t in enumerate(targets)]
    for th in threads:
        th.daemon = True
        th.start()
    last_check = 0.0
    heard = {}  # kind -> {planned dialer: the source address its first connect came from}

    def send_early():
        count()
        hear()
        early["sent"] = True
        got = early_result(targets, results, early, inbound, expect, ignored, heard, seen, up_at, hold_until,
                           dial_until)
        if via:
            idx = list(early["targets"])
            got["reach"] = reach_result([targets[i] for i in idx], got["connects"], [extra[i] for i in idx], via,
                                        bind_ifname, bind_address, main_speed, main_bound.get("device", False))
        early["send"](got)

    def hear():
        ok = allowed["value"] or {}
        for kind, srcs in seen.items():
            for a in srcs:
                for who in ok.get(kind, {}).get(a, ()):
                    heard.setdefault(kind, {}).setdefault(who, a)

    def later_done():
        hear()
        return all(who in heard.get(kind, {}) for kind, names in (early.get("later") or {}).items() if kind in expect
                   for who in names)

    while not stop.is_set():
        now = time.time()
        dials_done = all(r is not None for r in results)
        if early is not None and not early.get("sent"):
            hear()
            done = all(results[i] is not None for i in early["targets"]) and all(
                who in heard.get(kind, {}) for kind, names in early["dialers"].items() if kind in expect
                for who in names)
            if done and dials_done and later_done():
                break  # nothing after the task's part (the last node): listeners closed before the task returns
            if done or now >= early["until"]:
                send_early()
        if dials_done and all(inbound[k] >= n for k, n in expect.items()):
            break
        if early is not None and early.get("sent") and dials_done and later_done():
            break  # the rolling prober's later part is done
        if now >= hold_until:
            break
        if now - last_check > 0.5:
            last_check = now
            if not _ours(lock_path, run_id) or not parent_alive(parent):
                break
            count()  # names resolved meanwhile
        ready, _, _ = select.select([wake_r, *(s for s, _ in socks)], [], [], 0.1)
        if wake_r in ready:
            os.read(wake_r, 4096)
            ready.remove(wake_r)
        for s in ready:
            try:
                c, peer = s.accept()
                c.close()
                seen.setdefault(kinds[id(s)], []).append(peer[0] if isinstance(peer, tuple) else "")
            except OSError:
                pass
        if ready:
            count()
    down_at = time.time()
    for s, _ in socks:
        s.close()
    stop.set()
    if early is not None and early.get("release"):  # a rolling prober's listeners are closed: the lock can go
        with contextlib.suppress(Exception):
            early["release"]()
    for th in threads:
        th.join(timeout + 0.5)
    with wake_lock:  # a dial thread still running past its join writes nowhere (the descriptor may be reused)
        wake["w"] = None
        for fd in (wake_r, wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
    connects = []
    for i, t in enumerate(targets):
        r = results[i] or {"ok": False, "error": "not finished when the prober stopped", "seconds": None,
                           "name": t.get("name"), "address": t["address"], "port": int(t["port"]),
                           "kind": t.get("kind", "peer"), "attempts": 0, "first_try": None, "last_try": None}
        connects.append(r)
    count()
    if early is not None and not early.get("sent"):  # stopped before the task's part was done: what it has
        send_early()
    out = {"connects": connects, "inbound": inbound, "expected_inbound": expect, "ignored_inbound": ignored,
           "up_at": round(up_at, 3), "down_at": round(down_at, 3)}
    if via:
        out["reach"] = reach_result(targets, connects, extra, via, bind_ifname, bind_address, main_speed,
                                    main_bound.get("device", False))
    return out


#: Source addresses of a rolling listener's connects reported per kind (the reach probe's other interfaces).
MAX_SOURCES = 64


def rolling_split(targets, sources):
    """The rolling probe's task part: (indices of the `targets` not marked `after`, {kind: names of the planned
    `sources` not marked `after`}). The rest is left to the detached prober: its dials to later targets are seen
    by their listeners, the later dialers' connects by this one after the task returned."""
    now = [i for i, t in enumerate(targets) if not t.get("after")]
    dialers = {kind: sorted({d.get("name") or d.get("address") for d in ds or [] if not d.get("after")} - {None})
               for kind, ds in (sources or {}).items()}
    return now, dialers


def later_dialers(sources):
    """{kind: names of the planned `sources` marked `after`}: the connects a rolling prober still waits for once
    its task returned (an earlier dialer's connect that did not come within the task's window is not waited for:
    its verdict was returned)."""
    return {kind: sorted({d.get("name") or d.get("address") for d in ds or [] if d.get("after")} - {None})
            for kind, ds in (sources or {}).items()}


def early_result(targets, results, early, inbound, expect, ignored, heard, seen, up_at, hold_until, dial_until):
    """The rolling prober's result for its task: the connects it made to the earlier targets, the later ones it
    left to their listeners (`deferred`, dialled until `dial_until`), the planned dialers whose connects this
    listener saw (`inbound_from`: {kind: {dialer: source address}}) and every source address it saw (`inbound_sources`,
    at most MAX_SOURCES per kind); `down_at` is the listener's deadline (it stays up for the later dialers)."""
    connects, deferred = [], []
    for i, t in enumerate(targets):
        if i not in early["targets"]:
            deferred.append({"name": t.get("name"), "address": t["address"], "port": int(t["port"]),
                             "kind": t.get("kind", "peer")})
            continue
        connects.append(dict(results[i]) if results[i] is not None else {
            "ok": False, "error": "not finished when the task returned", "seconds": None, "name": t.get("name"),
            "address": t["address"], "port": int(t["port"]), "kind": t.get("kind", "peer"), "attempts": 0,
            "first_try": None, "last_try": None})
    return {"connects": connects, "deferred": deferred, "inbound": dict(inbound), "expected_inbound": dict(expect),
            "ignored_inbound": dict(ignored),
            "inbound_from": {k: {w: a for w, a in v.items() if w != "\0self"} for k, v in heard.items()},
            "inbound_sources": {k: sorted(set(v))[:MAX_SOURCES] for k, v in seen.items()},
            "inbound_planned": {k: sorted({d.get("name") or d.get("address") for d in ds or []} - {None})
                                for k, ds in (early.get("sources") or {}).items() if k in expect},
            "up_at": round(up_at, 3), "down_at": round(hold_until, 3), "dial_until": round(dial_until, 3)}


def reach_result(targets, connects, extra, via, main_ifname, main_address, main_speed, main_device):
    """{ifname: {address, speed, device (the device binding took effect), reached: [peer], failed: {peer: error}}}
    for the prober's own interface (its peer dials) and each `via` candidate."""
    def entry(address, speed, device):
        return {"address": address, "speed": speed, "device": bool(device), "reached": [], "failed": {}}

    out = {}
    if main_ifname:
        out[main_ifname] = entry(main_address, main_speed, main_device)
    for c in via:
        out[c["ifname"]] = entry(c["address"], c.get("speed"), True)
    for i, t in enumerate(targets):
        if t.get("kind", "peer") != "peer":
            continue
        peer = t.get("name") or t["address"]
        rows = [(main_ifname, connects[i], main_device)] if main_ifname else []
        rows += [(c["ifname"], *extra[i][j]) for j, c in enumerate(via) if extra[i][j] is not None]
        for ifname, r, device in rows:  # a candidate not dialled (the prober stopped first) neither reached nor failed
            e = out[ifname]
            e["device"] = e["device"] and bool(device)
            if reached(r):
                e["reached"].append(peer)
            else:
                e["failed"][peer] = r.get("error") or "failed"
    return out


RESULT_DIR_PREFIX = "ddpfix-probe-"
RESULT_NAME = "result.json"


def result_dir(base):
    """A new private directory for a detached prober's result (mkdtemp: a random name, mode 0700) in `base` (the
    node lock's directory, /run) or, where that cannot be written, the system's temporary directory. Returns the
    result file's path in it (not created yet)."""
    import tempfile

    for where in (base, None):
        try:
            return os.path.join(tempfile.mkdtemp(prefix=RESULT_DIR_PREFIX, dir=where), RESULT_NAME)
        except OSError:
            if where is None:
                raise
    raise OSError("no directory for the prober's result")


def private_result_path(result_path):
    """Why `result_path` is not a detached prober's result file in a private directory of ours (a directory
    named ddpfix-probe-*, not a link, owned by this user, mode 0700), or None when it is."""
    d, name = os.path.split(result_path or "")
    if name != RESULT_NAME or not os.path.basename(d).startswith(RESULT_DIR_PREFIX):
        return f"{result_path!r} is not a ddpfix prober result path"
    try:
        st = os.lstat(d)
    except OSError as exc:
        return f"{d}: {exc.strerror}"
    import stat as stat_

    if not stat_.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat_.S_IMODE(st.st_mode) != 0o700:
        return f"{d} is not a private directory of uid {os.geteuid()} (mode 0700, not a link)"
    return None


def write_result(result_path, data):
    """Write the result file: a temporary file created O_EXCL|O_NOFOLLOW (0600) in the private directory, then
    renamed into place."""
    tmp = f"{result_path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.rename(tmp, result_path)


def _prober_child():
    """In a forked prober: its own session, stdio on /dev/null, SIGTERM stops it (the returned event), SIGINT and
    SIGHUP (its SSH session ending) do not."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return stop


def _read_json(fd):
    """Everything from pipe `fd` until its writer closes it, as JSON: (value, None) or (None, why)."""
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    try:
        return json.loads(b"".join(chunks).decode()), None
    except ValueError:
        return None, "the prober ended without a result"


def fork_prober(socks, args, result_path=None):
    """Run `prober` in a forked child (not a new interpreter). With `result_path` (from `result_dir`) the child is
    detached (new session, stdio on /dev/null) and writes its result there (`write_result`) when it ends or gets
    SIGTERM; returns (pid, None). Without, returns (pid, fd): the child writes its JSON result to the pipe `fd` and
    exits, and ends early when this process is gone."""
    rfd, wfd = (None, None) if result_path else os.pipe()
    parent = None if result_path else os.getpid()
    pid = os.fork()
    if pid:
        for s, _ in socks:
            s.close()
        if wfd is not None:
            os.close(wfd)
        return pid, rfd
    # the child
    try:
        if rfd is not None:
            os.close(rfd)
        stop = _prober_child()
        result = prober(socks, stop=stop, parent=parent, **args)
        data = json.dumps(result).encode()
        if result_path:
            write_result(result_path, data)
        else:
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view):]
            os.close(wfd)
    finally:
        os._exit(0)


def wait_inline(pid, fd):
    """Read the inline prober's result and reap it."""
    got = _read_json(fd)
    os.waitpid(pid, 0)
    return got


def collect_detached(pid, start, result_path, wait_s):
    """The detached prober's result: wait up to `wait_s` for it to finish by itself, then stop it (SIGTERM, it
    writes what it has) and read its result file; the file and its private directory are removed. Only our prober
    is signalled (its PID and start time); a path that is not a private result directory of ours is refused."""
    bad = private_result_path(result_path)
    if bad:
        return None, f"refused: {bad}"
    deadline = time.time() + wait_s
    while time.time() < deadline and not os.path.exists(result_path):
        time.sleep(0.05)
    if not os.path.exists(result_path) and pid and start and proc_start(pid) == start:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
        until = time.time() + 3
        while time.time() < until and not os.path.exists(result_path):
            time.sleep(0.05)
    if pid and start:  # gone (or a zombie of a reparented child) before this returns, so its ports are free
        until = time.time() + 2
        while time.time() < until and proc_start(pid) == start:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except (OSError, IndexError):
                break
            time.sleep(0.05)
    try:
        fd = os.open(result_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd) as f:
            result = json.load(f)
        return result, None
    except (OSError, ValueError) as exc:
        return None, f"no prober result at {result_path}: {exc}"
    finally:
        d = os.path.dirname(result_path)
        for name in os.listdir(d) if os.path.isdir(d) else ():
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(d, name))
        with contextlib.suppress(OSError):
            os.rmdir(d)


def fork_rolling(socks, args, lock_path, run_id):
    """Run `prober` in a forked, detached child (new session, stdio on /dev/null) that sends its task part
    (`early_result`) over a pipe as soon as it is done and then goes on by itself (`args["early"]`: `rolling_split`'s
    targets and dialers, and the task's deadline `until`); when it ends it releases the node lock if the lock still
    names its run and was lent to it (`ddpfix_lock.give_back`). Returns (pid, fd): `wait_early` reads the pipe."""
    from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import give_back

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid:
        for s, _ in socks:
            s.close()
        os.close(wfd)
        return pid, rfd
    try:
        os.close(rfd)
        stop = _prober_child()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

        def send(result):
            with contextlib.suppress(OSError):
                view = memoryview(json.dumps(result).encode())
                while view:
                    view = view[os.write(wfd, view):]
            with contextlib.suppress(OSError):
                os.close(wfd)

        def release():
            if lock_path and run_id:
                give_back(lock_path, run_id, os.getpid())

        early = dict(args.pop("early"), send=send, release=release)
        try:
            prober(socks, stop=stop, parent=None, early=early, **args)
        finally:
            with contextlib.suppress(Exception):
                release()  # (again: a no-op once it was given back)
    finally:
        os._exit(0)


def wait_early(pid, fd):
    """The rolling prober's task part (`fork_rolling`): read until it closes the pipe. The prober goes on; it is
    not reaped here (it outlives this process, which is gone before it ends)."""
    return _read_json(fd)
