"""The cluster derived from an inventory: which hosts are its nodes, the master, the ranks and the settings, read
from `ansible-inventory --list` data (or a play's hostvars) into a validated `model.cluster.Cluster`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddpfix.factguard.grammar import one_line
from ddpfix.inventory.contract import (
    ACK_BROAD,
    BACKUP_KEEP_MAX,
    ENV_SCOPES,
    FIREWALL_CHOICES,
    GROUP,
    WRITE_VARS,
    bool_var,
    check_env_path,
    check_env_template,
    check_host_name,
    check_hosts_domains,
    check_ifname,
    check_ntp_server,
    check_python,
    check_role_var,
    fabric_vars,
    int_var,
    parse_cidr,
    parse_port_range,
    parse_skip,
    refused,
    role_var_specs,
)
from ddpfix.model.cluster import DEFAULT_ENV_PATH, DEFAULT_PORT, Cluster, Node


def cluster_from_inventory_data(data: Mapping[str, Any], inventories: Sequence[str] = ()) -> Cluster:
    """Build and validate the cluster from `ansible-inventory --list` output."""
    hostvars: Mapping[str, Mapping[str, Any]] = (data.get("_meta") or {}).get("hostvars") or {}
    if GROUP in data:
        names = _group_hosts(data, GROUP)
        if not names:
            raise refused(f"inventory group '{GROUP}' has no hosts")
    else:
        names = _group_hosts(data, "all")
        if not names:
            raise refused(f"inventory has no hosts (expected a group '{GROUP}')")
    for n in names:
        check_host_name(n)
    first = hostvars.get(names[0], {})
    master = str(first.get("ddp_master") or names[0])
    if master not in names:
        raise refused(f"ddp_master '{master}' is not a host of group '{GROUP}' (hosts: {', '.join(names)})")
    mv = hostvars.get(master, {})
    port = int_var(mv.get("ddp_master_port", DEFAULT_PORT), "ddp_master_port", 1, 65535)
    cidr = mv.get("ddp_cluster_cidr")
    cidr = parse_cidr(cidr) if cidr not in (None, "") else None
    ack_broad = bool_var(mv.get(ACK_BROAD, False), ACK_BROAD)
    nproc = int_var(mv.get("ddp_nproc_per_node", 1), "ddp_nproc_per_node", 1, 1024)
    env_path = check_env_path(mv.get("ddp_env_path") or DEFAULT_ENV_PATH)
    env_adopt = bool_var(mv.get("ddp_env_adopt", False), "ddp_env_adopt")
    env_process_vars = bool_var(mv.get("ddp_env_process_vars", False), "ddp_env_process_vars")
    if env_process_vars and nproc != 1:
        raise refused(
            f"ddp_env_process_vars: true writes one RANK per node, so it needs ddp_nproc_per_node: 1, got {nproc} "
            "(with several processes per node torchrun sets RANK/WORLD_SIZE/LOCAL_RANK itself)"
        )
    env_scope = str(mv.get("ddp_env_scope") or "cluster")
    if env_scope not in ENV_SCOPES:
        raise refused(f"ddp_env_scope must be one of {', '.join(ENV_SCOPES)}, got {mv.get('ddp_env_scope')!r}")
    if env_scope == "node" and env_process_vars:
        raise refused("ddp_env_process_vars: true writes ranks into the env file, which ddp_env_scope: node keeps per "
                      "node only: set one of them")
    job_ports = mv.get("ddp_job_port_range")
    if job_ports not in (None, ""):
        lo, hi = parse_port_range(job_ports, "ddp_job_port_range")
        job_ports = f"{lo}-{hi}"
    env_template = check_env_template(mv.get("ddp_env_template"), inventories)
    mismatch = mv.get("ddp_slurm_count_mismatch")
    if mismatch not in (None, "") and not isinstance(mismatch, str):
        raise refused(f"ddp_slurm_count_mismatch must be a string, got {mismatch!r}")
    firewall = str(mv.get("ddp_firewall") or "auto")
    if firewall not in FIREWALL_CHOICES:
        raise refused(f"ddp_firewall must be one of {', '.join(FIREWALL_CHOICES)}, got {firewall!r}")
    ntp = mv.get("ddp_ntp_servers") or []
    if isinstance(ntp, str):
        ntp = [ntp]
    if not isinstance(ntp, list):
        raise refused(f"ddp_ntp_servers must be a list, got {ntp!r}")
    ntp = [check_ntp_server(x) for x in ntp]
    local_master = bool_var(mv.get("ddp_ntp_local_master", False), "ddp_ntp_local_master")
    hosts_domains = check_hosts_domains(mv.get("ddp_hosts_domains") or [])

    skip = parse_skip(mv.get("ddp_skip_findings") or [], "ddp_skip_findings")
    memlock = mv.get("ddp_memlock", "unlimited")
    memlock_kib = (
        None
        if str(memlock).strip().lower() in ("unlimited", "infinity", "-1")
        else int_var(memlock, "ddp_memlock (KiB, or unlimited)", 64, 2**40)
    )

    specs = role_var_specs()
    for n in names:
        hv = hostvars.get(n) or {}
        for var in sorted(set(hv) & set(specs)):
            check_role_var(n, var, hv[var], specs[var])
        if hv.get("ddp_socket_ifname"):
            check_ifname(hv["ddp_socket_ifname"], n)
        for var in ("ddp_python", "ddpfix_facts_python", "ddpfix_verify_python"):  # the roles' copies too
            if var in hv and not (isinstance(hv[var], str) and "{{" in hv[var] and var != "ddp_python"):
                check_python(hv[var], n, var)
        if "ddp_backup_keep" in hv:  # how many FILE.<pid>.<date>~ backups the roles keep per file they write
            int_var(hv["ddp_backup_keep"], f"ddp_backup_keep of {n}", 1, BACKUP_KEEP_MAX)
    ranks = _assign_ranks(names, master, hostvars)
    nodes = tuple(
        sorted(
            (
                Node(
                    name=n,
                    address=str(hostvars.get(n, {}).get("ansible_host") or n),
                    rank=ranks[n],
                    socket_ifname=(
                        str(hostvars[n]["ddp_socket_ifname"]) if hostvars.get(n, {}).get("ddp_socket_ifname") else None
                    ),
                    **fabric_vars(n, hostvars.get(n, {})),
                    role_vars={k: v for k, v in (hostvars.get(n) or {}).items() if k in WRITE_VARS},
                )
                for n in names
            ),
            key=lambda node: node.rank,
        )
    )
    return Cluster(
        nodes=nodes,
        master=master,
        master_port=port,
        cluster_cidr=cidr,
        nproc_per_node=nproc,
        env_path=env_path,
        env_adopt=env_adopt,
        env_process_vars=env_process_vars,
        env_scope=env_scope,
        job_port_range=str(job_ports) if job_ports else None,
        slurm_count_mismatch=one_line(mismatch, 1000) if mismatch else None,
        env_template=env_template,
        firewall=firewall,
        ntp_servers=tuple(str(s) for s in ntp),
        ntp_local_master=local_master,
        hosts_domains=hosts_domains,
        cidr_ack_broad=ack_broad,
        inventories=tuple(inventories),
        skip_findings=skip,
        memlock_kib=memlock_kib,
    )



def _group_hosts(data: Mapping[str, Any], group: str, seen: set[str] | None = None) -> list[str]:
    """Hosts of a group including its children, in inventory order, without duplicates."""
    seen = seen if seen is not None else set()
    if group in seen:
        return []
    seen.add(group)
    g = data.get(group) or {}
    out: list[str] = list(g.get("hosts") or [])
    for child in g.get("children") or []:
        out.extend(_group_hosts(data, child, seen))
    unique: list[str] = []
    for h in out:
        if h not in unique:
            unique.append(h)
    return unique


def _assign_ranks(names: list[str], master: str, hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Explicit ddp_node_rank wins; the rest fill the free ranks in inventory order, master first."""
    n = len(names)
    explicit: dict[str, int] = {}
    for h in names:
        if "ddp_node_rank" in (hostvars.get(h) or {}):
            explicit[h] = int_var(hostvars[h]["ddp_node_rank"], f"ddp_node_rank of {h}", 0, n - 1)
    by_rank: dict[int, str] = {}
    for h, r in explicit.items():
        if r in by_rank:
            raise refused(f"duplicate ddp_node_rank {r}: {by_rank[r]} and {h}")
        by_rank[r] = h
    if master in explicit and explicit[master] != 0:
        raise refused(f"ddp_master {master} must have rank 0, has ddp_node_rank {explicit[master]}")
    if 0 in by_rank and by_rank[0] != master:
        raise refused(f"ddp_node_rank 0 is {by_rank[0]} but ddp_master is {master}: rank 0 is the master")
    ranks = dict(explicit)
    free = iter(r for r in range(n) if r not in by_rank)
    for h in [master] + [x for x in names if x != master]:
        if h not in ranks:
            ranks[h] = next(free)
    return ranks


def cluster_from_hostvars(
    groups: Mapping[str, Any], hostvars: Mapping[str, Mapping[str, Any]], inventories: Sequence[str] = ()
) -> Cluster:
    """The same cluster from what a play sees (the ansible-playbook path, where extra vars such as a survey's
    `ddp_cluster_cidr` are part of every host's variables): only the `ddp_*` variables and `ansible_host` of the
    cluster's hosts are read, then validated by `cluster_from_inventory_data`.

    `groups`: the group tree as `ansible-inventory --list` writes it (`{group: {"hosts": [...], "children": [...]}}`,
    the same host order as the CLI's), or the play's flat `groups` variable (`{group: [hosts]}`: Ansible's order,
    the same unless the cluster group has grandchild groups)."""
    return cluster_from_inventory_data(inventory_data_from_hostvars(groups, hostvars), inventories)


def inventory_data_from_hostvars(
    groups: Mapping[str, Any], hostvars: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What `cluster_from_inventory_data` reads, in `ansible-inventory --list`'s shape, from what a play sees: the
    group tree and, of the cluster's hosts, only the `ddp_*` variables, `ansible_host` and the roles' inputs
    (`role_var_specs`, checked like the rest) (plain, templated values).
    The audit play hands this to the ddpfix CLI, which builds the same cluster from it without reading the inventory
    a second time."""
    tree: dict[str, Any] = {
        str(g): (dict(v) if isinstance(v, Mapping) else {"hosts": [str(h) for h in v or []]}) for g, v in groups.items()
    }
    group = GROUP if GROUP in tree else "all"
    names = _group_hosts(tree, group)
    data: dict[str, Any] = {**tree, "_meta": {"hostvars": {}}}
    specs = role_var_specs()
    for h in names:
        hv = hostvars.get(h) or {}
        data["_meta"]["hostvars"][h] = {
            str(k): plain(hv[k]) for k in list(hv) if str(k).startswith("ddp_") or k == "ansible_host" or k in specs
        }
    return data


def plain(value: Any) -> Any:
    """Plain Python containers and scalars of a value Ansible handed over (its own str/dict/list subclasses)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def load_cluster(inventories: Sequence[str]) -> Cluster:
    from ddpfix.ansible.listing import list_inventory  # CLI start: Ansible's listing only when a command reads one

    return cluster_from_inventory_data(list_inventory(inventories), inventories)
