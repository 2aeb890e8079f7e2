"""The plan (controller/ddpfix/plan.py) on the recorded clean cluster: ranks, env values, hosts block."""

from __future__ import annotations

import ipaddress
import json

import pytest
from unit_helpers import Sim, hosts_file_module, nodeinfo

from ddpfix.plan import CLUSTER_KEYS, effective_cidr, hosts_block, hosts_entries, plan_cluster, render_env


def _plan(sim: Sim):
    return plan_cluster(sim.cluster(), {n: d["node"] for n, d in sim.docs.items()})


def test_ranks_follow_the_inventory_and_master_is_zero(sim: Sim) -> None:
    sim.set_var(None, ddp_master="node2")
    plans = _plan(sim)
    assert {n: p.rank for n, p in plans.items()} == {"node2": 0, "node1": 1, "node3": 2}
    assert {n: p.env["NODE_RANK"] for n, p in plans.items()} == {"node2": "0", "node1": "1", "node3": "2"}


def test_env_values_single_process(sim: Sim) -> None:
    plans = _plan(sim)
    assert plans["node2"].env == {
        "MASTER_ADDR": "192.168.77.11", "MASTER_PORT": "29500", "NNODES": "3", "NODE_RANK": "1",
        "NPROC_PER_NODE": "1",
        "PET_NNODES": "3", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "192.168.77.11",
        "PET_MASTER_PORT": "29500",
        "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0", "TP_SOCKET_IFNAME": "eth0",
    }
    assert all(p.address == f"192.168.77.1{p.rank + 1}" and p.ifname == "eth0" for p in plans.values())


def test_process_vars_only_when_asked(sim: Sim) -> None:
    """A permanent file exporting RANK/WORLD_SIZE makes every shell look like a running rank to env:// code."""
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} & set(_plan(sim)["node2"].env)
    sim.set_var(None, ddp_env_process_vars=True)
    env = _plan(sim)["node2"].env
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "3", "0")


def test_process_vars_need_one_process_per_node(sim: Sim) -> None:
    from ddpfix.errors import DdpfixError

    sim.set_var(None, ddp_env_process_vars=True, ddp_nproc_per_node=2)
    with pytest.raises(DdpfixError, match=r"ddp_env_process_vars.*ddp_nproc_per_node: 1"):
        sim.cluster()
    sim.set_var(None, ddp_env_process_vars="maybe", ddp_nproc_per_node=1)
    with pytest.raises(DdpfixError, match="ddp_env_process_vars must be a boolean, got 'maybe'"):
        sim.cluster()


@pytest.mark.parametrize("nproc", [2, 8])
def test_world_size_and_no_rank_with_several_processes(sim: Sim, nproc: int) -> None:
    sim.set_var(None, ddp_nproc_per_node=nproc)
    for p in _plan(sim).values():
        assert p.env["PET_NPROC_PER_NODE"] == p.env["NPROC_PER_NODE"] == str(nproc)
        assert "RANK" not in p.env and "WORLD_SIZE" not in p.env  # torchrun sets them per process


def test_nccl_uses_exact_match_and_per_node_names(sim: Sim) -> None:
    n = sim.node("node2")
    next(i for i in n["interfaces"] if i["name"] == "eth0")["name"] = "ens5"
    n["cluster"] = nodeinfo().cluster_interface(n["interfaces"], "", "192.168.77.11")
    plans = _plan(sim)
    assert plans["node2"].env["NCCL_SOCKET_IFNAME"] == "=ens5"  # not the prefix "ens5" (would match ens50)
    assert plans["node2"].env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert plans["node1"].env["NCCL_SOCKET_IFNAME"] == "=eth0"


def test_master_addr_is_the_masters_cluster_address_literal(sim: Sim) -> None:
    # even when the inventory reaches the master through a public/NAT name
    sim.set_var("node1", ansible_host="node1.example.com")
    addr = _plan(sim)["node3"].env["MASTER_ADDR"]
    assert addr == "192.168.77.11"
    ipaddress.ip_address(addr)


def test_master_addr_with_master_not_first(sim: Sim) -> None:
    sim.set_var(None, ddp_master="node3")
    for d in sim.docs.values():  # facts were gathered with node3 as the master
        d["node"]["cluster"] = nodeinfo().cluster_interface(d["node"]["interfaces"], "", "192.168.77.13")
    assert {p.env["MASTER_ADDR"] for p in _plan(sim).values()} == {"192.168.77.13"}


def test_cluster_keys_agree_on_every_node(sim: Sim) -> None:
    plans = _plan(sim)
    for k in CLUSTER_KEYS:
        assert len({p.env.get(k) for p in plans.values()}) == 1, k


def test_node_without_facts_or_outside_cidr_is_not_writable(sim: Sim) -> None:
    facts = {n: d["node"] for n, d in sim.docs.items()}
    facts["node3"] = None
    sim.set_var("node3", ansible_host="node3.example")  # not an address: nothing to fall back on
    plans = plan_cluster(sim.cluster(), facts)
    assert plans["node3"].address is None and plans["node3"].ifname is None
    assert "NCCL_SOCKET_IFNAME" not in plans["node3"].env
    assert plans["node3"].env["NODE_RANK"] == "2" and plans["node3"].env["PET_NNODES"] == "3"
    sim.set_var(None, ddp_cluster_cidr="10.0.0.0/8")
    plans = _plan(sim)
    assert all(p.address is None for p in plans.values())
    assert plans["node1"].env["MASTER_ADDR"] == ""


def test_effective_cidr(sim: Sim) -> None:
    facts = {n: d["node"] for n, d in sim.docs.items()}
    assert effective_cidr(sim.cluster(), facts) == "192.168.77.0/24"  # the master's on-link subnet
    sim.set_var(None, ddp_cluster_cidr="192.168.0.0/16")
    assert effective_cidr(sim.cluster(), facts) == "192.168.0.0/16"
    sim.set_var(None, ddp_cluster_cidr="")
    assert effective_cidr(sim.cluster(), {"node1": None}) is None


def test_render_env_and_hosts_block(sim: Sim) -> None:
    plans = _plan(sim)
    text = render_env(plans["node1"])
    assert text.startswith("# BEGIN ddpfix managed block\n") and text.endswith("# END ddpfix managed block\n")
    assert "\nMASTER_ADDR=192.168.77.11\n" in text and "\nNCCL_SOCKET_IFNAME==eth0\n" in text
    assert text.endswith("\n")
    assert render_env(plans["node1"]) == text  # no timestamps: deterministic
    assert nodeinfo().parse_env_file(text) == plans["node1"].env
    assert hosts_block(plans) == "192.168.77.11 node1\n192.168.77.12 node2\n192.168.77.13 node3"


def test_hosts_block_names_only_what_the_inventory_vouches_for(sim: Sim) -> None:
    """A hostname that is not the node's inventory name (or its short form under ddp_hosts_domains) is no name of
    the cluster's: the block carries the inventory name alone."""
    sim.node("node2")["hostname"] = "gpu-b07"
    plans = _plan(sim)
    assert plans["node2"].hostname is None
    assert "192.168.77.12 node2" in hosts_block(plans).splitlines() and "gpu-b07" not in hosts_block(plans)


def test_hosts_domains_vouch_for_the_short_form_and_the_fqdn(sim: Sim) -> None:
    hv = sim.inventory["_meta"]["hostvars"]
    hv["node2.dc1.example"] = hv.pop("node2")
    sim.inventory["ddp_nodes"]["hosts"] = ["node1", "node2.dc1.example", "node3"]
    sim.set_var(None, ddp_hosts_domains=["DC1.example."])
    sim.docs["node2.dc1.example"] = sim.docs.pop("node2")
    sim.node("node2.dc1.example")["hostname"] = "node2"  # the short form of its inventory name
    sim.node("node3")["hostname"] = "node3.dc1.example"  # its inventory name under the domain
    plans = _plan(sim)
    assert (plans["node2.dc1.example"].hostname, plans["node3"].hostname) == ("node2", "node3.dc1.example")
    assert hosts_block(plans).splitlines()[1:] == ["192.168.77.12 node2 node2.dc1.example",
                                                   "192.168.77.13 node3.dc1.example node3"]
    sim.node("node3")["hostname"] = "node3.dc2.example"  # not a configured domain
    assert _plan(sim)["node3"].hostname is None


@pytest.mark.parametrize("value", [{"a": 1}, ["dc1 example"], ["{{ x }}"], [""], ["10.0.0.1"]])
def test_hosts_domains_refused(sim: Sim, value: object) -> None:
    from ddpfix.errors import DdpfixError

    sim.set_var(None, ddp_hosts_domains=value)
    with pytest.raises(DdpfixError, match="ddp_hosts_domains"):
        sim.cluster()


def test_a_node_claiming_another_name_is_written_nowhere(sim: Sim) -> None:
    """Issue 36 item 1 on the recorded cluster: node3 reports the hostname pypi.org (on 127.0.1.1) and then node1's
    name: neither reaches the block or the cluster file, and the renderer leaves the operator's lines for names
    it does not manage as they were."""
    from ddpfix import clusterfile
    from ddpfix.rules.context import Context, HostFacts

    render = hosts_file_module().render
    operator = "127.0.0.1\tlocalhost\n10.0.0.5 nfs01 storage\n203.0.113.80 pypi.org  # mirror\n"
    for claim in ("pypi.org", "nfs01", "node1"):
        sim.node("node3")["hostname"] = claim
        sim.set_hosts_file("node3", f"127.0.0.1 localhost\n127.0.1.1 {claim}\n")
        plans = _plan(sim)
        entries = hosts_entries(plans)
        assert entries == [{"address": f"192.168.77.1{i}", "names": [f"node{i}"]} for i in (1, 2, 3)], entries
        text, removed = render(operator, entries)
        assert text.startswith(operator) and removed == [], text
        ctx = Context(sim.cluster(), {n: HostFacts(n, node=d["node"], probe=d["probe"]) for n, d in sim.docs.items()})
        doc = clusterfile.build(ctx)
        assert claim not in json.dumps(doc["nodes"]) or claim == "node1", doc
        assert [n["hostname"] for n in doc["nodes"]] == ["node1", "node2", None]


# ---------------------------------------------------------------- partial runs (--limit, unreachable nodes)


def test_limited_out_nodes_keep_ranks_world_size_and_master_addr(sim: Sim) -> None:
    """Only node2 was read (--limit node2): the plan is still the whole cluster's, the master from the inventory."""
    sim.set_var(None, ddp_cluster_cidr="192.168.77.0/24")
    facts = {"node2": sim.node("node2")}
    plans = plan_cluster(sim.cluster(), facts)
    assert set(plans) == {"node1", "node2", "node3"}
    env = plans["node2"].env
    assert (env["NNODES"], env["PET_NNODES"], env["NODE_RANK"], env["MASTER_ADDR"]) == ("3", "3", "1", "192.168.77.11")
    assert plans["node2"].source == "facts" and plans["node1"].source == "inventory"
    assert plans["node2"].env["NCCL_SOCKET_IFNAME"] == "=eth0"


def test_master_outside_cidr_in_inventory_gives_no_master_addr(sim: Sim) -> None:
    sim.set_var(None, ddp_cluster_cidr="192.168.77.0/24")
    sim.set_var("node1", ansible_host="203.0.113.5")  # reached over a public address: not the cluster address
    plans = plan_cluster(sim.cluster(), {"node2": sim.node("node2")})
    assert plans["node2"].env["MASTER_ADDR"] == "" and plans["node1"].address is None


def test_unread_node_is_named_by_the_inventory_only(sim: Sim) -> None:
    """node3 is down: its line stays in the block with its inventory name; what the read nodes' /etc/hosts map to
    its address (an operator's `registry.internal`, `ldap`) is no name ddpfix writes."""
    sim.set_hosts_file("node1", "127.0.0.1 localhost\n192.168.77.13 registry.internal ldap node3 ip6-bogus\n")
    facts = {n: d["node"] for n, d in sim.docs.items()}
    facts["node3"] = None
    partial = hosts_block(plan_cluster(sim.cluster(), facts))
    assert partial == hosts_block(_plan(sim)) == "192.168.77.11 node1\n192.168.77.12 node2\n192.168.77.13 node3"


def test_invalid_facts_are_reported_and_never_planned(sim: Sim) -> None:
    from ddpfix.factguard.facts import sanitize_facts, validate_facts

    bad = dict(sim.node("node2"), hostname="a b\n{{ x }}")
    bad["cluster"] = dict(bad["cluster"], address="192.168.77.12\n10.0.0.1 evil")
    problems = {fact for fact, _, _ in validate_facts(bad)}
    assert problems == {"hostname", "cluster.address"}
    facts = {n: d["node"] for n, d in sim.docs.items()}
    facts["node2"] = sanitize_facts(bad)
    sim.set_var(None, ddp_cluster_cidr="192.168.77.0/24")
    block = hosts_block(plan_cluster(sim.cluster(), facts))
    assert "evil" not in block and "{{" not in block and "a b" not in block
    # node2 was read but its address is unusable: it is not in the block (its inventory address is not used)
    assert "node2" not in block
    assert validate_facts(dict(sim.node("node3"), hostname="localhost"))[0][:2] == ("hostname", "localhost")
    assert validate_facts(sim.node("node1")) == []


def test_odd_interfaces_and_macs_are_reported_and_dropped(sim: Sim) -> None:
    """Every string a node returns is checked, the cluster interface's or not: an ill-formed interface name or MAC
    is reachability_rules.INVALID (a node that says such things is refused), and the sanitized facts never carry it."""
    from ddpfix.factguard.facts import sanitize_facts, validate_facts

    f = dict(sim.node("node1"))
    f["interfaces"] = [dict(i) for i in f["interfaces"]] + [{"name": "bad if\n", "addrs": [], "mac": None}]
    f["interfaces"][0]["mac"] = "aa:bb\nx"
    assert {(fld, v) for fld, v, _ in validate_facts(f)} == {
        ("interfaces[].name", "bad if\n"), (f"interfaces[{f['interfaces'][0]['name']}].mac", "aa:bb\nx")}
    clean = sanitize_facts(f)
    assert all(i["name"] != "bad if\n" for i in clean["interfaces"]) and clean["interfaces"][0]["mac"] is None


# ---------------------------------------------------------------- derived NCCL / libfabric keys (GPU fabric)

from unit_helpers import _add_mgmt_hca, _fabric, _port  # noqa: E402


def test_no_fabric_no_fabric_keys(sim: Sim) -> None:
    for p in _plan(sim).values():
        assert not {"NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "FI_PROVIDER"} & set(p.env) and p.comments == {}


def test_ib_hca_lists_the_active_data_rails_and_leaves_out_mgmt_and_down(sim: Sim) -> None:
    _fabric(sim)
    _add_mgmt_hca(sim, "node2")
    _port(sim, "node3").update(state="DOWN")
    plans = _plan(sim)
    assert plans["node1"].env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert plans["node2"].env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"  # mlx5_2 is on eth0, the SSH interface
    assert plans["node3"].env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert "1 port(s) left out" in plans["node2"].comments["NCCL_IB_HCA"]
    text = render_env(plans["node2"])
    assert "# NCCL_IB_HCA: the ACTIVE data-rail RDMA ports" in text and "\nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n" in text
    assert "NCCL_IB_GID_INDEX" not in plans["node1"].env  # InfiniBand: no GID index


@pytest.mark.parametrize("versions, want", [
    ({}, "3"),  # NCCL unknown: the right index is harmless
    ({"node1": "2.18.3", "node2": "2.21.5", "node3": "2.21.5"}, "3"),
    ({"node1": "2.21.5", "node2": "2.23.4", "node3": "2.21.5"}, None),  # NCCL chooses by itself
])
def test_gid_index_only_when_common_and_needed(sim: Sim, versions: dict[str, str], want: str | None) -> None:
    _fabric(sim, "roce")
    for n, v in versions.items():
        sim.node(n)["fabric"]["nccl_version"] = v
    got = {p.env.get("NCCL_IB_GID_INDEX") for p in _plan(sim).values()}
    assert got == {want}


def test_gid_index_differing_is_not_written_but_inventory_wins(sim: Sim) -> None:
    _fabric(sim, "roce")
    next(g for g in _port(sim, "node3", "mlx5_0")["gids"] if g["type"] == "RoCE v2" and g["ipv4"])["index"] = 5
    assert {p.env.get("NCCL_IB_GID_INDEX") for p in _plan(sim).values()} == {None}
    sim.set_var("node3", ddp_nccl_ib_gid_index=5, ddp_nccl_ib_hca="=mlx5_0:1")
    p3 = _plan(sim)["node3"]
    assert (p3.env["NCCL_IB_GID_INDEX"], p3.env["NCCL_IB_HCA"]) == ("5", "=mlx5_0:1")
    assert p3.comments["NCCL_IB_HCA"] == "ddp_nccl_ib_hca (inventory)"


def test_efa_sets_libfabric_provider(sim: Sim) -> None:
    _fabric(sim, "efa")
    p = _plan(sim)["node1"]
    assert (p.env["FI_PROVIDER"], p.env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1") and "NCCL_IB_HCA" not in p.env


def test_env_extra_is_added_with_its_comment(sim: Sim) -> None:
    sim.set_var(None, ddp_env_extra={"NCCL_DEBUG": "WARN", "NCCL_IB_TIMEOUT": 22})
    p = _plan(sim)["node1"]
    assert (p.env["NCCL_DEBUG"], p.env["NCCL_IB_TIMEOUT"]) == ("WARN", "22")
    assert "# NCCL_DEBUG: ddp_env_extra (inventory)\nNCCL_DEBUG=WARN\n" in render_env(p)


def test_the_claim_is_a_finding_and_no_fix(sim: Sim) -> None:
    """node3's pypi.org on 127.0.1.1 is NAME_UNVOUCHED (naming node and name), not HOSTNAME_LOOPBACK: the
    hosts fix, which that would turn on for every node, could write no name a node chose. node2's own hostname on
    127.0.1.1 (the Debian default) stays the fixable HOSTNAME_LOOPBACK."""
    from ddpfix.remediate import HOSTS_IDS
    from ddpfix.rules import hosts as hosts_rules

    sim.node("node3")["hostname"] = "pypi.org"
    sim.node("node3")["resolve_self"] = {"pypi.org": ["127.0.1.1"]}
    got = {(f.id, f.host): f for f in sim.findings()}
    claim = got[(hosts_rules.NAME_UNVOUCHED.id, "node3")]
    assert "node3 reports the hostname pypi.org" in claim.message and "127.0.1.1" in claim.message
    assert "pypi.org" in claim.fix and not claim.rule.fixable
    assert not {i for i, _ in got} & HOSTS_IDS
    sim.node("node2")["resolve_self"] = {"node2": ["127.0.1.1"]}
    got = {(f.id, f.host) for f in sim.findings()}
    assert (hosts_rules.HOSTNAME_LOOPBACK.id, "node2") in got and (hosts_rules.HOSTNAME_LOOPBACK.id, "node3") not in got
