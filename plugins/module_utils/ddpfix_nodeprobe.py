"""The probe as ddpfix_node_facts runs it on a node: bind the listeners, fork the prober, then collect its result.

- `start_probe(spec, cluster, master_port, listening, lock_path, run_id, ifaces)`: the listeners and the prober.
- `finish_probe(spec, started, cluster)`: name resolution and route deviations, then (inline) the prober's result.
- `probe_only(p)`: the module's option probe_only (the second probe task at the nodes' cluster addresses).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import time

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import lend
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import (
    cluster_interface,
    interface_facts,
    listening_ports,
    run_command,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_probe import (
    bind_listeners,
    deviations,
    fork_prober,
    fork_rolling,
    later_dialers,
    proc_start,
    reach_candidates,
    reach_extras,
    result_dir,
    rolling_split,
    wait_early,
    wait_inline,
)


def command_why(what, rc, err):
    """One line saying why a command failed: `what: <its first stderr line>`, not installed (127), timed out (124)."""
    line = next((ln.strip() for ln in (err or "").splitlines() if ln.strip()), "") or f"rc={rc}"
    if rc == 127:
        line = f"not installed ({line})"
    elif rc == 124 or "timed out" in line.lower():
        line = f"timed out ({line})"
    return f"{what}: {line[:200]}"


def read_or_why(path):
    """(text, None) or (None, why): a missing file is (None, None), any other failure names its reason."""
    try:
        with open(path) as f:
            return f.read(), None
    except OSError as exc:
        if getattr(exc, "errno", None) == 2:  # ENOENT
            return None, None
        return None, "{}: {}".format(path, getattr(exc, "strerror", None) or exc)
    except UnicodeDecodeError as exc:
        return None, f"{path}: not text ({exc})"


def ip_addr_show():
    """(interfaces as interface_facts returns them, rc of `ip`, why they were not read or None). `-d`:
    linkinfo.info_kind (bridge, bond, vlan, veth...)."""
    rc, out, err = run_command(["ip", "-j", "-d", "addr", "show"])
    why = None if rc == 0 else command_why("ip -j -d addr show", rc, err)
    try:
        interfaces = json.loads(out) if rc == 0 else []
    except ValueError:
        interfaces, why = [], "ip -j addr show: unparsable JSON"
    return interface_facts(interfaces, lambda name: os.path.exists(f"/sys/class/net/{name}/device")), rc, why


def is_local_address(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((addr, 0))
        return True
    except (OSError, ValueError):
        return False
    finally:
        s.close()


def start_probe(spec, cluster, master_port, listening, lock_path, run_id, ifaces=None):
    """Bind this node's listeners (the probe port the controller chose, on the cluster address and on the address
    the controller dials, when that is another local address; the master port on the master unless a job holds it)
    and fork the prober. With more than one candidate interface among `ifaces` (`reach_candidates`), the prober also
    dials each peer target from each other candidate (the interface reach probe). Returns {facts, pid, fd,
    detach}."""
    addr = cluster["address"]
    port = int(spec.get("port") or 0)
    alternates = [int(p) for p in spec.get("alt_ports") or []]  # when this node holds the probe port already
    specs = []
    if port:
        specs.append((addr, port, "peer", False, alternates))
        dialled = spec.get("self_address") or ""
        if dialled and dialled != addr and is_local_address(dialled):
            specs.append((dialled, port, "peer", False, alternates))
    if master_port and master_port not in listening:
        specs.append((addr, master_port, "master", True))  # skipped if a job binds it meanwhile
    socks, held, error = bind_listeners(specs)
    listener = {
        "port": next((p for _, p, k in held if k == "peer"), None),  # the probe port, or the alternate taken
        "master_port_listening": any(k == "master" for _, _, k in held),
        "error": error,
        "mode": "inline",
    }
    detach = bool(spec.get("detach"))
    # forks below the play's hosts: the rolling probe (one task per node, no collection) unless the plan asks for
    # the detached prober that a second task collects (probe.rolling false)
    rolling = detach and spec.get("rolling", True) is not False
    if detach:
        listener["mode"] = "rolling" if rolling else "detached"
    expect = {}
    if listener["port"]:
        expect["peer"] = int(spec.get("expect_peers") or 0)
    if listener["master_port_listening"]:
        expect["master"] = int(spec.get("expect_master") or 0)
    now = time.time()
    wait = float(spec.get("wait") or 10)
    timeout = float(spec.get("timeout") or 2.0)
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
    if rolling:
        # the task's part: the dials to the targets that started before this node (their listeners are up) and the
        # connects of the planned dialers that started before it, within the inline probe's window; the prober
        # goes on for the later ones (seen by their listeners, or by this one after the task returned)
        early_targets, early_dialers = rolling_split(args["targets"], args["sources"] or {})
        args["early"] = {"targets": early_targets, "dialers": early_dialers, "sources": args["sources"] or {},
                         "later": later_dialers(args["sources"] or {}),
                         "dial_until": now + wait,
                         "until": now + wait + timeout + 1}
        pid, fd = fork_rolling(socks, args, lock_path, run_id)
        start = proc_start(pid)
        if run_id and lock_path:  # the prober releases the lock when it ends; another run waits for it meanwhile
            listener["lock_lent"] = lend(lock_path, run_id, pid, start, args["hold_until"])
        listener.update(pid=pid, start=start)
        return {"facts": listener, "pid": pid, "fd": fd, "detach": True, "rolling": True}
    result_path = None
    if detach:  # a private directory (mkdtemp, 0700) in /run, else the system's temporary directory
        result_path = result_dir(os.path.dirname(lock_path) or "/run")
    pid, fd = fork_prober(socks, args, result_path)
    start = proc_start(pid)
    if detach:
        listener.update(pid=pid, start=start, result_path=result_path)
    return {"facts": listener, "pid": pid, "fd": fd, "detach": detach}


def finish_probe(spec, started, cluster):
    """Resolution and route deviations, then (inline) the prober's result."""
    out = deviations(spec.get("expected") or {}, spec.get("me") or "", cluster.get("ifname") or "")
    if started.get("rolling"):
        result, error = wait_early(started["pid"], started["fd"])
        if result is None:
            out["error"] = error
        else:
            out.update(result)
    elif not started["detach"]:
        result, error = wait_inline(started["pid"], started["fd"])
        if result is None:
            out["error"] = error
        else:
            out.update(result)
    return out


def probe_facts(cluster, error=None):
    """The probe's facts before (or without) a probe."""
    return {"address": cluster.get("address"), "port": None, "master_port_listening": False, "pid": None,
            "error": error}


def probe_only(p):
    """The probe alone (option probe_only): the interfaces and listening ports it needs, then the probe, as the
    facts' readers run it (its result is what the facts hold as `probe`)."""
    ifaces, rc, why = ip_addr_show()
    cluster = cluster_interface(ifaces, p["cluster_cidr"], p["master_address"], p["socket_ifname"])
    probe = probe_facts(cluster, why if rc != 0 else None)
    if not p.get("probe") or not cluster.get("address"):
        return probe
    tcp, _ = read_or_why("/proc/net/tcp")
    tcp6, _ = read_or_why("/proc/net/tcp6")
    started = start_probe(p["probe"], cluster, p["master_port"] if p["is_master"] else None,
                          listening_ports(tcp or "", tcp6 or ""), p["lock_path"], p["run_id"], ifaces)
    probe.update(started["facts"])
    probe.update(finish_probe(p["probe"], started, cluster))
    return probe
