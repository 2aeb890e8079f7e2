"""The lab's network: a switch namespace with a bridge, one veth per node NIC, the uplink in the root namespace, and
the subnet checks before anything is created."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ddpfix.errors import ExitCode
from ddpfix.lab.model import LabError, LabPlan, host_link, switch_netns
from ddpfix.lab.system import _ip_batch, _run


def _check_subnet_free(plan: LabPlan) -> None:
    res = _run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False)
    try:
        routes = json.loads(res.stdout or "[]")
    except json.JSONDecodeError:
        routes = []
    for r in routes:
        dst = r.get("dst", "")
        if dst in ("", "default") or r.get("type") in ("local", "broadcast"):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.overlaps(plan.subnet):
            raise LabError(
                f"subnet {plan.subnet} overlaps {dst} (dev {r.get('dev', '?')}) on this machine: pass another --subnet",
                ExitCode.INVALID_INPUT,
            )


def free_subnet() -> str:
    """A /24 in 192.168.100-249 that no route on this machine overlaps (for parallel labs: tests, benchmarks)."""

    out = _run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False).stdout
    used = []
    for r in json.loads(out or "[]"):
        dst = r.get("dst")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, strict=False))
    for o in random.sample(range(100, 250), 150):
        net = ipaddress.ip_network(f"192.168.{o}.0/24")
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise LabError("no free /24 in 192.168.100-249", ExitCode.RUN_FAILED)


def _create_network(plan: LabPlan) -> None:
    sw = switch_netns(plan.name)
    _ip_batch([f"netns add {sw}"] + [f"netns add {n.netns}" for n in plan.nodes])
    for n in plan.nodes:  # interfaces that must index before the cluster NIC
        _ip_batch(n.pre_links, n.netns)
    links = [f"link add {host_link(plan.name)} type veth peer name uplink netns {sw}"]
    sw_cmds = [
        "link add br0 type bridge",
        "link set br0 up",
        "link set dev uplink master br0",
        "link set dev uplink up",
    ]
    for n in plan.nodes:
        links.append(f"link add {n.ifname} netns {n.netns} type veth peer name n{n.index} netns {sw}")
        sw_cmds += [f"link set n{n.index} master br0", f"link set n{n.index} up"]
        for j, x in enumerate(n.extra_nics, 1):
            links.append(f"link add {x.ifname} netns {n.netns} type veth peer name n{n.index}x{j} netns {sw}")
            sw_cmds += [f"link set n{n.index}x{j} master br0", f"link set n{n.index}x{j} up"]
    _ip_batch(links)
    hl = host_link(plan.name)
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{hl}/disable_ipv6").write_text("1")
    _ip_batch([f"addr add {plan.controller_address} dev {hl}", f"link set {hl} up"])
    jobs = [(sw_cmds, sw)]
    for n in plan.nodes:
        cmds = ["link set lo up"]
        if n.mtu:
            cmds.append(f"link set {n.ifname} mtu {n.mtu}")
        cmds += [
            f"addr add {n.address}/{plan.subnet.prefixlen} dev {n.ifname}",
            f"link set {n.ifname} up",
            f"route add default via {plan.gateway} dev {n.ifname}",
        ]
        for x in n.extra_nics:
            if x.address:
                cmds.append(f"addr add {x.address} dev {x.ifname}")
            if x.up:
                cmds.append(f"link set {x.ifname} up")
        cmds += n.post_ip
        jobs.append((cmds, n.netns))
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda j: _ip_batch(*j), jobs))
    for n in plan.nodes:
        if n.sysctls:
            _run(["ip", "netns", "exec", n.netns, "sysctl", "-q", "-w", *(f"{k}={v}" for k, v in n.sysctls.items())])


def _block_direct_ssh(plan: LabPlan) -> None:
    """The lab switch drops the controller's SSH to every node but the bastion (a network ACL, outside the nodes:
    their own firewalls stay as the scenarios made them)."""
    jump = plan.node(plan.bastion or "")
    ruleset = "\n".join(
        [
            "table bridge ddpfix_lab_bastion {",
            "  chain forward {",
            "    type filter hook forward priority 0; policy accept;",
            f'    iifname "uplink" ip daddr != {jump.address} tcp dport {plan.ssh_port} drop',
            "  }",
            "}",
            "",
        ]
    )
    _run(["ip", "netns", "exec", switch_netns(plan.name), "nft", "-f", "-"], input=ruleset)
