"""The node-side readers (roles/ddpfix_facts/module_utils/ddpfix_nodeinfo.py) on recorded real input.

fixtures/facts/recorded/ holds what record.py captured on a real machine: `chronyc -c -n tracking` of real
chronyd daemons, /proc/net/tcp{,6} with known sockets open, `ip -j addr` as returned by ddpfix_node_facts.
"""

from __future__ import annotations

import json

import pytest
from unit_helpers import nodeinfo, recorded

ni = nodeinfo()


# ---------------------------------------------------------------- parse_env_file


def test_parse_env_file_bash_subset() -> None:
    text = """# Managed by ddpfix
export MASTER_ADDR=192.168.77.11
MASTER_PORT = 29500
NCCL_SOCKET_IFNAME="=eth0"
GLOO_SOCKET_IFNAME='eth0'
   # indented comment

TORCH_ARGS="--foo 'bar baz'"
EMPTY=
NOEQUALS
URL=http://x/?a=b
export NODE_RANK=0
NODE_RANK=2
"""
    assert ni.parse_env_file(text) == {
        "MASTER_ADDR": "192.168.77.11",
        "MASTER_PORT": "29500",
        "NCCL_SOCKET_IFNAME": "=eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "TORCH_ARGS": "--foo 'bar baz'",
        "EMPTY": "",
        "URL": "http://x/?a=b",
        "NODE_RANK": "2",  # the last assignment wins, as in bash
    }


def test_parse_env_file_unbalanced_quote_falls_back() -> None:
    assert ni.parse_env_file("A='it's'\n") == {"A": "it's"}
    assert ni.parse_env_file("") == {}


def test_parse_env_file_reads_what_plan_renders() -> None:
    from ddpfix.plan import NodePlan, render_env

    env = {"MASTER_ADDR": "192.168.77.11", "NCCL_SOCKET_IFNAME": "=eth0", "RANK": "0"}
    assert ni.parse_env_file(render_env(NodePlan("node1", 0, "node1", "192.168.77.11", "eth0", env))) == env


# ---------------------------------------------------------------- parse_hosts_file


def test_parse_hosts_file_real_and_debian() -> None:
    real = ni.parse_hosts_file(recorded("etc-hosts.txt"))
    assert real and all(e["addr"] and e["names"] and e["text"] for e in real)
    text = ("127.0.0.1\tlocalhost\n127.0.1.1\tnode2.example.com node2   # added by installer\n\n"
            "# The following lines are desirable for IPv6 capable hosts\n"
            "::1     localhost ip6-localhost ip6-loopback\n#10.0.0.5 old\nbogusline\n")
    assert ni.parse_hosts_file(text) == [
        {"line": 1, "addr": "127.0.0.1", "names": ["localhost"], "text": "127.0.0.1\tlocalhost"},
        {"line": 2, "addr": "127.0.1.1", "names": ["node2.example.com", "node2"],
         "text": "127.0.1.1\tnode2.example.com node2   # added by installer"},
        {"line": 5, "addr": "::1", "names": ["localhost", "ip6-localhost", "ip6-loopback"],
         "text": "::1     localhost ip6-localhost ip6-loopback"},
    ]


def test_relevant_hosts_entries_keep_own_names_deviations_and_dialled_addresses() -> None:
    """A node returns O(k) /etc/hosts lines however long the file is (a managed block of 2,000 nodes)."""
    block = "".join(f"10.0.{i // 250}.{i % 250 + 1} n{i}\n" for i in range(2000))
    text = "127.0.0.1 localhost\n127.0.1.1 gpu7.example.com gpu7\n10.9.9.9 n5 # stale\n" + block
    kept = ni.relevant_hosts_entries(ni.parse_hosts_file(text), ["gpu7", "gpu7.example.com", "n5"],
                                     ["10.0.0.9", "10.0.4.1", "10.0.0.1"])
    assert [e["text"] for e in kept] == [
        "127.0.1.1 gpu7.example.com gpu7",  # its own names
        "10.9.9.9 n5 # stale",  # a name that resolved other than expected: every line of it
        "10.0.0.1 n0",  # the addresses it dials (where remediate learns the names of a node it cannot reach)
        "10.0.0.6 n5",
        "10.0.0.9 n8",
        "10.0.4.1 n1000",
    ]  # in the file's order


# ---------------------------------------------------------------- parse_chronyc_tracking


def test_parse_chronyc_tracking_synchronised_client() -> None:
    t = ni.parse_chronyc_tracking(recorded("chronyc-client.csv"))
    assert t["synchronised"] is True
    assert t["leap_status"] == "Normal"
    assert t["ref_id"] == "7F000001" and t["ref_name"] == "127.0.0.1"
    assert t["stratum"] == 11
    assert isinstance(t["system_offset"], float) and abs(t["system_offset"]) < 0.01
    assert isinstance(t["frequency_ppm"], float) and isinstance(t["update_interval"], float)


def test_parse_chronyc_tracking_local_reference_is_synchronised() -> None:
    t = ni.parse_chronyc_tracking(recorded("chronyc-server.csv"))
    assert t["ref_id"] == "7F7F0101" and t["stratum"] == 10 and t["synchronised"] is True


def test_parse_chronyc_tracking_not_synchronised() -> None:
    t = ni.parse_chronyc_tracking(recorded("chronyc-unreachable.csv"))
    assert t["leap_status"] == "Not synchronised"
    assert t["ref_id"] == "00000000" and t["stratum"] == 0
    assert t["synchronised"] is False


def test_parse_chronyc_tracking_zero_refid_is_unsynchronised_even_with_normal_leap() -> None:
    line = recorded("chronyc-unreachable.csv").replace("Not synchronised", "Normal")
    assert ni.parse_chronyc_tracking(line)["synchronised"] is False


@pytest.mark.parametrize("text", ["", "506 Cannot talk to daemon\n", "7F000001,127.0.0.1,11\n"])
def test_parse_chronyc_tracking_unreadable(text: str) -> None:
    assert ni.parse_chronyc_tracking(text) is None


# ---------------------------------------------------------------- listening_ports


def test_listening_ports_real_proc_net_tcp() -> None:
    socks = json.loads(recorded("sockets.json"))
    ports = ni.listening_ports(recorded("sockets-proc-net-tcp.txt"), recorded("sockets-proc-net-tcp6.txt"))
    assert socks["listen_v4"] in ports and socks["listen_v6"] in ports
    assert socks["established_client"] not in ports  # ESTABLISHED (01), not LISTEN (0A)
    assert socks["bound_not_listening"] not in ports
    assert ports == sorted(set(ports))


def test_listening_ports_v4_only_and_junk() -> None:
    socks = json.loads(recorded("sockets.json"))
    ports = ni.listening_ports(recorded("sockets-proc-net-tcp.txt"))
    assert socks["listen_v4"] in ports and socks["listen_v6"] not in ports
    assert ni.listening_ports("", None) == []
    assert ni.listening_ports("header\n   0: garbage 00000000:0000 0A\n") == []


# ---------------------------------------------------------------- cluster_interface

REC_IFACES = json.loads(recorded("node_facts.json"))["interfaces"]  # this machine, through ddpfix_node_facts


def _ifaces(*spec: tuple[str, int, list[str]]) -> list[dict]:
    return [{"name": n, "index": idx, "addrs": [{"family": "inet6" if ":" in a else "inet", "local": a.split("/")[0],
                                                  "prefixlen": int(a.split("/")[1])} for a in addrs]}
            for n, idx, addrs in spec]


IFACES = _ifaces(("lo", 1, ["127.0.0.1/8", "::1/128"]), ("ens3", 2, ["10.20.0.11/24"]),
                 ("eth0", 3, ["192.168.77.11/24", "fe80::1/64"]), ("docker0", 4, ["172.17.0.1/16"]))


def test_cluster_interface_derived_on_recorded_interfaces() -> None:
    eth = next(i for i in REC_IFACES if i["name"] == "eth0")
    mine = next(a for a in eth["addrs"] if a["family"] == "inet")
    got = ni.cluster_interface(REC_IFACES, "", mine["local"])
    assert got == {"cidr": str(__import__("ipaddress").ip_network(f"{mine['local']}/{mine['prefixlen']}", strict=False)),
                   "ifname": "eth0", "address": mine["local"], "source": "cidr"}


def test_cluster_interface_cidr_given() -> None:
    assert ni.cluster_interface(IFACES, "192.168.77.0/24", "") == {
        "cidr": "192.168.77.0/24", "ifname": "eth0", "address": "192.168.77.11", "source": "cidr"}
    # a wider CIDR given explicitly, not strict about host bits
    assert ni.cluster_interface(IFACES, "10.20.0.5/16", "192.168.77.11")["ifname"] == "ens3"


def test_cluster_interface_derived_from_master_address() -> None:
    got = ni.cluster_interface(IFACES, "", "192.168.77.12")
    assert got == {"cidr": "192.168.77.0/24", "ifname": "eth0", "address": "192.168.77.11", "source": "cidr"}


def test_cluster_interface_never_derives_from_loopback() -> None:
    got = ni.cluster_interface(IFACES, "", "127.0.0.1")
    assert got == {"cidr": None, "ifname": None, "address": None, "source": None}


def test_cluster_interface_master_not_on_link() -> None:
    assert ni.cluster_interface(IFACES, "", "203.0.113.10")["cidr"] is None
    assert ni.cluster_interface(IFACES, "", "master.example.com")["cidr"] is None


def test_cluster_interface_override() -> None:
    got = ni.cluster_interface(IFACES, "192.168.77.0/24", "", "eth0")
    assert got == {"cidr": "192.168.77.0/24", "ifname": "eth0", "address": "192.168.77.11", "source": "override"}
    # override not on the cluster network: reported with no address
    got = ni.cluster_interface(IFACES, "", "192.168.77.12", "docker0")
    assert got == {"cidr": "192.168.77.0/24", "ifname": "docker0", "address": None, "source": "override"}
    # override that does not exist: still reported (netif_rules.MISSING is decided by the controller)
    assert ni.cluster_interface(IFACES, "", "192.168.77.12", "ens5")["ifname"] == "ens5"


def test_cluster_interface_lowest_index_wins_and_invalid_cidr() -> None:
    two = _ifaces(("eth1", 5, ["192.168.77.21/24"]), ("eth0", 3, ["192.168.77.11/24"]))
    assert ni.cluster_interface(two, "192.168.77.0/24", "")["ifname"] == "eth0"
    assert ni.cluster_interface(two, "not-a-cidr", "192.168.77.1")["cidr"] == "192.168.77.0/24"


def test_cluster_interface_ipv6_cluster() -> None:
    v6 = _ifaces(("eth0", 2, ["fd00:77::11/64", "192.168.1.5/24"]))
    got = ni.cluster_interface(v6, "fd00:77::/64", "")
    assert got["address"] == "fd00:77::11" and got["ifname"] == "eth0"


# ---------------------------------------------------------------- resolve, running_time_daemons


def test_resolve_literal_and_bad_name() -> None:
    assert ni.resolve("192.168.77.11") == ["192.168.77.11"]  # a literal needs no resolver
    assert ni.resolve("bad\x00name") == []  # errors become "no address", never an exception


def test_running_time_daemons_reads_comm(tmp_path) -> None:
    for pid, comm in (("1", "systemd"), ("200", "chronyd"), ("201", "chronyd"), ("300", "ntpd"), ("x", "chronyd")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "comm").write_text(comm + "\n")
    (tmp_path / "400").mkdir()  # process gone: no comm
    assert ni.running_time_daemons(str(tmp_path)) == ["chronyd", "ntpd"]
    assert ni.running_time_daemons(str(tmp_path / "missing")) == []


# ---------------------------------------------------------------- cluster_interface


def _iface(name: str, index: int, local: str, prefixlen: int, up: bool = True) -> dict[str, object]:
    return {"name": name, "index": index, "flags": ["BROADCAST", "UP"] if up else ["BROADCAST"],
            "operstate": "UP" if up else "DOWN", "addrs": [{"family": "inet", "local": local, "prefixlen": prefixlen}]}


def test_cluster_interface_skips_a_dead_or_host_only_interface_ordered_first() -> None:
    data = _iface("data0", 5, "10.1.0.13", 24)
    dead = _iface("ens1", 2, "10.1.0.90", 24, up=False)  # a lower index, down: not the cluster interface
    iso = _iface("iso0", 3, "10.1.0.203", 32)  # a /32 on a link to nowhere (or a VIP on a dummy), up
    got = ni.cluster_interface([iso, dead, data], "10.1.0.0/24", "10.1.0.11")
    assert (got["ifname"], got["address"], got["source"]) == ("data0", "10.1.0.13", "cidr")
    # the index still decides between equals, and a host-only or down interface is taken when it is all there is
    assert ni.cluster_interface([data, _iface("data1", 4, "10.1.0.14", 24)], "10.1.0.0/24", "")["ifname"] == "data1"
    assert ni.cluster_interface([iso, dead], "10.1.0.0/24", "")["ifname"] == "iso0"
    assert ni.cluster_interface([dead], "10.1.0.0/24", "")["ifname"] == "ens1"
    # the override is reported as it is, whatever its state
    assert ni.cluster_interface([iso, data], "10.1.0.0/24", "", override="iso0")["address"] == "10.1.0.203"


def test_packed_hosts_lines_read_back_as_the_file_parses() -> None:
    """The facts module sends its /etc/hosts entries as one string (`pack_hosts_entries`); the controller's
    `unpack_hosts_lines` gives back exactly the entries `parse_hosts_file` gives: line numbers, addresses, names and
    each line's text as it was (tabs, runs of spaces, a trailing comment, non-ASCII names)."""
    tricky = ("127.0.0.1\tlocalhost\n\n# c\n10.0.0.7  n\u00f6de7\tn7   # \u00e9 added\t\n  10.0.0.8\tn8\n"
              "fe80::1%eth0 ll\n10.0.0.9 n9#glued\nonlyone\n")
    for text in (recorded("etc-hosts.txt"), tricky, ""):
        entries = ni.parse_hosts_file(text)
        packed = ni.pack_hosts_entries(entries)
        assert isinstance(packed, str) and ni.unpack_hosts_lines(packed) == entries
    assert [e["line"] for e in ni.unpack_hosts_lines(ni.pack_hosts_entries(ni.parse_hosts_file(tricky)))] == [
        1, 4, 5, 6, 7]


def test_unpacking_takes_only_numbered_host_lines() -> None:
    """What a node sent is text: a row that is not `<number>\\t<line>` (no tab, a number that is not plain ASCII
    digits or is too long), or whose line names no host, is left out; anything but a string gives no entries."""
    rows = ["3\t10.0.0.1 a", "x\t10.0.0.2 b", "10.0.0.3 c", "\u0661\t10.0.0.4 d", "-1\t10.0.0.5 e",
            "1234567890\t10.0.0.6 f", "7\t# 10.0.0.7 g", "8\t10.0.0.8", "9\t10.0.0.9 h\ti"]
    assert ni.unpack_hosts_lines("\n".join(rows)) == [
        {"line": 3, "addr": "10.0.0.1", "names": ["a"], "text": "10.0.0.1 a"},
        {"line": 9, "addr": "10.0.0.9", "names": ["h", "i"], "text": "10.0.0.9 h\ti"}]
    for bad in (None, 5, ["3\t10.0.0.1 a"], {"3": "10.0.0.1 a"}):
        assert ni.unpack_hosts_lines(bad) == []
