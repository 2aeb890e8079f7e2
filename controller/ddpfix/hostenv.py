"""Checks of the launch path's host settings: the open-file limit, ARP flux between cluster NICs, torch builds.

Facts: ``limits``, ``sysctl.arp`` and ``torch`` of ``ddpfix_node_facts`` (read by the ddpfix_hostenv module_utils),
validated by ``ddpfix.factguard`` before any check runs. Pure functions over the audit ``Context``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ddpfix.model.finding import Finding
from ddpfix.rules.registry import Remedy, Rule, Severity, finding, rules

if TYPE_CHECKING:
    from ddpfix.checks import Context

W = Severity.WARNING

# ------------------------------------------------------------------ limits.nofile-low
#
# The rule (what one training process holds open, by cluster size N nodes):
#   NOFILE_BASE                 files a rank holds with no peer at all: CUDA driver and libraries, DataLoader worker
#                               pipes, dataset and checkpoint files, the TCPStore client;
#   + NOFILE_PER_PEER x (N - 1) per remote node: 8 local ranks (a GPU node) x 24 sockets per remote rank: NCCL's
#                               bootstrap ring and proxy connections, the socket transport's data sockets of its
#                               channels (NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS each, up to 64), Gloo's full
#                               mesh pair per rank and its TCPStore connections.
# So a soft limit of 1024 (a systemd service's default soft LimitNOFILE, many images' ulimit -n) holds up to 3 nodes
# and breaks NCCL's bootstrap from 4 nodes on ("socket: Too many open files", goodfire-ai/spd#957, NVIDIA/nccl#550).
NOFILE_BASE = 512
NOFILE_PER_PEER = 192
#: what the fix writes (`nofile_fix`): the need, but at least this (every distribution's "generous" value) and no more
#: than the session's hard limit, so the hard limit is only raised where it is below the need ...
NOFILE_FIX_MIN = 65536
#: ... and never above the kernel's default fs.nr_open (a larger value fails setrlimit: pam_limits refuses the login)
NOFILE_FIX_MAX = 1048576
NOFILE_PATH = "/etc/security/limits.d/90-ddpfix-nofile.conf"


def nofile_needed(nodes: int) -> int:
    """The soft RLIMIT_NOFILE a training process needs in a cluster of `nodes` nodes (see the rule above)."""
    return NOFILE_BASE + NOFILE_PER_PEER * max(0, nodes - 1)


def nofile_fix(need: int, hard: int) -> tuple[int, int]:
    """(soft value, hard value to write, 0: none) for a node whose SSH session's hard limit is `hard` (-1 unlimited).
    Within the hard limit the soft limit alone is raised (an unprivileged process may do that); a hard limit below
    the need is raised to the value as well (root's sshd may; pam_limits fails the login where it cannot)."""
    if hard == -1 or hard >= need:
        return min(max(need, min(NOFILE_FIX_MIN, NOFILE_FIX_MAX if hard == -1 else hard)), NOFILE_FIX_MAX), 0
    value = min(max(need, NOFILE_FIX_MIN), NOFILE_FIX_MAX)
    return value, value


def _limit(v: int) -> str:
    return "unlimited" if v == -1 else str(v)


@rules(
    Rule("limits.nofile-low", W,
         "the soft open-file limit (RLIMIT_NOFILE) of the SSH session or a launcher unit (`ddp_launcher_units`) is "
         f"below what NCCL/Gloo need at this cluster's size ({NOFILE_BASE} + {NOFILE_PER_PEER} per peer node: a "
         "soft limit of 1024 breaks NCCL's bootstrap from 4 nodes on)",
         "Raise the soft nofile limit of the launch path to {value}: ddpfix remediate --apply writes " + NOFILE_PATH +
         " (nofile {value} for * and root) for new PAM logins and, for each unit of ddp_launcher_units, "
         "/etc/systemd/system/UNIT.d/90-ddpfix-nofile.conf (LimitNOFILE={value}:{unit_hard}; it applies at the "
         "unit's next start); by hand: ulimit -n {value} in the launch script, or docker run --ulimit "
         "nofile={value}:{unit_hard}.",
         remedies=(Remedy("ddpfix_limits", "nofile", how="limits.d"),), reads=frozenset({"nofile_units"}),
         # a low limit read is low whatever an unreadable unit has
         sound_on_partial=True,
         still_open="pam_limits applies limits.d only where sshd runs with UsePAM yes (and session pam_limits.so in "
                    "/etc/pam.d/sshd); without PAM raise the limit where sshd starts (LimitNOFILE in a drop-in for "
                    "ssh.service) or in the launch script (ulimit -n)"),
)
def check_nofile(ctx: Context) -> Iterable[Finding]:
    nodes = len(ctx.cluster.nodes)
    need = nofile_needed(nodes)
    for name, f in ctx.audited():
        lim = f.get("limits")
        if not isinstance(lim, Mapping):
            continue  # not collected (an older facts module)
        limits = [x for x in [lim.get("nofile"), *(lim.get("nofile_units") or {}).values()] if isinstance(x, Mapping)]
        low = [x for x in limits if x.get("soft") not in (None, -1) and int(x["soft"]) < need]
        if not low:
            continue
        sess: Any = lim.get("nofile")
        session: Mapping[str, Any] = sess if isinstance(sess, Mapping) else {}
        hard = int(session["hard"]) if session.get("hard") is not None else -1
        value, hard_line = nofile_fix(need, hard)
        units = [x for x in (lim.get("nofile_units") or {}).values() if isinstance(x, Mapping)]
        unit_hards = [int(x["hard"]) for x in units if x.get("hard") is not None] + [hard]
        unit_hard = -1 if -1 in unit_hards else max([value, *unit_hards])
        first = low[0]
        yield finding(
            "limits.nofile-low", name,
            f"the soft open-file limit on {name} is {first['soft']} ({first.get('source') or 'ssh session'}), "
            f"a {nodes}-node cluster needs {need}",
            "; ".join(f"RLIMIT_NOFILE of the {x.get('source') or 'ssh session'}: soft {_limit(int(x['soft']))}, "
                      f"hard {_limit(int(x['hard'] if x.get('hard') is not None else -1))}" for x in low)
            + f"; needed at {nodes} nodes: {need} ({NOFILE_BASE} + {NOFILE_PER_PEER} x {max(0, nodes - 1)} peers)",
            value=value,
            hard=hard_line,  # the limits.d hard line only where the session's hard limit is below the need
            unit_hard="infinity" if unit_hard == -1 else unit_hard,
        )


# ------------------------------------------------------------------ net.arp-flux

ARP_PATH = "/etc/sysctl.d/90-ddpfix-arp.conf"


def sysctl_key(ifname: str, key: str) -> str:
    """The sysctl name of a per-interface IPv4 setting (a '.' in an interface name, a VLAN, is written '/')."""
    return f"net.ipv4.conf.{ifname.replace('.', '/')}.{key}"


def _cluster_ifaces(ctx: Context, f: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    out = []
    for i in f.get("interfaces") or []:
        if "UP" not in (i.get("flags") or []) or not i.get("name"):
            continue
        addrs = [str(a["local"]) for a in i.get("addrs") or [] if a.get("family") == "inet" and ctx.in_cidr(a["local"])]
        if addrs:
            out.append((str(i["name"]), addrs))
    return out


@rules(
    Rule("net.arp-flux", W,
         "two or more interfaces of a node have addresses in the cluster network and arp_ignore/arp_announce at "
         "their defaults (0): each answers ARP for the other's address, so peers send to the wrong port and replies "
         "leave by another NIC (NVIDIA/nccl#1269)",
         "Answer ARP only on the interface that holds the address and announce it from there: {commands}; persist "
         "it in " + ARP_PATH + " (ddpfix remediate --apply writes both, for {ifaces} only).",
         remedies=(Remedy("ddpfix_sysctl", "arp", how="sysctl.d"),), reads=frozenset({"interfaces", "arp"})),
)
def check_arp_flux(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        sysctl: Mapping[str, Any] = f.get("sysctl") or {}
        arp: Any = sysctl.get("arp")
        if not isinstance(arp, Mapping):
            continue  # not collected
        ifaces = [(i, a) for i, a in _cluster_ifaces(ctx, f) if isinstance(arp.get(i), Mapping)]
        if len(ifaces) < 2:
            continue
        al: Mapping[str, Any] = arp["all"] if isinstance(arp.get("all"), Mapping) else {}

        def eff(ifname: str, key: str, al: Mapping[str, Any] = al, arp: Mapping[str, Any] = arp) -> int:
            return max(int(al.get(key) or 0), int(arp[ifname].get(key) or 0))

        flux = [i for i, _ in ifaces if eff(i, "arp_ignore") == 0 or eff(i, "arp_announce") == 0]
        if not flux:
            continue
        names = [i for i, _ in ifaces]
        yield finding(
            "net.arp-flux", name,
            f"{name} has {len(ifaces)} interfaces in the cluster network ({', '.join(names)}) that answer ARP for "
            "each other's addresses",
            f"net.ipv4.conf.all.arp_ignore = {int(al.get('arp_ignore') or 0)}, "
            f"arp_announce = {int(al.get('arp_announce') or 0)}; "
            + "; ".join(f"{i} {', '.join(a)}: arp_ignore {arp[i].get('arp_ignore')}, "
                        f"arp_announce {arp[i].get('arp_announce')} (effective {eff(i, 'arp_ignore')}/"
                        f"{eff(i, 'arp_announce')})" for i, a in ifaces),
            commands="sysctl -w " + " ".join(f"{sysctl_key(i, 'arp_ignore')}=1 {sysctl_key(i, 'arp_announce')}=2"
                                             for i in names),
            ifaces=",".join(names),
        )


# ------------------------------------------------------------------ env.torch-version-mismatch


def _build(t: Mapping[str, Any]) -> str:
    return f"CUDA {t['cuda']}" if t.get("cuda") else f"ROCm {t['hip']}" if t.get("hip") else "CPU"


def _triple(t: Mapping[str, Any]) -> tuple[str, str, str]:
    return str(t["version"]), _build(t), str(t.get("nccl") or "none")


def _describe(t: tuple[str, str, str]) -> str:
    return f"torch {t[0]} ({t[1]}, NCCL {t[2]})"


def _pip(python: str, version: str) -> str:
    base, _, local = version.partition("+")
    index = f" --index-url https://download.pytorch.org/whl/{local}" if re.fullmatch(r"cpu|cu\d+|rocm[\d.]+", local) \
        else ""
    return f"{python} -m pip install torch=={base}{index}"


@rules(
    Rule("env.torch-version-mismatch", W,
         "torch's version, its CUDA/ROCm build or its NCCL version (from `ddp_python`) differ between nodes, on "
         "every cluster (pytorch/pytorch#122571: collectives hang or fail between builds)",
         "Install on {node} the build {ref} runs, {want}: {pip} (or point ddp_python of {node} at an "
         "interpreter that has it). Not changed automatically.",
         reads=frozenset({"torch"}), manual="one torch build everywhere"),
)
def check_torch_versions(ctx: Context) -> Iterable[Finding]:
    read: dict[str, tuple[str, str, str]] = {}
    pythons: dict[str, str] = {}
    for name, f in ctx.audited():
        t = f.get("torch")
        if isinstance(t, Mapping) and t.get("version") and "torch" not in ctx.unread(name):
            read[name] = _triple(t)
            pythons[name] = str(t.get("python") or "python3")
    if len(set(read.values())) < 2:
        return
    master = ctx.cluster.master
    if master in read:
        want, ref = read[master], f"{master} (master)"
    else:
        counts: Sequence[tuple[tuple[str, str, str], int]] = Counter(read.values()).most_common()
        want = sorted(t for t, c in counts if c == counts[0][1])[0]
        ref = ", ".join(n for n, t in read.items() if t == want)
    others = "; ".join(f"{n}: {_describe(t)}" for n, t in read.items())
    for name, got in read.items():
        if got == want:
            continue
        yield finding(
            "env.torch-version-mismatch", name,
            f"{name} runs {_describe(got)}, {ref} runs {_describe(want)}",
            f"{pythons[name]} on {name}: {_describe(got)}; {others}",
            node=name, ref=ref, want=_describe(want), pip=_pip(pythons[name], want[0]),
        )
