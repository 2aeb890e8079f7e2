"""firewalld shapes on a real lab (issue 34: bound zone, egress policy, direct rules; issue 36 item 5: a hostile zone
name), one 3-node lab for all of them.

node1 (scenario firewalld-master) runs its own dbus-daemon and firewalld 1.3 (nftables backend). The shapes are
loaded from tests/fixtures/rulesets/firewalld/ (each citing its public source) into its permanent configuration and
applied by a reload: the cluster network is a source of firewalld's stock zone `internal`, and a policy from HOST to
ANY with target REJECT lets node1 send only dns, ssh and ntp. The kernel judges: a listener on node1 (master port,
an ephemeral port) and connects from the peers and from an address outside the cluster network on node2, and a
listener on node2 that node1 connects to; before and after `remediate --apply`, and after firewalld is restarted
from its permanent configuration (the simulated reboot).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ddpfix, ddpfix_json, inventory_vars, sh, sh_out

from ddpfix import lab
from ddpfix.rules import firewall as firewall_rules

pytestmark = pytest.mark.lab

SHAPES = Path(__file__).resolve().parents[1] / "fixtures" / "rulesets" / "firewalld"
#: An address outside the cluster network, on node2's cluster NIC (node1 routes it back over the same link).
OUTSIDE = "10.250.77.2"
#: A listener that records its PID inside the node (the Popen on the host is only the namespace entry's), so that
#: the test ends exactly it.
LISTEN = ("import os,socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(64); "
          "open('/run/fwfwd-listen-' + sys.argv[1] + '.pid', 'w').write(str(os.getpid())); time.sleep(60)")
CONNECT = ("import socket,sys; s=socket.socket(); s.settimeout(3); "
           "sys.argv[3] and s.bind((sys.argv[3], 0)); s.connect((sys.argv[1], int(sys.argv[2]))); print('ok')")


def shape(name: str, cidr: str) -> str:
    """A fixture's firewall-cmd lines (comments dropped), for the lab's cluster network."""
    lines = [ln for ln in (SHAPES / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return " && ".join(ln.replace("{cidr}", cidr) for ln in lines)


@contextlib.contextmanager
def listening(info: Any, node: str, ports: list[int]) -> Iterator[None]:
    procs = [lab.node_popen(info.name, node, ["python3", "-c", LISTEN, str(p)]) for p in ports]
    try:
        for p in ports:
            deadline = time.monotonic() + 5
            while f":{p} " not in sh_out(info, node, f"ss -Hltn 'sport = :{p}'") + " ":
                assert time.monotonic() < deadline, f"listener {node}:{p} did not start"
                time.sleep(0.05)
        yield
    finally:
        for p in ports:
            sh(info, node, f"f=/run/fwfwd-listen-{p}.pid; [ -s $f ] && kill $(cat $f); rm -f $f", check=False)
        for pr in procs:
            pr.kill()
            pr.wait()


def reaches(info: Any, src: str, dst: str, port: int, bind: str = "") -> bool:
    r = lab.node_exec(info.name, src, ["python3", "-c", CONNECT, dst, str(port), bind], check=False, timeout=20)
    return r.returncode == 0 and r.stdout.strip() == "ok"


def kernel(info: Any) -> dict[str, bool]:
    """What the kernel lets through: peers (and the outside address) to node1's master and ephemeral port, node1 to
    node2's ephemeral port, SSH."""
    m, (n2, n3) = info.master, [n.name for n in info.nodes[1:]]
    addr = {n.name: n.address for n in info.nodes}
    port, eph = info.master_port, 40123
    with listening(info, m, [port, eph]), listening(info, n2, [eph]):
        return {
            "peers->master": all(reaches(info, n, addr[m], port) for n in (n2, n3)),
            "peers->ephemeral": all(reaches(info, n, addr[m], eph) for n in (n2, n3)),
            "master->peer": reaches(info, m, addr[n2], eph),
            "outside->master": reaches(info, n2, addr[m], port, OUTSIDE),
            "outside->ephemeral": reaches(info, n2, addr[m], eph, OUTSIDE),
            "ssh": reaches(info, n2, addr[m], 22),
        }


@pytest.fixture(scope="module")
def fwd_lab(lab_factory: Any) -> Any:
    info = lab_factory(nodes=3, scenario="firewalld-master", wait_sync=False)
    m, n2 = info.nodes[0], info.nodes[1]
    sh(info, n2.name, f"ip addr add {OUTSIDE}/32 dev {n2.ifname}")
    sh(info, m.name, f"ip route add {OUTSIDE}/32 dev {m.ifname}")
    cidr = info.subnet
    sh(info, m.name, shape("internal-bound.sh", cidr) + " && " + shape("egress-host-any.sh", cidr)
       + " && firewall-cmd -q --reload")
    return info


def test_hostile_zone_name_refused_before_any_contact(fwd_lab: Any) -> None:
    """Issue 36 item 5: the dry run with a hostile ddpfix_firewall_zone exits 2 with one line naming it, and no node
    was contacted (every run takes the node lock, /run/ddpfix.lock: none is created)."""
    info, inv = fwd_lab, str(fwd_lab.inventory)
    for node in (n.name for n in info.nodes):
        sh(info, node, "rm -f /run/ddpfix.lock")
    for value in ("trusted --add-source=0.0.0.0/0", "../../../etc/shadow", "a;b $(id)"):
        with inventory_vars(info, host_vars={"ddpfix_firewall_zone": value}):
            code, out, err = ddpfix(inv, "remediate")
        assert code == 2, (out, err)
        line = [ln for ln in err.splitlines() if "ddpfix_firewall_zone" in ln]
        assert line and repr(value) in line[0] and "firewalld zone name" in line[0], err
    for node in (n.name for n in info.nodes):
        assert sh(info, node, "test -e /run/ddpfix.lock", check=False).returncode == 1, node
    assert "0.0.0.0/0" not in sh_out(info, info.master, "firewall-cmd --zone=trusted --list-sources")


def test_bound_zone_and_egress_policy_fixed_where_they_live(fwd_lab: Any) -> None:
    info, inv, cidr, m = fwd_lab, str(fwd_lab.inventory), fwd_lab.subnet, fwd_lab.master
    before = kernel(info)
    assert before == {"peers->master": False, "peers->ephemeral": False, "master->peer": False,
                      "outside->master": False, "outside->ephemeral": False, "ssh": True}, before

    code, doc = ddpfix_json(inv, "audit")
    found = {(f["id"], f["host"]) for f in doc["findings"]}
    assert code == 1 and (firewall_rules.MASTER_PORT_BLOCKED.id, m) in found, doc["findings"]
    egress = [f for f in doc["findings"] if f["id"] == firewall_rules.EGRESS_BLOCKED.id]
    assert [f["host"] for f in egress] == [m] and "policy 'egress-lockdown'" in egress[0]["evidence"], egress

    zone_before = sh_out(info, m, "firewall-cmd --permanent --zone=internal --list-all")
    code, dry = ddpfix_json(inv, "remediate")
    assert code == 1 and not dry["refused"], dry["refused"]
    assert sh_out(info, m, "firewall-cmd --permanent --zone=internal --list-all") == zone_before  # dry: unchanged

    code, applied = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (applied["failed_hosts"], applied["remaining_fixable"], applied["refused"])
    rule_from = f'rule family="ipv4" source address="{cidr}" accept'
    rule_to = f'rule family="ipv4" destination address="{cidr}" accept'
    for perm in ("", "--permanent "):
        zone = sh_out(info, m, f"firewall-cmd {perm}--zone=internal --list-all")
        for kept in (cidr, "ssh", "mdns", "samba-client", "dhcpv6-client", rule_from):  # the user's zone, and ours
            assert kept in zone, zone
        policy = sh_out(info, m, f"firewall-cmd {perm}--policy=egress-lockdown --list-all")
        for kept in ("target: REJECT", "dns", "ssh", "ntp", rule_to):
            assert kept in policy, policy
        assert cidr not in sh_out(info, m, f"firewall-cmd {perm}--zone=trusted --list-sources")  # no ZONE_CONFLICT
    after = kernel(info)
    assert after == {**before, "peers->master": True, "peers->ephemeral": True, "master->peer": True}, after

    code, again = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and sum(again["changed"].values()) == 0, again["changes"]

    # the simulated reboot: firewalld restarted, from its permanent configuration only
    sh(info, m, "kill $(cat /run/firewalld.pid); for i in $(seq 50); do [ -e /run/firewalld.pid ] || break; "
                "sleep 0.1; done; firewalld; for i in $(seq 100); do firewall-cmd --state >/dev/null 2>&1 && break; "
                "sleep 0.2; done; firewall-cmd --state")
    assert kernel(info) == after
    code, rebooted = ddpfix_json(inv, "audit")
    assert code == 0, rebooted["findings"]


def test_direct_output_rules_refused_by_name_before_any_change(fwd_lab: Any) -> None:
    """Direct rules closing egress (the fixture's DROP at priority 99): found on node1, and the dry run refuses,
    naming the rule, its file and the operator's command; nothing on any node changes."""
    info, inv, m = fwd_lab, str(fwd_lab.inventory), fwd_lab.master
    sh(info, m, shape("direct-output-drop.sh", info.subnet) + " && firewall-cmd -q --reload")
    try:
        code, doc = ddpfix_json(inv, "audit")
        egress = [f for f in doc["findings"] if f["id"] == firewall_rules.EGRESS_BLOCKED.id]
        assert code == 1 and [f["host"] for f in egress] == [m], doc["findings"]
        assert "direct rule: ipv4 filter OUTPUT 99 -j DROP" in egress[0]["evidence"], egress
        state = sh_out(info, m, "firewall-cmd --permanent --direct --get-all-rules; firewall-cmd --list-all-policies")
        code, dry = ddpfix_json(inv, "remediate", "--apply")
        refused = " ".join(dry["refused"])
        assert "ipv4 filter OUTPUT 99 -j DROP" in refused and "/etc/firewalld/direct.xml" in refused, dry
        assert "firewall-cmd --permanent --direct --add-rule" in refused, refused
        assert sh_out(info, m, "firewall-cmd --permanent --direct --get-all-rules; "
                               "firewall-cmd --list-all-policies") == state
    finally:
        sh(info, m, "firewall-cmd -q --permanent --direct --remove-rules ipv4 filter OUTPUT && firewall-cmd -q --reload")
