"""What each node's remediation writes: the files of its planned fixes, for the per-node play's pre-flight (the
ddpfix_run lock call checks every one is writable, on every node, before any node changes).

Each path is the role's own, spelled once: the role's input default in `roles/<role>/defaults/main.yml` (or an
internal constant in its `vars/main.yml`), read here, unless the node's inventory sets that input (`Node.role_vars`).
chrony's files are the one exception: where they are is read on the node when the play runs (module
ddpfix_chrony_conf's `writes`)."""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from ddpfix import clusterfile, paths
from ddpfix.model.cluster import Node
from ddpfix.remediate.plan import HostPlan, firewalld_files
from ddpfix.rules.fabric import MEMLOCK_LOW
from ddpfix.rules.host import NOFILE_LOW

#: ufw's own rules files (IPv4, IPv6): `ufw allow` rewrites them where ufw manages iptables.
UFW_RULES = ("/etc/ufw/user.rules", "/etc/ufw/user6.rules")
#: The directory of a launcher unit's drop-ins (ddpfix_limits' unit drop-in tasks write UNIT.d/<its vars' file name>).
UNIT_DIR = "/etc/systemd/system"


@functools.cache
def role_file(role: str, name: str = "defaults") -> dict[str, Any]:
    """`roles/ddpfix_<role>/<name>/main.yml` (its defaults, or its internal vars), as YAML data."""
    # CLI start: PyYAML only where a plan is turned into the play's variables
    import yaml

    path = paths.roles_dir() / f"ddpfix_{role}" / name / "main.yml"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return dict(data) if isinstance(data, Mapping) else {}


def role_value(node: Node, role: str, name: str) -> Any:
    """The role input `name` on `node`: the inventory's value, else the role's default."""
    return node.role_vars[name] if name in node.role_vars else role_file(role)[name]


def launcher_units(node: Node) -> list[str]:
    """ddpfix_limits_units on `node` (its default: the inventory's ddp_launcher_units)."""
    units = node.role_vars.get("ddpfix_limits_units", node.role_vars.get("ddp_launcher_units"))
    return [str(u) for u in units or []]


def unit_dropins(node: Node, dropin: str) -> list[str]:
    """The drop-in `dropin` (an internal var of ddpfix_limits: its file name) of every launcher unit of `node`."""
    name = str(role_file("limits", "vars")[dropin])
    return [posixpath.join(UNIT_DIR, f"{u}.d", name) for u in launcher_units(node)]


def hosts_path(node: Node) -> str:
    """The file the hosts block is written into on `node` (ddpfix_hosts_path)."""
    return str(role_value(node, "hosts", "ddpfix_hosts_path"))


def cluster_path(node: Node, env_path: str) -> str:
    """The cluster file on `node` (ddpfix_env_cluster_path; its default: cluster.json next to the env file)."""
    return str(node.role_vars.get("ddpfix_env_cluster_path") or clusterfile.path_for(env_path))


def write_paths(hp: HostPlan, node: Node, env_path: str, cluster_file: bool) -> list[str]:
    """Every file `hp`'s fixes write on `node` but chrony's (ddpfix_run_write_paths): the cluster-wide files too
    (the next play writes them only when every node passed this pre-flight)."""
    out: list[str] = []
    if hp.hosts:
        out.append(hosts_path(node))
    if hp.env:
        out.append(env_path)
        if cluster_file:
            out.append(cluster_path(node, env_path))
    if hp.pin_ifname is not None:
        out.append(str(role_value(node, "ifname", "ddpfix_ifname_link_file")))
    if hp.limits:
        out += [str(role_value(node, "limits", "ddpfix_limits_path")),
                *unit_dropins(node, "__ddpfix_limits_memlock_dropin")]
    if hp.nofile:
        out += [str(role_value(node, "limits", "ddpfix_limits_nofile_path")),
                *unit_dropins(node, "__ddpfix_limits_nofile_dropin")]
    if hp.arp:
        out.append(str(role_value(node, "sysctl", "ddpfix_sysctl_arp_path")))
    if hp.firewall == "firewalld":
        out += [f"/etc/firewalld/zones/{role_value(node, 'firewall', 'ddpfix_firewall_zone')}.xml",
                *firewalld_files(hp.firewalld)]
    return out


def write_if_present(hp: HostPlan, node: Node) -> list[Any]:
    """The firewall's persistence files of `hp`'s fix on `node`, each group checked only where its first file exists
    (ddpfix_run_write_if_present): nftables' layouts, iptables' save files and ufw's rules."""
    if hp.firewall == "nftables":
        return list(role_value(node, "firewall", "ddpfix_firewall_nft_layouts"))
    if hp.firewall in ("iptables", "iptables-legacy", "ufw"):
        return [*role_value(node, "firewall", "ddpfix_firewall_iptables_rules_paths"), *UFW_RULES]
    return []


def node_writes(hp: HostPlan, node: Node, env_path: str, cluster_file: bool,
                memlock_kib: int | None = None) -> dict[str, Any]:
    """What remediate.yml reads of `node`'s files from its plan (`ddpfix_plan[node]`)."""
    return {"write_paths": write_paths(hp, node, env_path, cluster_file),
            "write_if_present": write_if_present(hp, node), "files": limits_files(hp, node, memlock_kib),
            "hosts_path": hosts_path(node), "cluster_path": cluster_path(node, env_path)}


# ---------------------------------------------------------------- the limits drop-ins, rendered here
# The open-file limit's and the locked-memory limit's drop-ins are rendered on the controller, here, once: the dry
# run's preview diffs them against the node's copies (`ddpfix.remediate.preview`), and --apply hands the same text to
# ddpfix_node_files (`limits_files`, the plan's `files`), which writes them in the node's one call. The role
# ddpfix_limits' templates (kept for running the role on its own) render the same text (a unit test compares them).

#: the first line of every drop-in: fixed (not ansible_managed), so the dry run's text is the apply's
FIRST_LINE = "# Written by ddpfix remediate: edits here are replaced by its next --apply."
#: what each drop-in is, as remediate's report names its change (the names the role's tasks gave them)
NOFILE_TASK = f"Fix {NOFILE_LOW.id} | Write {{path}}"
UNIT_NOFILE_TASK = f"Fix {NOFILE_LOW.id} | LimitNOFILE drop-in for launcher units ({{unit}})"
MEMLOCK_TASK = f"Fix {MEMLOCK_LOW.id} | Write {{path}}"
UNIT_MEMLOCK_TASK = f"Fix {MEMLOCK_LOW.id} | LimitMEMLOCK drop-in for launcher units ({{unit}})"
#: the values the drop-ins take (the role's input check): soft, hard (0: no hard line), the units' hard
_NOFILE_VALUES = {"soft": re.compile(r"[0-9]+"), "hard": re.compile(r"[0-9]+"),
                  "unit_hard": re.compile(r"[0-9]+|infinity")}
_MEMLOCK = re.compile(r"unlimited|[0-9]+")
_UNIT = re.compile(r"[A-Za-z0-9@_.:-]+\.service")


def nofile_texts(nofile: Mapping[str, Any]) -> tuple[str, str]:
    """The open-file limit's pam_limits drop-in and a launcher unit's drop-in for `nofile` ({soft, hard, unit_hard}:
    the values the audit reported). ValueError for values out of range."""
    v = {k: str(nofile.get(k, "")) for k in _NOFILE_VALUES}
    if not all(rx.fullmatch(v[k]) for k, rx in _NOFILE_VALUES.items()) or not 1024 <= int(v["soft"]) <= 1048576:
        raise ValueError(f"the open-file limit must be a count between 1024 and 1048576, its hard value a count or 0 "
                         f"and the units' hard value a count or infinity (got {v})")
    hard = (f"*       hard    nofile     {v['hard']}\nroot    hard    nofile     {v['hard']}\n"
            if int(v["hard"]) > 0 else "")
    pam = (f"{FIRST_LINE}\n"
           "# ddpfix: the open-file limit -- NCCL and Gloo open sockets per peer (512 + 192 per peer node: see the "
           "README).\n"
           "# pam_limits applies this to new logins; `*` does not cover root, so root has its own lines. A hard line "
           "only where\n"
           "# the session's hard limit was below the value (ddpfix never lowers it).\n"
           f"*       soft    nofile     {v['soft']}\nroot    soft    nofile     {v['soft']}\n{hard}")
    unit = (f"{FIRST_LINE}\n# ddpfix: the launcher unit's open-file limit (soft:hard; NCCL/Gloo sockets per peer)\n"
            f"[Service]\nLimitNOFILE={v['soft']}:{v['unit_hard']}\n")
    return pam, unit


def memlock_texts(memlock: Any) -> tuple[str, str]:
    """The locked-memory limit's pam_limits drop-in and a launcher unit's drop-in for `memlock` (unlimited or KiB).
    ValueError for another value."""
    m = str(memlock)
    if not _MEMLOCK.fullmatch(m):
        raise ValueError(f"ddpfix_limits_memlock must be 'unlimited' or a number of KiB (got {m!r})")
    pam = (f"{FIRST_LINE}\n"
           "# ddpfix: the locked-memory limit for RDMA (NCCL over InfiniBand/RoCE/EFA) registers GPU and host memory.\n"
           "# pam_limits applies this to new logins; `*` does not cover root, so root has its own lines.\n"
           + "".join(f"{who:<8}{kind:<8}memlock    {m}\n" for who in ("*", "root") for kind in ("soft", "hard")))
    unit = (f"{FIRST_LINE}\n# ddpfix: the launcher unit's locked-memory limit (RDMA)\n[Service]\n"
            f"LimitMEMLOCK={'infinity' if m == 'unlimited' else m + 'K'}\n")
    return pam, unit


def memlock_value(node: Node, memlock_kib: int | None) -> str:
    """ddpfix_limits_memlock on `node`: the inventory's, else the cluster's ddp_memlock (`Cluster.memlock_kib`, None:
    unlimited), as the role's default takes it."""
    if "ddpfix_limits_memlock" in node.role_vars:
        return str(node.role_vars["ddpfix_limits_memlock"])
    return "unlimited" if memlock_kib is None else str(memlock_kib)


def limits_files(hp: HostPlan, node: Node, memlock_kib: int | None = None) -> list[dict[str, Any]]:
    """The limits drop-ins `hp` writes on `node`, as ddpfix_node_files takes them (`files`): {key, what, path, content,
    mode, reload (a unit drop-in: systemd's daemon-reload when it changed)}; `memlock_kib` the cluster's ddp_memlock.
    ValueError for a value or a launcher unit the drop-ins cannot take (refused before any node is touched)."""
    units = launcher_units(node)
    bad = [u for u in units if not _UNIT.fullmatch(u)]
    if bad and (hp.nofile or hp.limits):
        raise ValueError(f"ddpfix_limits_units must be unit names ending in .service (got {bad})")
    out: list[dict[str, Any]] = []
    for key, texts, pam_path, dropin, task, unit_task in (
            ("memlock", memlock_texts(memlock_value(node, memlock_kib)) if hp.limits else None, "ddpfix_limits_path",
             "__ddpfix_limits_memlock_dropin", MEMLOCK_TASK, UNIT_MEMLOCK_TASK),
            ("nofile", nofile_texts(hp.nofile) if hp.nofile else None, "ddpfix_limits_nofile_path",
             "__ddpfix_limits_nofile_dropin", NOFILE_TASK, UNIT_NOFILE_TASK)):
        if texts is None:
            continue
        pam, unit = texts
        path = str(role_value(node, "limits", pam_path))
        out.append({"key": key, "what": task.format(path=path), "path": path, "content": pam, "mode": "0644",
                    "reload": False})
        out += [{"key": key, "what": unit_task.format(unit=u), "path": p, "content": unit, "mode": "0644",
                 "reload": True} for u, p in zip(units, unit_dropins(node, dropin), strict=True)]
    return out
