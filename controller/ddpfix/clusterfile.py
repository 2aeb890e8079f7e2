"""The cluster file (`cluster.json` next to the env file): the cluster view `ddpfix check --local` needs on a node.

Written by `ddpfix env --apply` (and remediate, where it writes the env file) through the ddpfix_env role; read on
the node, with no SSH and no Ansible, into the same `Cluster` the audit works on.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
from typing import TYPE_CHECKING, Any

from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.model.cluster import Cluster
from ddpfix.model.net import valid_ifname
from ddpfix.plan import hosts_block

if TYPE_CHECKING:
    from ddpfix.rules.context import Context

SCHEMA = "ddpfix.cluster/v1"
NAME = "cluster.json"


def path_for(env_path: str) -> str:
    return posixpath.join(posixpath.dirname(env_path), NAME)


def fingerprint(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def text(content: dict[str, Any]) -> str:
    """The file as remediate.yml writes it (`to_nice_json(sort_keys=true)` and a line break)."""
    return json.dumps(content, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def build(ctx: Context) -> dict[str, Any]:
    """The file's content: the same on every node (no timestamps, so rewriting it is idempotent)."""
    c = ctx.cluster
    doc = {
        "schema": SCHEMA,
        "master": c.master,
        "master_port": c.master_port,
        "cidr": ctx.cidr,
        "nproc_per_node": c.nproc_per_node,
        "env_path": c.env_path,
        "env_process_vars": c.env_process_vars,
        "env_scope": c.env_scope,
        "job_port_range": c.job_port_range,
        "firewall": c.firewall,
        "skip_findings": list(c.skip_findings),
        "hosts_block": fingerprint(hosts_block(ctx.plan)),
        "nodes": [
            {"name": n.name, "rank": n.rank, "address": ctx.plan[n.name].address, "hostname": ctx.plan[n.name].hostname,
             "ifname": ctx.plan[n.name].ifname, "socket_ifname": n.socket_ifname}
            for n in c.nodes
        ],
    }
    if c.hosts_domains:  # only when set: the files of clusters without it stay as they were
        doc["hosts_domains"] = list(c.hosts_domains)
    return doc


def _bad(path: str, why: str) -> DdpfixError:
    return DdpfixError(f"cluster file {path}: {why}", ExitCode.INVALID_INPUT)


def untrusted(what: str, st: os.stat_result) -> str | None:
    """Why a file or directory with this status may not decide what `check --local` accepts (its skip_findings,
    its cluster view), or None: it must be owned by root (or by the user running the check, who could write it
    anyway) and writable by nobody else."""
    if st.st_uid not in (0, os.geteuid()):
        return f"{what} is owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} " \
               f"(mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _check_trusted(path: str, fd: int) -> None:
    """Refuse (exit 2) a cluster file that someone other than root could have written: the file (as opened), the
    directory it is named in and the directory it really lives in (through symlinks)."""
    why = untrusted("it", os.fstat(fd))
    for d in dict.fromkeys((os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path)))):
        if why is None:
            try:
                why = untrusted(f"its directory {d}", os.stat(d))
            except OSError as exc:
                why = f"its directory {d} cannot be read: {exc}"
    if why:
        raise _bad(path, f"refused: {why}; whoever can write it decides what this check accepts (chown root, "
                         "chmod go-w; `ddpfix env --apply` writes it so)")


def load(path: str, *, trusted: bool = True) -> tuple[Cluster, dict[str, Any]]:
    """(the Cluster, the document) from a cluster file; anything malformed -> exit 2 naming the field. `trusted`: the
    file must pass `_check_trusted` (owned by root, writable by nobody else), else exit 2 before it is parsed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _bad(path, "does not exist (written by `ddpfix env --apply`)") from None
    except OSError as exc:
        raise _bad(path, f"cannot be read: {exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _bad(path, "is not a regular file")
        if trusted:
            _check_trusted(path, fd)
        with os.fdopen(os.dup(fd)) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise _bad(path, f"cannot be read: {' '.join(str(exc).split())}") from None
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _bad(path, f"schema is {doc.get('schema') if isinstance(doc, dict) else None!r}, expected {SCHEMA!r}")
    nodes_raw = doc.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise _bad(path, "nodes must be a non-empty list")

    hostvars: dict[str, dict[str, Any]] = {}
    for i, n in enumerate(nodes_raw):
        if not isinstance(n, dict) or not isinstance(n.get("name"), str) or isinstance(n.get("rank"), bool) \
                or not isinstance(n.get("rank"), int):
            raise _bad(path, f"nodes[{i}] needs a name and an integer rank, got {n!r}")
        if n.get("ifname") is not None and not valid_ifname(n["ifname"]):
            raise _bad(path, f"nodes[{i}].ifname {n['ifname']!r} is not an interface name")
        hv: dict[str, Any] = {"ansible_host": n.get("address") or n["name"], "ddp_node_rank": n["rank"]}
        if n.get("socket_ifname"):
            hv["ddp_socket_ifname"] = n["socket_ifname"]
        hostvars[n["name"]] = hv
    common = {"ddp_master": doc.get("master"), "ddp_master_port": doc.get("master_port"),
              "ddp_cluster_cidr": doc.get("cidr") or None, "ddp_nproc_per_node": doc.get("nproc_per_node", 1),
              "ddp_env_path": doc.get("env_path"), "ddp_env_process_vars": doc.get("env_process_vars", False),
              "ddp_env_scope": doc.get("env_scope") or "cluster", "ddp_job_port_range": doc.get("job_port_range"),
              "ddp_skip_findings": doc.get("skip_findings") or [], "ddp_cluster_cidr_ack_broad": True}
    if doc.get("hosts_domains"):
        common["ddp_hosts_domains"] = doc["hosts_domains"]
    for hv in hostvars.values():
        hv.update(common)
    data = {"ddp_nodes": {"hosts": list(hostvars)}, "_meta": {"hostvars": hostvars}}
    try:
        cluster = cluster_from_inventory_data(data)
    except DdpfixError as exc:
        raise _bad(path, str(exc)) from None
    return cluster, doc

