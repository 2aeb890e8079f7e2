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
    call and releases it before returning (a rolling prober releases it when it ends; a collected detached prober
    keeps it until C(ddpfix_probe) collects the result).
  - "With I(probe), also probes the network in the same call: binds a listener on the probe port the controller chose
    (and the master port on the master when it is free), forks a prober that dials the master port and the ring peers
    in I(probe.targets) with retries until I(probe.wait) seconds and accepts its expected inbound connects, resolves
    the names of I(probe.expected) and routes to their addresses (reporting only deviations), then waits for the
    prober and returns. Only connects from the planned dialers (I(probe.sources)) count toward the expected inbound
    totals; others are closed and listed (C(ignored_inbound)). An inline prober ends when this module's process is
    gone. With I(probe.detach) (forks below the play's hosts) the probe is rolling: the call returns once the prober
    dialled the targets that start before this node in the play's order and heard the planned dialers that start
    before it (I(probe.targets) and I(probe.sources) entries without C(after)), within the inline window; the
    prober goes on, detached, for the later ones (its dials to later targets are returned as C(deferred) and seen
    by their listeners, which return C(inbound_from), C(inbound_planned) and C(inbound_sources)) until its later
    dials and its later dialers' connects are done, the node lock no longer names this run, or I(probe.hold)
    seconds (at most 120); the node lock is lent to it meanwhile and released by it when it ends. With
    I(probe.rolling=false) the detached prober instead writes its whole result into a private directory (mkdtemp,
    mode 0700, in /run) that C(ddpfix_probe) reads and removes when it collects and stops it.
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
      - "The probe, as the controller planned it: port (the listener port), alt_ports (the ports the listener takes
        instead, in order, when this node holds the port already), self_address (the address peers dial here),
        targets (list of {name, address, port, alt_ports, kind, after, closes}: a peer's alternates are dialled
        where its port refuses; after, the target starts later in play order; closes, this node is the last whose
        probe meets the target's rolling prober, so its dial waits until that prober's listeners are closed),
        expect_peers and expect_master (inbound connects),
        expected ({name: address} of every node), me (this node's name), timeout (one connect), wait (the dial and
        accept deadline, seconds), detach (bool), hold (a detached prober's hard limit, seconds, at most 120) and
        sources ({peer: [{name, address}], master: [...]}, the planned dialers of this node's listeners)."
      - Omitted or null - no probe.
    type: dict
  sysfs_root: {description: Root of the sysfs tree the fabric facts read (the lab and tests point it at a synthetic
      tree)., type: str, default: /sys}
  dev_root: {description: Root of the device tree the fabric facts read (C(<dev_root>/infiniband/uverbs*))., type: str,
      default: /dev}
  python: {description: "Interpreter with torch (ddp_python): a path or command name, or the argv the jobs start it
      with (a list, e.g. a container runtime's C([docker, run, --rm, --network, host, IMAGE, python3])), run without a
      shell: started once for torch's version, CUDA build and NCCL version (C(torch)), a single word cached in
      /run/ddpfix/torch by its path and mtime; its NCCL version also serves C(fabric).", type: raw, default: ''}
  fi_info: {description: Path of libfabric's fi_info (empty - PATH, then /opt/amazon/efa/bin)., type: str, default: ''}
  launcher_units: {description: "systemd units that launch training; their LimitNOFILE is read (C(limits)), their
      LimitMEMLOCK when RDMA devices exist; their open-file limit drop-ins are read for remediate's dry run.",
      type: list, elements: str, default: []}
  nofile_path: {description: "The pam_limits drop-in of the open-file limit that remediate writes (the role
      ddpfix_limits' ddpfix_limits_nofile_path); read, with the launcher units' drop-ins, for remediate's dry run
      (C(limits.nofile_dropins)); empty: that role's default (module_utils ddpfix_readers NOFILE_PATH)", type: str,
      default: ''}
  probe_only:
    description:
      - Only probe (with I(probe)), reading no more than the interfaces and listening ports the probe needs, and return
        the result as C(probe) (not as facts). The audit's second task when the probes dial the nodes' cluster
        addresses, known from their facts only (I(cluster_cidr) is not the network Ansible reaches the nodes on).
    type: bool
    default: false
  profile:
    description:
      - Also return C(profile), the wall time of each fact reader (module_utils ddpfix_readers) and of the module
        (ms), for profiling the audit on a node. Also on when the node's environment has C(DDPFIX_FACTS_PROFILE=1).
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
profile:
  description: With I(profile), ms per reader (C(read_interfaces), ..., C(finish_probing)), C(total_ms) (from the
      module's imports to its exit), C(since_process_start_ms) (also the interpreter's start and the payload's
      imports) and C(cpu_ms) (the module's process and the commands it ran).
  returned: with I(profile)
  type: dict
probe:
  description: With I(probe_only), the probe's facts (as C(ddpfix_node.probe) holds them otherwise).
  returned: with I(probe_only)
  type: dict
ansible_facts:
  description: C(ddpfix_node), a dict with keys hostname, fqdn, machine_id, interfaces, cluster, resolve_self,
      hosts_lines (the /etc/hosts lines, comments and blanks left out, as one string with a line per entry, its
      line number, a tab and its text, which the controller parses into C(hosts_file) entries {line, addr, names,
      text}; C(schema) 2, where schema 1 returned those entries as C(hosts_file); with a probe, only the lines
      naming the node or a name that resolved other than expected, or mapping an address it dials or one of
      I(probe.hosts_addresses), and C(hosts_file_scope) is relevant; else the whole file), hosts_file_scope,
      hosts_block_sha256 (SHA-256 of ddpfix's managed block in /etc/hosts, null without one, so that nodes compare
      blocks without returning them),
    sysctl, listening, time, firewall, env_file, fabric, probe, now, errors, unread.
    C(limits) holds the open-file limit (RLIMIT_NOFILE) of the SSH session and of each launcher unit, and
    (nofile_dropins) the drop-ins remediate writes for it, as they are, and which of them cannot be written;
    C(sysctl.arp) net.ipv4.conf.{all,IFACE}.arp_ignore/arp_announce; C(torch) the torch version, CUDA/ROCm build and
    NCCL version of I(python) (C(cached) when read from the cache; C(absent) when the interpreter ran and has no torch).
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
    evidence of "nothing there". The controller adds C(egress) for a node whose own firewall's egress it read but
    could not decide (a rule it does not model, its time budget).
  returned: always
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import absent as release_lock
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_lock import present as take_lock

# resolve, block_digest: the controller (`ddpfix check --local`, its tests) takes them from here, as the node runs them
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import (
    pack_hosts_entries,
    resolve,  # noqa: F401
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeprobe import probe_only
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_readers import (  # noqa: F401
    READERS,
    block_digest,
    run_readers,
)

_T0 = time.monotonic()  # the module's start


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
            python=dict(type="raw", default=""),
            launcher_units=dict(type="list", elements="str", default=[]),
            nofile_path=dict(type="str", default=""),
            fi_info=dict(type="str", default=""),
            probe_only=dict(type="bool", default=False),
            profile=dict(type="bool", default=False),
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
    profile = {} if p["profile"] or os.environ.get("DDPFIX_FACTS_PROFILE") == "1" else None
    try:
        out = {"probe": probe_only(p)} if p["probe_only"] else {
            "ansible_facts": {"ddpfix_node": collect(p, profile)}}
        node = out.get("ansible_facts", {}).get("ddpfix_node", {})
        if isinstance(node.get("hosts_file"), list):  # sent as one string (the controller parses it back)
            node["hosts_lines"] = pack_hosts_entries(node.pop("hosts_file"))
            node["schema"] = 2  # schema 2: hosts_file travels as hosts_lines
        for files in (node.get("env_file"), (node.get("limits") or {}).get("nofile_dropins")):
            if lock is not None and lock.get("unlocked") and isinstance(files, dict):  # remediate's pre-flight: refused
                files["unwritable"] = dict(files.get("unwritable") or {}, **{
                    p["lock_path"]: "the node lock cannot be taken: {}".format(lock["unlocked"])})
    finally:
        if lock is not None and not detached:  # a detached prober's collect task releases it
            release_lock(p["lock_path"], holder)
    if profile is not None:
        out["profile"] = dict(profile, **process_times())
    module.exit_json(changed=False, lock=lock, **out)


def process_times():
    """The module's own times, ms: since its process started (the interpreter, the AnsiballZ payload, the imports;
    /proc/self/stat, in clock ticks) and since this file's imports were done, and its CPU time."""
    out = {"total_ms": round((time.monotonic() - _T0) * 1000, 1)}
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        out["since_process_start_ms"] = round((uptime - start_ticks / os.sysconf("SC_CLK_TCK")) * 1000, 1)
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    out["cpu_ms"] = round((t.user + t.system + t.children_user + t.children_system) * 1000, 1)
    return out


def collect(p, profile=None):
    """The node's facts for these parameters (the module's options): every reader of `READERS` in turn (module_utils
    ddpfix_readers), each returning its facts and what it could not read. Also run in-process by `ddpfix check
    --local`. With a `profile` dict: each reader's wall time in ms, under its name."""
    got, unread = run_readers(p, READERS, profile)
    facts = {"schema": 1}
    facts.update((k, v) for k, v in got.items() if not k.startswith("_"))
    facts.update(
        now=time.time(),
        # seconds from the module's start to the clock reading above (the controller narrows its task window by it)
        now_elapsed=round(time.monotonic() - _T0, 3),
        errors=[u["reason"] for u in unread],
        unread=unread + list(facts["firewall"].get("unread") or []),
    )
    return facts


if __name__ == "__main__":
    main()
