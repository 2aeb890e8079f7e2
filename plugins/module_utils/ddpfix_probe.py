"""The node side of the audit's active probes: one forked prober per node (listener + dialer), name resolution and
routes. Collection only: what a result means is decided on the controller (checks.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import resolve

_REASONS = {"ECONNREFUSED": "connection refused", "EHOSTUNREACH": "no route to host (ICMP host prohibited/unreachable)",
            "ENETUNREACH": "network unreachable", "ECONNRESET": "connection reset"}


def tcp_connect(address, port, bind_address, bind_ifname, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    started = time.time()
    try:
        if bind_ifname:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, 25, bind_ifname.encode() + b"\0")  # SO_BINDTODEVICE
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


def bind_listeners(specs):
    """[(addr, port, kind, optional)] -> (sockets [(sock, kind)], held [(addr, port, kind)], error or None)."""
    socks, held = [], []
    for addr, port, kind, optional in specs:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only: a live listener still fails the bind
        try:
            s.bind((addr, int(port)))
        except OSError as exc:
            s.close()
            if optional and exc.errno == errno.EADDRINUSE:
                continue
            for o, _ in socks:
                o.close()
            return [], [], f"cannot listen on {addr}:{port}: {exc.strerror or exc}"
        s.listen(1024)
        socks.append((s, kind))
        held.append((addr, int(port), kind))
    return socks, held, None


def _ours(lock_path, run_id):
    if not run_id or not lock_path:
        return True
    try:
        with open(lock_path) as f:
            return json.load(f).get("run_id") == run_id
    except (OSError, ValueError):
        return False


def prober(socks, targets, expect, bind_address, bind_ifname, timeout, dial_until, hold_until, lock_path, run_id,
           stop=None):
    """Accept on `socks` and dial every target (retrying until `dial_until`: peers start at slightly different
    times) until every dial is done and `expect` ({kind: count}) inbound connects arrived, or `hold_until`, or the
    node lock no longer names this run, or `stop` is set. Returns the result dict."""
    stop = stop or threading.Event()
    up_at = time.time()
    inbound = dict.fromkeys(expect, 0)
    results = [None] * len(targets)
    kinds = {id(s): k for s, k in socks}

    def dial(i, t):
        first, attempts, r, last = time.time(), 0, None, None
        while True:
            attempts += 1
            last = time.time()  # the start of the last attempt: the controller checks the listener was up then
            r = tcp_connect(t["address"], t["port"], bind_address, bind_ifname, timeout)  # a full timeout each
            # only "connection refused" may mean the peer's listener is not up yet; any other answer (an ICMP
            # reject, a timeout) comes from the path itself, and repeating it would only meet ICMP rate limits
            # the retry interval grows 25 ms, 50, 100, then 200 ms: a peer that starts a moment later is found at once
            pause = min(0.2, 0.025 * 2 ** (attempts - 1))
            if (r["ok"] or "ECONNREFUSED" not in (r["error"] or "") or time.time() + pause >= dial_until
                    or stop.is_set()):
                break
            stop.wait(pause)
        r.update(name=t.get("name"), address=t["address"], port=int(t["port"]), kind=t.get("kind", "peer"),
                 attempts=attempts, first_try=round(first, 3), last_try=round(last, 3))
        results[i] = r

    threads = [threading.Thread(target=dial, args=(i, t)) for i, t in enumerate(targets)]
    for th in threads:
        th.daemon = True
        th.start()
    last_check = 0.0
    while not stop.is_set():
        now = time.time()
        dials_done = all(r is not None for r in results)
        if dials_done and all(inbound[k] >= n for k, n in expect.items()):
            break
        if now >= hold_until:
            break
        if now - last_check > 0.5:
            last_check = now
            if not _ours(lock_path, run_id):
                break
        if not socks:
            stop.wait(0.1)
            continue
        ready, _, _ = select.select([s for s, _ in socks], [], [], 0.1)
        for s in ready:
            try:
                c, _ = s.accept()
                c.close()
                inbound[kinds[id(s)]] = inbound.get(kinds[id(s)], 0) + 1
            except OSError:
                pass
    down_at = time.time()
    for s, _ in socks:
        s.close()
    stop.set()
    for th in threads:
        th.join(timeout + 0.5)
    connects = []
    for i, t in enumerate(targets):
        r = results[i] or {"ok": False, "error": "not finished when the prober stopped", "seconds": None,
                           "name": t.get("name"), "address": t["address"], "port": int(t["port"]),
                           "kind": t.get("kind", "peer"), "attempts": 0, "first_try": None, "last_try": None}
        connects.append(r)
    return {"connects": connects, "inbound": inbound, "expected_inbound": expect, "up_at": round(up_at, 3),
            "down_at": round(down_at, 3)}


def fork_prober(socks, args, result_path=None):
    """Run `prober` in a forked child (not a new interpreter). With `result_path` the child is detached (new
    session, stdio on /dev/null) and writes its result there (atomically) when it ends or gets SIGTERM; returns
    (pid, None). Without, returns (pid, fd): the child writes its JSON result to the pipe `fd` and exits."""
    rfd, wfd = (None, None) if result_path else os.pipe()
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
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        result = prober(socks, stop=stop, **args)
        data = json.dumps(result).encode()
        if result_path:
            tmp = f"{result_path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, data)
            os.close(fd)
            os.rename(tmp, result_path)
        else:
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view):]
            os.close(wfd)
    finally:
        os._exit(0)


def wait_inline(pid, fd):
    """Read the inline prober's result and reap it."""
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks).decode()), None
    except ValueError:
        return None, "the prober ended without a result"


def collect_detached(pid, start, result_path, wait_s):
    """The detached prober's result: wait up to `wait_s` for it to finish by itself, then stop it (SIGTERM, it
    writes what it has) and read its result file; the file is removed. Only our prober is signalled (its PID and
    start time)."""
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
        with open(result_path) as f:
            result = json.load(f)
        os.unlink(result_path)
        return result, None
    except (OSError, ValueError) as exc:
        return None, f"no prober result at {result_path}: {exc}"
