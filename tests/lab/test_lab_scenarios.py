"""Each lab scenario really builds its fault (one 3-node lab per scenario, checked inside the nodes; the fabric
scenarios share one lab that apply_fabric switches from scenario to scenario)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers import sh

from ddpfix import lab
from ddpfix.lab.scenarios.hosts import CLAIMED_NAME, WRONG_PEER_ADDR
from ddpfix.lab.scenarios.inplace import apply_fabric
from ddpfix.lab.scenarios.netif import PUBLIC_MASTER_ADDR
from ddpfix.lab.scenarios.registry import SCENARIOS
from ddpfix.lab.scenarios.sites import DATA_IFNAMES, ISO_IFNAME, SSH_SETUPS, data_address, data_network

LISTEN = "import socket,sys,time; s=socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); time.sleep(30)"


def resolve(info, node: str, name: str) -> list[str]:
    out = sh(info, node, f"getent ahostsv4 {name} || true").stdout
    addrs: list[str] = []
    for line in out.splitlines():
        if line.split()[0] not in addrs:
            addrs.append(line.split()[0])
    return addrs


def env_file(info, node: str) -> dict[str, str] | None:
    res = sh(info, node, "cat /etc/ddpfix/ddp.env", check=False)
    if res.returncode:
        return None
    return dict(ln.split("=", 1) for ln in res.stdout.splitlines() if ln and not ln.startswith("#"))


def links(info, node: str) -> list[dict]:
    return json.loads(sh(info, node, "ip -j addr").stdout)


def tcp_ok(info, src: str, addr: str, port: int) -> bool:
    return sh(info, src, f"nc -z -w 2 {addr} {port}", check=False).returncode == 0


def with_listener(info, node: str, port: int, fn: Callable[[], None]) -> None:
    p = lab.node_popen(info.name, node, ["python3", "-c", LISTEN, str(port)])
    try:
        deadline = time.monotonic() + 5
        while str(port) not in sh(info, node, f"ss -Hltn 'sport = :{port}'").stdout:
            assert time.monotonic() < deadline, "listener did not start"
            time.sleep(0.05)
        fn()
    finally:
        p.kill()
        p.wait()


def inventory(info) -> dict:
    return yaml.safe_load(info.inventory.read_text())["all"]["children"]["ddp_nodes"]


def chronyd_running(info, node: str) -> bool:
    return sh(info, node, "chronyc -c tracking", check=False).returncode == 0


# ------------------------------------------------------------------ one check per scenario

def check_clean(info) -> None:
    for n in info.nodes:
        for peer in info.nodes:
            assert resolve(info, n.name, peer.hostname) == [peer.address]
        assert env_file(info, n.name) is None
        assert sh(info, n.name, "iptables-save").stdout.strip() == ""
        assert lab.chrony_tracking(info.name, n.name)["leap_status"] == "Normal"
    assert "ddp_socket_ifname" not in json.dumps(inventory(info))


def check_firewalld_master(info) -> None:
    m, w = info.nodes[0], info.nodes[1]
    assert sh(info, m.name, "firewall-cmd --state").stdout.strip() == "running"
    assert sh(info, m.name, "firewall-cmd --get-default-zone").stdout.strip() == "public"
    assert sh(info, m.name, "firewall-cmd --list-services").stdout.split() == ["ntp", "ssh"]
    assert sh(info, w.name, "firewall-cmd --state", check=False).returncode != 0
    assert sh(info, w.name, "nft list ruleset").stdout.strip() == ""
    assert tcp_ok(info, w.name, m.address, 22)  # ssh still works
    with_listener(info, m.name, 29500, lambda: (
        _assert(not tcp_ok(info, w.name, m.address, 29500), "master port reachable through firewalld"),
        _assert(tcp_ok(info, m.name, "127.0.0.1", 29500), "listener not up"),
    ))
    with_listener(info, m.name, 40000, lambda: _assert(not tcp_ok(info, w.name, m.address, 40000), "ephemeral port open"))
    with_listener(info, w.name, 40000, lambda: _assert(tcp_ok(info, m.name, w.address, 40000), "worker blocked too"))


def _assert(cond: bool, msg: str) -> None:
    assert cond, msg


def _check_iptables(info, victim) -> None:
    other = next(n for n in info.nodes if n is not victim)
    saved = sh(info, victim.name, "iptables-save").stdout
    assert "-A INPUT -p tcp -m tcp --dport 32768:60999 -j REJECT --reject-with tcp-reset" in saved
    assert "--dport 32768:60999 -j REJECT" in sh(info, victim.name, "cat /etc/iptables/rules.v4").stdout
    assert sh(info, other.name, "iptables-save").stdout.strip() == ""
    with_listener(info, victim.name, 40000, lambda: (
        _assert(not tcp_ok(info, other.name, victim.address, 40000), "ephemeral port open"),
        _assert(tcp_ok(info, victim.name, "127.0.0.1", 40000), "lo blocked"),
    ))
    assert tcp_ok(info, other.name, victim.address, 22)


def check_iptables_worker(info) -> None:
    _check_iptables(info, info.nodes[-1])


def check_iptables_worker2(info) -> None:
    _check_iptables(info, info.nodes[1])


def check_nftables_worker2(info) -> None:
    w, peer = info.nodes[1], info.nodes[2]
    ruleset = sh(info, w.name, "nft list ruleset").stdout
    assert "policy drop" in ruleset and "tcp dport 22 accept" in ruleset
    assert "policy drop" in sh(info, w.name, "cat /etc/nftables.conf").stdout
    assert sh(info, w.name, "iptables-save").stdout.strip() == ""
    with_listener(info, w.name, 40000, lambda: _assert(not tcp_ok(info, peer.name, w.address, 40000), "not dropped"))
    assert "policy drop" not in sh(info, peer.name, "nft list ruleset").stdout


def check_clock_skew(info) -> None:
    import time as _time

    skewed = float(sh(info, info.nodes[-1].name, "/etc/ddpfix-lab/python3-skewed -c 'import time; print(time.time())'").stdout)
    assert 4.0 < skewed - _time.time() < 6.0
    plain = float(sh(info, info.nodes[-1].name, "python3 -c 'import time; print(time.time())'").stdout)
    assert abs(plain - _time.time()) < 1.0  # the kernel clock itself is untouched
    inv = info.inventory.read_text()
    assert "ansible_python_interpreter: /etc/ddpfix-lab/python3-skewed" in inv


def check_hostname_loopback(info) -> None:
    for n in info.nodes[-2:]:
        assert resolve(info, n.name, n.hostname) == ["127.0.1.1"]
        assert f"127.0.1.1\t{n.hostname}" in sh(info, n.name, "cat /etc/hosts").stdout
    assert resolve(info, "node1", "node1") == [info.nodes[0].address]
    assert resolve(info, "node1", info.nodes[-1].hostname) == [info.nodes[-1].address]


def check_hostname_claim(info) -> None:
    assert sh(info, "node3", "hostname; cat /etc/hostname").stdout.split() == [CLAIMED_NAME, CLAIMED_NAME]
    assert resolve(info, "node3", CLAIMED_NAME) == ["127.0.1.1"]
    assert resolve(info, "node1", CLAIMED_NAME) == ["203.0.113.80"] and resolve(info, "node1", "nfs01") == ["10.0.0.5"]
    assert resolve(info, "node1", "node3") == [info.nodes[2].address]


def check_peer_unresolvable(info) -> None:
    assert resolve(info, "node2", "node1") == [] and resolve(info, "node2", "node3") == []
    assert resolve(info, "node2", "node2") == [info.nodes[1].address]
    assert resolve(info, "node1", "node3") == [info.nodes[2].address]


def check_peer_mismatch(info) -> None:
    assert resolve(info, "node1", "node2") == [WRONG_PEER_ADDR]
    assert resolve(info, "node3", "node2") == [info.nodes[1].address]
    assert ipaddress.ip_address(WRONG_PEER_ADDR) not in ipaddress.ip_network(info.subnet)


def check_duplicate_hostname(info) -> None:
    assert sh(info, "node3", "hostname; cat /etc/hostname").stdout.split() == ["node2", "node2"]
    assert sh(info, "node2", "hostname").stdout.strip() == "node2"
    assert list(inventory(info)["hosts"]) == ["node1", "node2", "node3"]


def check_hosts_bindmount(info) -> None:
    mounts = [ln.split()[4] for ln in sh(info, "node2", "cat /proc/self/mountinfo").stdout.splitlines()]
    assert "/etc/hosts" in mounts and "/etc" in mounts
    res = sh(info, "node2", "cp /etc/hosts /etc/hosts.new && mv /etc/hosts.new /etc/hosts", check=False)
    assert res.returncode != 0 and "busy" in res.stderr
    assert resolve(info, "node2", "node1") == [info.nodes[0].address]
    assert "/etc/hosts" not in [ln.split()[4] for ln in sh(info, "node1", "cat /proc/self/mountinfo").stdout.splitlines()]


def check_ifname_mismatch(info) -> None:
    assert [n.ifname for n in info.nodes] == ["eth0", "ens5", "eth0"]
    assert "eth0" not in [x["ifname"] for x in links(info, "node2")]
    for i, n in enumerate(info.nodes):
        env = env_file(info, n.name)
        assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["MASTER_ADDR"] == info.nodes[0].address and env["MASTER_PORT"] == "29500"
        assert env["NODE_RANK"] == str(i) and env["NNODES"] == env["PET_NNODES"] == "3"


def check_multi_homed(info) -> None:
    net = data_network(info.subnet)
    assert inventory(info)["vars"]["ddp_cluster_cidr"] == str(net)
    for i, n in enumerate(info.nodes, 1):
        addrs = {x["ifname"]: [a["local"] for a in x["addr_info"] if a["family"] == "inet"] for x in links(info, n.name)}
        want = [str(data_address(info.subnet, i))] + ([str(net.network_address + 103)] if i == 3 else [])
        assert addrs[DATA_IFNAMES[i - 1]] == want, addrs
        assert addrs[n.ifname] == [n.address]  # SSH and the default route stay on the management NIC
        assert resolve(info, n.name, "node1") == [info.nodes[0].address]  # names on management addresses
    with_listener(info, "node1", 29500, lambda: (
        assert_tcp(info, "node3", str(data_address(info.subnet, 1)), 29500)))


#: one TCP connect from a source address (argv 1), optionally bound to a device (argv 4): exit 0 when it connected
CONNECT_FROM = ("import socket,sys; s=socket.socket(); s.settimeout(3); "
                "len(sys.argv) > 4 and s.setsockopt(socket.SOL_SOCKET, 25, sys.argv[4].encode()); "
                "s.bind((sys.argv[1], 0)); s.connect((sys.argv[2], int(sys.argv[3])))")


def connects_from(info, node: str, src: str, addr: str, port: int, device: str = "") -> bool:
    return sh(info, node, f"python3 -c '{CONNECT_FROM}' {src} {addr} {port} {device}", check=False).returncode == 0


def check_isolated_nic(info) -> None:
    """iso0 holds a cluster-network /32 on a link to nowhere; the env file names it. Not an ARP quirk: a connect
    bound to iso0's address (as Gloo and NCCL bind) does not reach node1, nor one bound to the device, while one
    from the node's cluster address does."""
    victim = info.nodes[2].name if len(info.nodes) > 2 else info.nodes[-1].name
    ifs = {x["ifname"]: x for x in links(info, victim)}
    (iso,) = [a["local"] for a in ifs[ISO_IFNAME]["addr_info"] if a["family"] == "inet"]
    multi = "multi-homed" in info.scenarios
    net = data_network(info.subnet) if multi else ipaddress.ip_network(info.subnet)
    assert ipaddress.ip_address(iso) in net and ifs[ISO_IFNAME]["operstate"] != "DOWN", ifs[ISO_IFNAME]
    assert (env_file(info, victim) or {}).get("GLOO_SOCKET_IFNAME") == ISO_IFNAME
    assert sh(info, victim, "sysctl -n net.ipv4.conf.all.arp_ignore net.ipv4.conf.all.arp_announce").stdout.split() \
        == ["1", "2"]
    target = str(data_address(info.subnet, 1)) if multi else info.nodes[0].address
    mine = str(data_address(info.subnet, int(victim[4:]))) if multi else info.node(victim).address

    def probe() -> None:
        assert connects_from(info, victim, mine, target, 29500), f"{victim} cannot reach {target} from {mine}"
        assert not connects_from(info, victim, iso, target, 29500), f"{iso} reached {target}: an ARP quirk?"
        assert not connects_from(info, victim, iso, target, 29500, ISO_IFNAME)

    with_listener(info, "node1", 29500, probe)


def assert_tcp(info, src: str, addr: str, port: int) -> None:
    assert tcp_ok(info, src, addr, port), f"{src} cannot reach {addr}:{port}"


def check_autoselect_wrong(info) -> None:
    ls = links(info, "node2")
    index = {x["ifname"]: x["ifindex"] for x in ls}
    addrs = {x["ifname"]: [a["local"] for a in x["addr_info"] if a["family"] == "inet"] for x in ls}
    bridge = next(i for i in index if i.startswith("br-"))
    assert index[bridge] < index["eth0"] and index["docker0"] < index["eth0"]
    assert addrs[bridge] == ["172.18.0.1"] and addrs["docker0"] == ["172.17.0.1"]
    first_v4 = next(x["ifname"] for x in sorted(ls, key=lambda x: x["ifindex"])
                if addrs[x["ifname"]] and x["ifname"] != "lo" and not x["ifname"].startswith(("docker", "virbr")))
    assert first_v4 == bridge  # NCCL's default choice is not the cluster NIC
    assert env_file(info, "node2") is None
    assert "docker0" not in [x["ifname"] for x in links(info, "node1")]


def check_mtu_mismatch(info) -> None:
    mtu = {n.name: next(x["mtu"] for x in links(info, n.name) if x["ifname"] == n.ifname) for n in info.nodes}
    assert mtu == {"node1": 1500, "node2": 1500, "node3": 1400}


def check_netif_down(info) -> None:
    ens6 = next(x for x in links(info, "node3") if x["ifname"] == "ens6")
    assert "UP" not in ens6["flags"] and ens6["operstate"] == "DOWN"
    addr = ens6["addr_info"][0]["local"]
    assert ipaddress.ip_address(addr) in ipaddress.ip_network(info.subnet)
    assert inventory(info)["hosts"]["node3"]["ddp_socket_ifname"] == "ens6"
    out = subprocess.run(info.ssh_argv("node3", "hostname"), capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "node3"  # still managed over SSH


def check_master_addr_public(info) -> None:
    for i, n in enumerate(info.nodes):
        env = env_file(info, n.name)
        assert env["MASTER_ADDR"] == PUBLIC_MASTER_ADDR
        assert env["NODE_RANK"] == str(i) and env["GLOO_SOCKET_IFNAME"] == n.ifname


def check_env_wrong(info) -> None:
    good, bad = env_file(info, "node1"), env_file(info, "node3")
    assert good["MASTER_ADDR"] == info.nodes[0].address
    assert bad["MASTER_ADDR"] == info.nodes[1].address != info.nodes[0].address
    assert bad["GLOO_SOCKET_IFNAME"] not in [x["ifname"] for x in links(info, "node3")]
    assert env_file(info, "node2")["MASTER_ADDR"] == info.nodes[0].address


def check_route_via_gateway(info) -> None:
    route = json.loads(sh(info, "node3", f"ip -j route get {info.nodes[0].address}").stdout)[0]
    assert route["gateway"] == info.nodes[1].address and route["dev"] == "eth0"
    assert "gateway" not in json.loads(sh(info, "node2", f"ip -j route get {info.nodes[0].address}").stdout)[0]
    assert tcp_ok(info, "node3", info.nodes[0].address, 22)  # goes around through node2, but arrives


def check_chrony_absent(info) -> None:
    for n in info.nodes:
        assert not chronyd_running(info, n.name)
        assert sh(info, n.name, "pgrep -x chronyd", check=False).returncode == 1
        assert 'DAEMON_OPTS="-F 1 -x"' in sh(info, n.name, "cat /etc/default/chrony").stdout
        assert sh(info, n.name, "test -x /usr/sbin/chronyd", check=False).returncode == 0


def check_port_in_use(info) -> None:
    assert ":29500" in sh(info, "node1", "ss -Hltn 'sport = :29500'").stdout
    assert tcp_ok(info, "node2", info.nodes[0].address, 29500)
    rec = json.loads((info.state_dir / "lab.json").read_text())["nodes"]["node1"]["pids"]["port-in-use"]
    assert lab.pid_alive(rec)


def check_world_open(info) -> None:
    m, w = info.nodes[0], info.nodes[1]
    saved = sh(info, m.name, "iptables-save").stdout
    assert "-A INPUT -p tcp -m tcp --dport 29500 -j ACCEPT" in saved  # no -s: any source
    assert f"-A INPUT -s {info.subnet} -j ACCEPT" in saved and "-A INPUT -j REJECT" in saved
    assert "--dport 29500 -j ACCEPT" in sh(info, m.name, "cat /etc/iptables/rules.v4").stdout
    assert sh(info, w.name, "iptables-save").stdout.strip() == ""
    with_listener(info, m.name, 40000, lambda: _assert(tcp_ok(info, w.name, m.address, 40000), "subnet not trusted"))
    assert lab.chrony_tracking(info.name, w.name)["leap_status"] == "Normal"  # NTP from the subnet still works


def check_chrony_unsynced(info) -> None:
    victim = info.nodes[-1]
    assert lab.chrony_tracking(info.name, victim.name)["leap_status"] == "Not synchronised"
    assert lab.chrony_tracking(info.name, "node2")["leap_status"] == "Normal"
    conf = sh(info, victim.name, "cat /etc/chrony/conf.d/lab.conf").stdout
    source = conf.split("server ", 1)[1].split()[0]
    for n in info.nodes:  # nobody holds the source address
        assert source not in sh(info, n.name, "ip -4 addr").stdout
    assert ipaddress.ip_address(source) in ipaddress.ip_network(info.subnet)
    rec = json.loads((info.state_dir / "lab.json").read_text())["nodes"][victim.name]["pids"]
    assert lab.pid_alive(rec["chronyd-unsynced"]) and "chronyd" not in rec
    assert 'DAEMON_OPTS="-F 1 -x"' in sh(info, victim.name, "cat /etc/default/chrony").stdout


def _check_handwritten_chrony(info, conf_path: str) -> str:
    victim = info.nodes[-1]
    assert lab.chrony_tracking(info.name, victim.name)["leap_status"] == "Not synchronised"
    assert lab.chrony_tracking(info.name, "node2")["leap_status"] == "Normal"
    conf = sh(info, victim.name, f"cat {conf_path}").stdout
    keys = [ln.split()[0] for ln in conf.splitlines() if ln.strip() and not ln.startswith("#")]
    assert keys == ["server", "driftfile", "makestep"], conf  # no confdir, no include
    source = conf.split("\nserver ", 1)[1].split()[0]
    for n in info.nodes:  # nobody holds the source address
        assert source not in sh(info, n.name, "ip -4 addr").stdout
    rec = json.loads((info.state_dir / "lab.json").read_text())["nodes"][victim.name]["pids"]
    assert lab.pid_alive(rec["chronyd-unsynced"]) and "chronyd" not in rec
    return sh(info, victim.name, "cat /etc/default/chrony").stdout


def check_chrony_no_confdir(info) -> None:
    opts = _check_handwritten_chrony(info, "/etc/chrony/chrony.conf")
    assert 'DAEMON_OPTS="-F 1 -x"' in opts


def check_chrony_rhel_layout(info) -> None:
    opts = _check_handwritten_chrony(info, "/etc/chrony.conf")
    assert 'DAEMON_OPTS="-F 1 -x -f /etc/chrony.conf"' in opts
    victim = info.nodes[-1].name
    assert sh(info, victim, "test -e /etc/chrony", check=False).returncode == 1
    assert "-f\0/etc/chrony.conf" in sh(info, victim, "cat /proc/$(pgrep -o -x chronyd)/cmdline").stdout
    assert sh(info, "node2", "test -f /etc/chrony/chrony.conf", check=False).returncode == 0  # only the victim


def check_machine_id_clone(info) -> None:
    mid = {n.name: sh(info, n.name, "cat /etc/machine-id").stdout.strip() for n in info.nodes}
    assert mid["node2"] == mid["node3"] != mid["node1"] and len(mid["node2"]) == 32
    assert sh(info, "node3", "hostname").stdout.strip() == "node3"


def check_somaxconn_low(info) -> None:
    val = {n.name: int(sh(info, n.name, "cat /proc/sys/net/core/somaxconn").stdout) for n in info.nodes}
    assert val["node1"] == 2 < len(info.nodes) and val["node2"] >= 128
    assert int(Path("/proc/sys/net/core/somaxconn").read_text()) >= 128  # the host's namespace is untouched


def check_family_mismatch(info) -> None:
    ula = {n.name: next(a["local"] for x in links(info, n.name) for a in x["addr_info"]
                        if a["family"] == "inet6" and a["local"].startswith("fd00:dd:")) for n in info.nodes}
    out = sh(info, "node3", "getent ahosts node1").stdout.split()
    assert out[0] == ula["node1"] and info.nodes[0].address not in out
    assert sh(info, "node3", "getent ahosts node2").stdout.split()[0] == ula["node2"]
    assert resolve(info, "node1", "node2") == [info.nodes[1].address]
    assert resolve(info, "node3", "node3") == [info.nodes[2].address]
    assert len(set(ula.values())) == 3


def check_docker_tables(info) -> None:
    for node in ("node2", "node3"):
        ruleset = sh(info, node, "nft list ruleset").stdout
        assert "xt match physdev" in ruleset and "xt match recent" in ruleset
        assert "table inet ddpfix-lab-docker" in ruleset
        saved = sh(info, node, "iptables-save").stdout
        assert ":DOCKER-USER" in saved and "-j DOCKER-USER" in saved
        # never in a config file, and the node still answers on SSH and from peers
        assert "DOCKER" not in sh(info, node, "cat /etc/nftables.conf /etc/iptables/rules.v4 2>/dev/null || true").stdout
    assert "DOCKER" not in sh(info, "node1", "iptables-save 2>/dev/null || true").stdout


FABRIC = "/run/ddpfix-lab-fabric/sys/class/infiniband"


def _fabric_attr(info, node: str, rel: str) -> str:
    return sh(info, node, f"cat {FABRIC}/{rel}").stdout.strip()


def check_fabric_port_down(info) -> None:
    assert _fabric_attr(info, "node2", "mlx5_1/ports/1/state") == "1: DOWN"
    assert _fabric_attr(info, "node1", "mlx5_1/ports/1/state") == "4: ACTIVE"
    assert sh(info, "node2", "ls /run/ddpfix-lab-fabric/dev/infiniband").stdout.split()[:2] == ["rdma_cm", "umad0"]


def check_fabric_gid_differs(info) -> None:
    last = info.nodes[-1].name
    assert _fabric_attr(info, last, "mlx5_0/ports/1/gid_attrs/types/5") == "RoCE v2"
    assert _fabric_attr(info, "node1", "mlx5_0/ports/1/gid_attrs/types/3") == "RoCE v2"
    assert _fabric_attr(info, "node1", "mlx5_0/ports/1/link_layer") == "Ethernet"


def check_fabric_pkey_mismatch(info) -> None:
    assert _fabric_attr(info, "node2", "mlx5_0/ports/1/pkeys/0") == "0x8001"
    assert _fabric_attr(info, "node1", "mlx5_0/ports/1/pkeys/0") == "0xffff"


def check_fabric_link_layer_mixed(info) -> None:
    assert _fabric_attr(info, info.nodes[-1].name, "mlx5_0/ports/1/link_layer") == "Ethernet"
    assert _fabric_attr(info, "node1", "mlx5_0/ports/1/link_layer") == "InfiniBand"


def check_fabric_rate_mismatch(info) -> None:
    assert _fabric_attr(info, "node2", "mlx5_0/ports/1/rate") == "100 Gb/sec (4X EDR)"
    assert _fabric_attr(info, "node1", "mlx5_0/ports/1/rate") == "200 Gb/sec (4X HDR)"


def check_fabric_roce_no_v2_gid(info) -> None:
    types = sh(info, "node2", f"cat {FABRIC}/mlx5_0/ports/1/gid_attrs/types/*").stdout
    assert "RoCE v2" not in types and "RoCE v1" in types
    assert "RoCE v2" in sh(info, "node1", f"cat {FABRIC}/mlx5_0/ports/1/gid_attrs/types/*").stdout


def check_fabric_hca_includes_mgmt(info) -> None:
    assert sh(info, "node2", f"ls {FABRIC}/mlx5_2/device/net").stdout.split() == [info.nodes[1].ifname]
    assert env_file(info, "node2")["NCCL_IB_HCA"] == "mlx5"


def check_fabric_no_uverbs(info) -> None:
    assert sh(info, "node2", "ls /run/ddpfix-lab-fabric/dev/infiniband").stdout.split() == ["rdma_cm"]
    assert "uverbs0" in sh(info, "node1", "ls /run/ddpfix-lab-fabric/dev/infiniband").stdout


def check_fabric_peermem_missing(info) -> None:
    assert sh(info, "node2", "ls /run/ddpfix-lab-fabric/sys/module").stdout.split() == ["nvidia"]
    assert "nvidia_peermem" in sh(info, "node1", "ls /run/ddpfix-lab-fabric/sys/module").stdout


def check_fabric_efa_provider_missing(info) -> None:
    assert sh(info, "node2", "/run/ddpfix-lab-fabric/bin/fi_info -p efa", check=False).returncode == 1
    assert "provider: efa" in sh(info, "node1", "/run/ddpfix-lab-fabric/bin/fi_info -p efa").stdout
    assert sh(info, "node1", f"readlink {FABRIC}/rdmap16s27/device/driver").stdout.strip().endswith("/efa")


def check_fabric_nccl_version_mismatch(info) -> None:
    assert sh(info, "node2", "/run/ddpfix-lab-fabric/bin/python-nccl").stdout.strip() == "2.18.1"
    assert sh(info, "node1", "/run/ddpfix-lab-fabric/bin/python-nccl").stdout.strip() == "2.21.5"


def check_fabric_memlock_low(info) -> None:
    ml = {n.name: lab.node_exec(info.name, n.name, ["sh", "-c", "ulimit -l"]).stdout.strip() for n in info.nodes}
    assert "root  soft  memlock  64" in sh(info, "node2", "cat /etc/security/limits.d/10-site-memlock.conf").stdout
    assert "UsePAM yes" in sh(info, "node2", "sshd -T 2>/dev/null | grep -i usepam || cat /etc/ssh/sshd_config.d/00-ddpfix-lab-0pam.conf").stdout.replace("usepam", "UsePAM")
    assert ml["node1"] != "64", ml


CHECKS: dict[str, Callable] = {
    "clean": check_clean,
    "firewalld-master": check_firewalld_master,
    "iptables-worker": check_iptables_worker,
    "iptables-worker2": check_iptables_worker2,
    "nftables-worker2": check_nftables_worker2,
    "clock-skew": check_clock_skew,
    "hostname-loopback": check_hostname_loopback,
    "hostname-claim": check_hostname_claim,
    "peer-unresolvable": check_peer_unresolvable,
    "peer-mismatch": check_peer_mismatch,
    "duplicate-hostname": check_duplicate_hostname,
    "hosts-bindmount": check_hosts_bindmount,
    "ifname-mismatch": check_ifname_mismatch,
    "autoselect-wrong": check_autoselect_wrong,
    "mtu-mismatch": check_mtu_mismatch,
    "netif-down": check_netif_down,
    "master-addr-public": check_master_addr_public,
    "env-wrong": check_env_wrong,
    "route-via-gateway": check_route_via_gateway,
    "chrony-absent": check_chrony_absent,
    "port-in-use": check_port_in_use,
    "world-open": check_world_open,
    "chrony-unsynced": check_chrony_unsynced,
    "chrony-no-confdir": check_chrony_no_confdir,
    "chrony-rhel-layout": check_chrony_rhel_layout,
    "machine-id-clone": check_machine_id_clone,
    "somaxconn-low": check_somaxconn_low,
    "family-mismatch": check_family_mismatch,
    "multi-homed": check_multi_homed,
    "isolated-nic": check_isolated_nic,
    "docker-tables": check_docker_tables,
    "fabric-port-down": check_fabric_port_down,
    "fabric-gid-differs": check_fabric_gid_differs,
    "fabric-pkey-mismatch": check_fabric_pkey_mismatch,
    "fabric-link-layer-mixed": check_fabric_link_layer_mixed,
    "fabric-memlock-low": check_fabric_memlock_low,
    "fabric-rate-mismatch": check_fabric_rate_mismatch,
    "fabric-roce-no-v2-gid": check_fabric_roce_no_v2_gid,
    "fabric-hca-includes-mgmt": check_fabric_hca_includes_mgmt,
    "fabric-no-uverbs": check_fabric_no_uverbs,
    "fabric-peermem-missing": check_fabric_peermem_missing,
    "fabric-efa-provider-missing": check_fabric_efa_provider_missing,
    "fabric-nccl-version-mismatch": check_fabric_nccl_version_mismatch,
}


def test_every_scenario_is_checked_and_documented() -> None:
    # SSH setups: tests/lab/test_ssh_setups_lab.py; scenarios that declare their audit expectations
    # (Scenario.expect): tests/lab/test_audit_lab.py (lab B)
    declared = {s.name for s in SCENARIOS.values() if s.expect}
    assert set(CHECKS) == set(SCENARIOS) - set(SSH_SETUPS) - declared
    for s in SCENARIOS.values():
        assert s.summary and "\n" not in s.summary and s.doc
        assert s.name in ("clean", "hosts-bindmount", "docker-tables", *SSH_SETUPS) or s.findings, s.name


#: Fabric scenarios differ from `clean` only in node files and inventory variables: one lab, switched in place.
FABRIC_SCENARIOS = [s for s in CHECKS if s.startswith("fabric-")]


#: Scenarios whose check runs inside another lab test's lab (no bring-up of their own): isolated-nic in
#: tests/lab/test_fleet_shape_lab.py, on the data network; hostname-claim in tests/lab/test_validate_lab.py.
CHECKED_ELSEWHERE = frozenset({"isolated-nic", "hostname-claim"})


@pytest.mark.lab
@pytest.mark.parametrize("scenario", [s for s in CHECKS if s not in FABRIC_SCENARIOS and s not in CHECKED_ELSEWHERE])
def test_scenario_builds_its_fault(scenario: str, temp_lab) -> None:
    info = temp_lab(nodes=3, scenario=scenario)
    CHECKS[scenario](info)
    # every node stays reachable over SSH with strict host key checking
    for n in info.nodes:
        assert lab.ssh_banner(n.address)


@pytest.fixture(scope="module")
def fabric_lab(lab_factory):
    """Built by `lab up` with the first fabric scenario; apply_fabric gives it each other one as `up` would."""
    return lab_factory(nodes=3, scenario=FABRIC_SCENARIOS[0], wait_sync=False)


@pytest.mark.lab
@pytest.mark.parametrize("scenario", FABRIC_SCENARIOS)
def test_fabric_scenario_builds_its_fault(scenario: str, fabric_lab) -> None:
    apply_fabric(fabric_lab, scenario)
    CHECKS[scenario](fabric_lab)
    for n in fabric_lab.nodes:
        assert lab.ssh_banner(n.address)


@pytest.mark.lab
def test_port_in_use_listener_is_killed_on_down(temp_lab) -> None:
    info = temp_lab(nodes=1, scenario="port-in-use,chrony-absent")
    rec = json.loads((info.state_dir / "lab.json").read_text())["nodes"]["node1"]["pids"]["port-in-use"]
    assert lab.pid_alive(rec)
    lab.down(info.name)
    assert not lab.pid_alive(rec)
