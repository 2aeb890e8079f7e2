"""What each node's remediation writes: the files of its planned fixes, for the per-node play's pre-flight (the
ddpfix_run lock call checks every one is writable, on every node, before any node changes).

Each path is the role's own, spelled once: the role's input default in `roles/<role>/defaults/main.yml` (or an
internal constant in its `vars/main.yml`), read here, unless the node's inventory sets that input (`Node.role_vars`).
chrony's files are the one exception: where they are is read on the node when the play runs (module
ddpfix_chrony_conf's `writes`)."""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Mapping
from typing import Any

from ddpfix import clusterfile, paths
from ddpfix.model.cluster import Node
from ddpfix.remediate.plan import HostPlan, firewalld_files

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


def node_writes(hp: HostPlan, node: Node, env_path: str, cluster_file: bool) -> dict[str, Any]:
    """What remediate.yml reads of `node`'s files from its plan (`ddpfix_plan[node]`)."""
    return {"write_paths": write_paths(hp, node, env_path, cluster_file),
            "write_if_present": write_if_present(hp, node),
            "hosts_path": hosts_path(node), "cluster_path": cluster_path(node, env_path)}
