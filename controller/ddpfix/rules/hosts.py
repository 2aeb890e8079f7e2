"""Names: hostnames, peer name resolution, /etc/hosts and the block ddpfix manages there."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ddpfix.model.facts import NodeFacts
from ddpfix.model.finding import Explains, Finding, Severity
from ddpfix.model.net import is_loopback, network
from ddpfix.rules.context import SRC_HOSTS, SRC_IFACES, Context, hosts_lines
from ddpfix.rules.registry import Rule, finding, rules
from ddpfix.rules.remedies import HOSTS, HOSTS_BLOCK

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


# ---------------------------------------------------------------- names


@rules(
    HOSTNAME_LOOPBACK := Rule(
        "hosts.hostname-loopback",
        E,
        "the hostname resolves to 127.0.0.0/8 or ::1 (Gloo advertises loopback)",
        "Map the hostname to its cluster address in /etc/hosts and take it off the loopback line (ddpfix remediate).",
        remedies=(HOSTS,),
        reads=SRC_HOSTS,
        sound_on_partial=True,
    ),
    NAME_FORM_DIFFERS := Rule(
        "hosts.name-form-differs",
        W,
        "a form of the node's own name (hostname, FQDN) resolves to an address the node does not hold",
        "Make every form of the node's name resolve to an address it holds: correct the /etc/hosts lines of "
        "{forms} (the FQDN is the first dotted name on the hostname's line), or the search domain in "
        "/etc/resolv.conf that turns the short name into another host's FQDN; not changed automatically.",
        reads=SRC_HOSTS | SRC_IFACES,
        sound_on_partial=True,
    ),
    DUPLICATE_HOSTNAME := Rule(
        "hosts.duplicate-hostname",
        E,
        "two nodes share a hostname (cloned VMs)",
        "Give {nodes} each a unique hostname (hostnamectl set-hostname <new-name> on each) and a fresh "
        "/etc/machine-id; not changed automatically.",
        scope="cluster",
    ),
    DUPLICATE_MACHINE_ID := Rule(
        "hosts.duplicate-machine-id",
        W,
        "two nodes share /etc/machine-id",
        "Regenerate it on the clone: rm /etc/machine-id && systemd-machine-id-setup; not changed automatically.",
        scope="cluster",
    ),
)
def check_hostnames(ctx: Context) -> Iterable[Finding]:
    by_hostname: dict[str, list[str]] = {}
    by_mid: dict[str, list[str]] = {}
    for name, f in ctx.audited():
        hn = f.get("hostname") or ""
        by_hostname.setdefault(hn, []).append(name)
        if f.get("machine_id"):
            by_mid.setdefault(f["machine_id"], []).append(name)
        addrs = (f.get("resolve_self") or {}).get(hn) or []
        loop = [a for a in addrs if is_loopback(a)]
        if loop and ctx.plan[name].hostname:  # a name the inventory vouches for: the hosts fix writes it (else
            # hosts.name-unvouched says so: no fix of ddpfix's may write a name a node chose)
            yield finding(
                "hosts.hostname-loopback",
                name,
                f"hostname {hn} resolves to {', '.join(addrs)}: Gloo/c10d would advertise {loop[0]}",
                hosts_lines(f, hn),
            )
        yield from _name_forms(ctx, name, f)
    for hn, names in by_hostname.items():
        if len(names) > 1:
            yield finding(
                "hosts.duplicate-hostname",
                None,
                f"hostname {hn!r} is used by {', '.join(names)}",
                "; ".join(f"{n}: hostname={hn}" for n in names),
                nodes=", ".join(names),
            )
    for mid, names in by_mid.items():
        if len(names) > 1:
            yield finding(
                "hosts.duplicate-machine-id",
                None,
                f"machine-id {mid} is shared by {', '.join(names)}",
                f"/etc/machine-id = {mid} on {', '.join(names)}",
            )


@rules(
    NAME_UNVOUCHED := Rule(
        "hosts.name-unvouched",
        W,
        "a node reports a hostname the inventory does not vouch for (neither its inventory name nor, under "
        "ddp_hosts_domains, that name's short form): ddpfix writes it into no /etc/hosts block or cluster file and "
        "changes no line that names it",
        "Nothing of ddpfix's maps {claimed} to {node}, on any node. If {claimed} is {node}'s real hostname, name the "
        "node {claimed} in the inventory (its address in ansible_host) or list its domain in ddp_hosts_domains; "
        "otherwise give {node} its own name (hostnamectl set-hostname {node}) and find what set {claimed}. Not "
        "changed automatically.",
    ),
)
def check_claims(ctx: Context) -> Iterable[Finding]:
    """A node names only itself: a hostname it reports that the inventory does not vouch for (`plan.vouched_names`)
    is no name of the cluster's. The plan leaves it out of every file; this finding names the node and the name."""
    domains = ", ".join(ctx.cluster.hosts_domains) or "none"
    for name, f in ctx.audited():
        hn = f.get("hostname")
        if not hn or ctx.plan[name].hostname:
            continue
        addrs = (f.get("resolve_self") or {}).get(hn) or []
        loop = [a for a in addrs if is_loopback(a)]
        yield finding(
            "hosts.name-unvouched",
            name,
            f"{name} reports the hostname {hn}, which the inventory does not vouch for: written nowhere"
            + (f" (it resolves to {loop[0]} on {name}: Gloo without GLOO_SOCKET_IFNAME would advertise loopback)"
               if loop else ""),
            f"hostname = {hn}; inventory name {name}; ddp_hosts_domains: {domains}; getaddrinfo({hn!r}) on {name} = "
            f"{', '.join(addrs) or 'no address'}; {hosts_lines(f, hn)}",
            claimed=hn,
            node=name,
        )


@rules(
    PEER_UNRESOLVABLE := Rule(
        "hosts.peer-unresolvable",
        E,
        "a peer's hostname does not resolve on this node",
        "Add the managed /etc/hosts block mapping every node to its cluster address (ddpfix remediate).",
        remedies=(HOSTS,),
        reads=SRC_HOSTS,
        sound_on_partial=True,
        explains=(Explains("hosts.peer-unresolvable", "host"),),
    ),
    PEER_MISMATCH := Rule(
        "hosts.peer-mismatch",
        E,
        "a peer's hostname resolves to another address than its cluster address",
        "Use the same managed /etc/hosts block on every node (ddpfix remediate); remove stale entries.",
        remedies=(HOSTS,),
        reads=SRC_HOSTS,
        sound_on_partial=True,
        explains=(Explains("hosts.peer-mismatch", "host"),),
    ),
    PEER_NAME_OTHER_NETWORK := Rule(
        "hosts.peer-name-other-network",
        INFO,
        "a peer's hostname resolves to that peer's address on another network than the cluster network (a "
        "management network): fine for ddpfix's env files, which name addresses and socket interfaces",
        "Nothing to change for launches from ddpfix's env files (MASTER_ADDR is the master's cluster address, the "
        "socket interfaces are set). A launcher that passes hostnames (torchrun --rdzv-endpoint with a hostname, or "
        "the c10d rendezvous, which advertises the rank-0 agent's FQDN) talks over that network: give it "
        "$MASTER_ADDR:$MASTER_PORT from the env file, or names that resolve to cluster addresses.",
        reads=SRC_HOSTS,
        sound_on_partial=True,
    ),
    FAMILY_MISMATCH := Rule(
        "addr.family-mismatch",
        W,
        "peers' names resolve to IPv4 on some nodes and IPv6 on others",
        "Use IPv4 literals for MASTER_ADDR and IPv4 /etc/hosts entries (ddpfix remediate); or "
        "NCCL_SOCKET_FAMILY=AF_INET.",
        remedies=(HOSTS_BLOCK,),
        reads=SRC_HOSTS,
        sound_on_partial=True,
        scope="cluster",
    ),
)
def check_resolution(ctx: Context) -> Iterable[Finding]:
    """The resolution matrix: every node resolves every peer's hostname to that peer's cluster address (the
    hostnames the inventory vouches for: `NodePlan.hostname`)."""
    vouched = {name: hn for name, _ in ctx.audited() if (hn := ctx.plan[name].hostname)}
    counts = Counter(vouched.values())
    peers = {hn: name for name, hn in vouched.items()}
    dup = {hn for hn, c in counts.items() if c > 1}
    want_of = {hn: ctx.plan[peer].address for hn, peer in peers.items() if hn not in dup}
    families: dict[str, set[int]] = {}
    other: list[str] = []  # names that resolve to their node's address on another network (one finding)
    other_names: set[str] = set()
    for name, f in ctx.audited():
        pr = ctx.hosts[name].probe or {}
        res = pr.get("resolve") or {}
        if isinstance(pr.get("checked"), int) and pr["checked"] > len(res):
            # the node reports deviations only: the names it does not list resolved to the address expected
            mine = ctx.plan[name].address if name in ctx.plan else None
            if mine:
                families.setdefault(name, set()).add(6 if ":" in mine else 4)
        for hn, addrs in res.items():
            if hn not in want_of or peers[hn] == name:
                continue
            peer, want = peers[hn], want_of[hn]
            addrs = addrs or []
            if not addrs:
                yield finding(
                    "hosts.peer-unresolvable",
                    name,
                    f"peer {peer}'s hostname {hn} does not resolve on {name}",
                    f"getaddrinfo({hn!r}) on {name}: no address; {hosts_lines(f, hn)}",
                    target=peer,
                )
                continue
            first = addrs[0]
            fam = 6 if ":" in first else 4
            families.setdefault(name, set()).add(fam)
            if want and first != want:
                held = _held_by(ctx, peer, first)
                if held is not None and ctx.in_cidr(first):
                    continue  # another of the peer's own addresses inside the cluster network: it reaches the peer
                if held is not None and held[0] != ctx.plan[peer].ifname:  # the peer's, on another network
                    other_names.add(hn)
                    other.append(f"{hn} -> {first} on {name} ({peer}'s {held[0]}, {held[1]}; "
                                 f"cluster address {want} on {ctx.plan[peer].ifname})")
                    continue
                where = (
                    "outside the cluster network " + str(ctx.cidr)
                    if not ctx.in_cidr(first)
                    else f"not {peer}'s cluster address {want}"
                )
                yield finding(
                    "hosts.peer-mismatch",
                    name,
                    f"{hn} resolves to {first} on {name}, {where}",
                    f"getaddrinfo({hn!r}) on {name} = {', '.join(addrs)}; {hosts_lines(f, hn)}",
                    target=peer,
                )
    if other:
        more = f"; and {len(other) - 3} more" if len(other) > 3 else ""
        yield finding(
            "hosts.peer-name-other-network",
            None,
            f"peer hostnames resolve to their nodes' addresses outside the cluster network {ctx.cidr} "
            f"({len(other)} lookups of {len(other_names)} names)",
            "; ".join(other[:3]) + more,
        )
    fams = dict(families.items())
    if len({frozenset(s) for s in fams.values()}) > 1:
        yield finding(
            "addr.family-mismatch",
            None,
            "peer names resolve to different address families on different nodes",
            "; ".join(f"{n}: IPv{'/'.join(str(x) for x in sorted(s))}" for n, s in sorted(fams.items())),
        )


def _name_forms(ctx: Context, name: str, f: NodeFacts) -> Iterable[Finding]:
    """hosts.name-form-differs: the node's hostname or FQDN resolving (first address, as torch's
    `_matches_machine_hostname` and Gloo's bind use it) to an address the node does not hold. Loopback is
    hosts.hostname-loopback's; an own name that does not resolve is not judged here."""
    hn, fqdn = f.get("hostname") or "", f.get("fqdn") or ""
    resolved = f.get("resolve_self") or {}
    forms = [("hostname", hn)] + ([("FQDN", fqdn)] if fqdn and fqdn != hn else [])
    evidence, wrong = [], []
    for label, form in forms:
        got = resolved.get(form) or []
        if not got or is_loopback(got[0]):
            continue
        held = _held_by(ctx, name, got[0])
        if held is not None:
            evidence.append(f"{label} {form} -> {got[0]} ({held[0]})")
            continue
        owner = ctx.by_address.get(got[0])
        evidence.append(f"{label} {form} -> {got[0]} ({'held by ' + owner if owner else 'not an address of ' + name})")
        wrong.append((label, form, got[0]))
    if not wrong:
        return
    label, form, addr = wrong[0]
    yield finding(
        "hosts.name-form-differs",
        name,
        f"{name}'s {label} {form} resolves to {addr}, an address {name} does not hold: Gloo without "
        f"GLOO_SOCKET_IFNAME binds what the hostname resolves to, and torchrun's c10d rendezvous advertises it",
        "; ".join(evidence) + "; " + "; ".join(hosts_lines(f, fm) for _, fm, _ in wrong),
        forms=" and ".join(fm for _, fm, _ in wrong),
    )


def _held_by(ctx: Context, node: str, address: str) -> tuple[str, str] | None:
    """(interface, its network) of `node` that holds `address`, from its facts; None when it holds none (or was not
    read)."""
    for i in (ctx.facts.get(node) or {}).get("interfaces") or []:
        for a in i.get("addrs") or []:
            if a.get("local") == address:
                held = network(f"{address}/{a.get('prefixlen')}")
                if held is not None:
                    return str(i.get("name")), str(held)
    return None


@rules(
    BLOCK_DIFFERS := Rule(
        "hosts.block-differs",
        W,
        "the managed /etc/hosts block is not the same on every node (a fix applied to only some of them)",
        "Write the same block on every node: ddpfix remediate --apply without --limit ({nodes} differ).",
        remedies=(HOSTS_BLOCK,),
        reads=SRC_HOSTS,
        sound_on_partial=True,
    ),
)
def check_hosts_block(ctx: Context) -> Iterable[Finding]:
    """ddpfix's managed /etc/hosts block is identical on every read node, or absent on all (each node returns only
    the block's SHA-256). A node whose /etc/hosts was not read, or which returned no valid digest (validated with the
    other node values, factguard.validate_facts), is left out."""
    by_digest: dict[str | None, list[str]] = {}
    for name, f in ctx.audited():
        if "hosts_file" in ctx.unread(name) or "hosts_block_sha256" not in f:
            continue
        by_digest.setdefault(f.get("hosts_block_sha256"), []).append(name)
    if len(by_digest) < 2:
        return
    groups = sorted(by_digest.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    common = groups[0][1]
    others = sorted(n for _, names in groups[1:] for n in names)
    yield finding(
        "hosts.block-differs",
        None,
        f"the managed /etc/hosts block differs between nodes: {', '.join(others)} against {', '.join(common)}",
        "; ".join(f"{', '.join(names)}: " + (f"block sha256 {d[:12]}" if d else "no managed block")
                  for d, names in groups),
        nodes=", ".join(others),
    )
