"""Jinja filter: what one node probes, from the inventory alone (k*N connections, not N^2), before any node ran."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import json
import re

from ansible.module_utils.parsing.convert_bool import boolean

_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def _name_ok(n):
    """An RFC 1123 host name: only such names are resolved on the nodes."""
    if not isinstance(n, str) or not n or len(n) > 253:
        return False
    labels = n.split(".")
    return all(_LABEL.match(lbl) for lbl in labels) and not all(lbl.isdigit() for lbl in labels)


def _addr_ok(a):
    try:
        ipaddress.ip_address(f"{a}")
        return isinstance(a, str)
    except ValueError:
        return False


#: How many ports after the probe port a listener may take instead (a node's own connection may hold the port: the
#: probe port is a random one of the ephemeral range, where the node's outgoing connections get theirs).
ALTERNATES = 2


def alternate_ports(port, master_port):
    """The next ALTERNATES ports after `port` (wrapping below 65536 to 1024), never the master port."""
    out, p = [], int(port)
    while len(out) < ALTERNATES:
        p = p + 1 if p < 65535 else 1024
        if p != int(master_port) and p != int(port):
            out.append(p)
    return out


def ddpfix_probe_plan(play_hosts, me, order, addresses, master, master_port, peers, port):
    """The `probe` option of ddpfix_node_facts for host `me`.

    - `play_hosts`: the hosts of this play (ansible_play_hosts_all: --limit applies); `order`: the rank order (the
      ring follows it); `addresses`: {host: ansible_host} (a host missing there is dialled by its name).
    - `after` (targets and sources): the host comes later than `me` in the play's order (see `ddpfix_node_facts`'s
      rolling probe, with forks below the play's hosts); `closes` (targets): `me` is the last host in play order
      whose probe meets that target's after it started (dialled by it or dialling it), so the target's rolling
      prober ends with `me`'s dial: `me`'s task waits (briefly) until that listener is closed, and a run never
      returns while a prober of it still holds a port (the master port a launch started next binds);
    - targets: the master port on the master, and the probe `port` of the next `peers` hosts of the ring (among the
      play's hosts), so each listener is dialled by `peers` others and the cost is (1 + peers) * N connections
      (`port` + 1 when `port` is the master port); `alt_ports`, the ports a listener takes instead when its node
      holds the probe port already (another program's connection from the same address), which its dialers try
      when the probe port refuses;
    - expect_peers / expect_master: the inbound connects this node waits for;
    - sources: {peer: [...], master: [...]}, the planned dialers of this node's listeners ({name, address}): only
      connects from their addresses (or what their names resolve to on the node) count toward those totals;
    - expected: {name: address} of every other host whose name is a host name (address '' when not an IP): the node
      reports only names that resolve differently and routes that deviate;
    - hosts_addresses: the addresses of hosts outside the play (--limit) this node reports the /etc/hosts lines of
      (each such address by two of the play's hosts, round-robin: O(N) lines in all), as it does for the addresses
      it dials (shown as evidence; the hosts block names a node that was not read by its inventory name only).
    """
    addresses = addresses or {}
    # play order (the linear strategy starts hosts in it): with forks below the hosts, a target later than `me`
    # starts after it, so its prober's dial to it is observed at that target's listener (`after`), and a planned
    # dialer later than `me` dials this node after this node's task may have returned
    pos = {h: i for i, h in enumerate(play_hosts or [])}

    def after(h):  # {"after": True} for such a host, else nothing (the plan stays as small as it was)
        return {"after": True} if pos.get(h, -1) > pos.get(me, -1) else {}

    port = int(port) if int(port) != int(master_port) else int(port) + 1  # the master's listener has the master port
    alt_ports = alternate_ports(port, int(master_port))
    in_play = set(play_hosts or [])
    ring = [h for h in (order or []) if h in in_play] or list(play_hosts or [])

    def addr(h):
        return str(addresses.get(h) or h)

    targets = []
    dialers = {"peer": [], "master": []}  # who dials this node's listeners: only their connects count
    k = min(int(peers), max(0, len(ring) - 1))
    at = {h: i for i, h in enumerate(ring)}

    def ring_peers(j, direction):
        """The `k` hosts after (direction 1: the ones it dials) or before (-1: the ones that dial it) ring place j."""
        return [ring[(j + direction * step) % len(ring)] for step in range(1, k + 1)]

    def last_to_meet(h):
        """The host latest in play order among those whose probe meets h's after h started (h dials it, or it
        dials h): a rolling prober's listeners close once that host's part is done."""
        j = at.get(h)
        if j is None:
            return None
        near = set(ring_peers(j, 1)) | set(ring_peers(j, -1))
        near |= set(ring) if h == master else ({master} & in_play)
        later = [x for x in near - {h} if pos.get(x, -1) > pos.get(h, -1)]
        return max(later, key=lambda x: pos[x]) if later else None

    def closes(h):  # {"closes": True}: `me` is that host for h (the rolling dial waits for h's listeners to close)
        return {"closes": True} if h != me and last_to_meet(h) == me else {}

    if master in in_play:
        targets.append({"name": master, "address": addr(master), "port": int(master_port), "kind": "master",
                        **after(master), **closes(master)})
    if me in at:
        for h in ring_peers(at[me], 1):
            targets.append({"name": h, "address": addr(h), "port": int(port), "alt_ports": alt_ports, "kind": "peer",
                            **after(h), **closes(h)})
        for back in ring_peers(at[me], -1):  # the `k` nodes before me in the ring dial me
            dialers["peer"].append({"name": back, "address": addr(back), **after(back)})
    if me == master:
        dialers["master"] = [{"name": h, "address": addr(h), **after(h)} for h in ring]
    expected = {}
    for h in ring:
        if h != me and _name_ok(h):
            expected[h] = addr(h) if _addr_ok(addr(h)) else ""
    outside = [addr(h) for h in (order or []) if h not in in_play and _addr_ok(addr(h))]
    hosts_addresses = []
    if me in ring:
        i = ring.index(me)
        hosts_addresses = [a for j, a in enumerate(outside) if i in {j % len(ring), (j + 1) % len(ring)}]
    return {
        "me": me,
        "hosts_addresses": hosts_addresses,
        "port": int(port),
        "alt_ports": alt_ports,
        "self_address": addr(me) if _addr_ok(addr(me)) else "",
        "targets": targets,
        "expect_peers": k if me in ring else 0,
        "expect_master": len(ring) if me == master else 0,
        "expected": expected,
        "sources": dialers,
    }


def ddpfix_facts_args(plan, me, node=None):
    """The arguments of node `me`'s facts task (module ddpfix_node_facts): those decided for the whole play, and the
    node's own (`node`, a dict of them, added as they are).

    `plan` is the role's settings, templated once per play: either the facts role's plan task's `data`
    (roles/ddpfix_facts/tasks/facts.yml) with hosts (the play's, ansible_play_hosts_all), order, addresses, master,
    master_address, master_port, cluster_cidr, env_path, lock_path, lock_holder, lock_stale_minutes, nofile_path,
    profile, probe (on/off), probe_from_facts, peers, port, timeout, wait, hold, forks; or the audit play's cluster
    view (action ddpfix_cluster's result: order, addresses, master, master_port, cluster_cidr, env_path,
    probe_from_facts) whose `facts_plan` holds the rest. Each node's task is then this one filter call, not one
    template per argument and per role default (about forty per node, each compiled anew by ansible-core 2.19+).
    The node's own values (python, socket interface, launcher units, sysfs and dev roots, fi_info: per-host
    variables) come in `node`, from the same template as this call: one template per node. `probe` None: no probe
    in this task (probe off, or the probes wait for the facts: the second round at the cluster addresses,
    probe_cluster.yml)."""
    settings = plan.get("facts_plan", plan)

    def get(key):  # one key at a time: ansible-core 2.19+ hands a filter lazy containers (the view holds more)
        return settings[key] if key in settings else plan[key]

    probe = None
    if get("probe") and not get("probe_from_facts"):
        packed = settings.get("probe_inputs")
        if isinstance(packed, str):  # the cluster task's facts_plan: one string, parsed here (pack_probe_inputs)
            hosts, order, addresses = unpack_probe_inputs(packed)
        else:
            # plain copies, read once: ansible-core 2.19+ hands a filter variables as lazy containers, whose every
            # element access goes through its templating checks (the plan walks these lists several times)
            hosts, order, addresses = list(get("hosts")), list(get("order")), dict(get("addresses"))
        probe = ddpfix_probe_plan(hosts, me, order, addresses, get("master"),
                                  int(get("master_port")), int(get("peers")), int(get("port")))
        probe.update(timeout=float(get("timeout")), wait=float(get("wait")), hold=float(get("hold")),
                     detach=len(hosts) > int(get("forks")))
    return {
        "master_address": get("master_address"),
        "master_port": int(get("master_port")),
        "is_master": me == get("master"),
        "cluster_cidr": get("cluster_cidr"),
        "env_path": get("env_path"),
        "lock_path": get("lock_path"),
        "lock_holder": get("lock_holder"),
        "lock_stale_minutes": int(get("lock_stale_minutes")),
        "nofile_path": get("nofile_path"),
        "profile": get("profile"),
        "probe": probe,
        **dict(node or {}),
    }


def pack_probe_inputs(hosts, order, addresses):
    """The lists every node's probe plan reads (the play's hosts, the rank order, {host: address}) as one JSON
    string, for the cluster task's `facts_plan`: ansible-core 2.19+ hands a filter a registered list as a lazy
    container whose every element goes through its templating checks (on 320 nodes, each node's facts task spent
    more time copying these three than planning its probes); one string is one value. Data, never a template:
    a registered result is not templated again."""
    return json.dumps({"hosts": [str(h) for h in hosts], "order": [str(h) for h in order],
                       "addresses": {str(k): v for k, v in (addresses or {}).items()}}, separators=(",", ":"))


def unpack_probe_inputs(packed):
    """(hosts, order, addresses) of `pack_probe_inputs`."""
    data = json.loads(packed)
    return list(data["hosts"]), list(data["order"]), dict(data["addresses"])


def ddpfix_probe_needs_facts(addresses, cidr):
    """Whether the probes must wait for the facts: a cluster network `cidr` is set and some node's inventory address
    (`addresses`: {host: ansible_host}) is not an IP inside it (a management network for SSH, a name), so the address
    peers must dial (the node's address inside the cluster network) is known only from the node's interfaces."""
    if not cidr:
        return False
    try:
        net = ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return False
    for host, address in (addresses or {}).items():
        a = address or host
        if not _addr_ok(a) or ipaddress.ip_address(a).version != net.version or ipaddress.ip_address(a) not in net:
            return True
    return False


def ddpfix_cluster_addresses(hosts, hostvars):
    """{host: cluster address} of the `hosts` whose facts name one (`ansible_facts.ddpfix_node.cluster.address`, the
    node's first address inside the cluster network, as its facts module picked it); hosts without are left out."""
    out = {}
    for h in hosts or []:
        try:
            facts = hostvars[h]["ansible_facts"]
        except (KeyError, TypeError):
            continue
        cluster = ((facts or {}).get("ddpfix_node") or {}).get("cluster") or {}
        a = cluster.get("address")
        if _addr_ok(a):
            out[h] = a
    return out


def ddpfix_facts_more(view, forks, probe=True, hosts=(), hostvars=None, part="any"):
    """Whether any node of the facts play can need its follow-up (role ddpfix_facts, more.yml): the second probe
    round at the nodes' cluster addresses (`part` 'cluster'), the collection of probers left detached ('collect'),
    or either ('any'). Decided once per play, from
    the cluster view `view` (the audit play's first task's result `ddpfix_audit_cluster`, or the ddpfix CLI's extra
    var of that name; None: the first of `hosts` whose `hostvars` hold that result): the probes run (`probe`) and
    either the cluster network is not the inventory's (`probe_from_facts`, or its addresses and CIDR say so) or the
    cluster has more nodes than `forks` (its probers run detached). An upper bound: each node's own condition still
    decides in the follow-up (under --limit fewer nodes may run than the cluster has). No view at all (the first task
    did not run): True, the follow-up decides per node. `probe` or `forks` None (undefined where the play's hosts are
    templated: the audit playbook's follow-up includes the role rather than importing it, or a user's ansible.cfg sets
    private_role_vars): what the facts play used, from the view's `facts_plan` (the cluster task decided it) or else
    the facts task's plan of the first of `hosts` that holds one (its registered `__ddpfix_facts_plan`)."""
    if not isinstance(view, dict):
        view = _first_held(hosts, hostvars, lambda hv: hv.get("ddpfix_audit_cluster"), lambda v: "order" in v)
    settings = (view or {}).get("facts_plan")
    if isinstance(settings, dict) and "probe" in settings and "forks" in settings:
        probe = settings["probe"] if probe is None else probe
        forks = settings["forks"] if forks is None else forks
    if probe is None or (forks is None and part != "cluster"):  # (the second probe round does not depend on forks)
        plan = _first_held(hosts, hostvars, lambda hv: (hv.get("__ddpfix_facts_plan") or {}).get("data")) or {}
        probe = plan.get("probe", True) if probe is None else probe
        forks = plan.get("forks") if forks is None else forks
    if not boolean(probe, strict=False):  # as `| bool` reads it: -e ddpfix_facts_probe=false is a string
        return False
    if view is None:
        return True
    if part != "collect" and view.get(
            "probe_from_facts", ddpfix_probe_needs_facts(view.get("addresses"), view.get("cluster_cidr"))):
        return True
    if part == "cluster":
        return False
    try:
        return len(view.get("order") or []) > int(forks)
    except (TypeError, ValueError):
        return True


def _first_held(hosts, hostvars, get, ok=lambda v: True):
    """The first of `hosts` whose variables (`hostvars`) hold a dict `get` finds there (and `ok` accepts): a value a
    task of the play registered on every host; None when none does."""
    for h in hosts or []:
        try:
            found = get((hostvars or {})[h])
        except (KeyError, TypeError, AttributeError):
            continue
        if isinstance(found, dict) and ok(found):
            return found
    return None


class FilterModule:
    def filters(self):
        return {
            "ddpfix_probe_plan": ddpfix_probe_plan,
            "ddpfix_facts_args": ddpfix_facts_args,
            "ddpfix_probe_needs_facts": ddpfix_probe_needs_facts,
            "ddpfix_cluster_addresses": ddpfix_cluster_addresses,
            "ddpfix_facts_more": ddpfix_facts_more,
        }
