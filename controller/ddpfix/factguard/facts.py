"""A node's facts as a whole: every value checked against its field's grammar; the problems (the audit's
invalid-fact findings, ``rules.reachability.INVALID``) and the copy without them that the checks and the plan read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from ddpfix.factguard.grammar import (
    PARSED_TEXT,
    SHA256_HEX,
    Checker,
    Problem,
    int_in,
    is_hostname,
    is_reserved_name,
    matches,
    neutral,
    optional,
    printable_json,
    show_value,
)
from ddpfix.factguard.reach import check_reach
from ddpfix.factguard.sections import (
    check_arp,
    check_env_file,
    check_fabric,
    check_interfaces,
    check_limits,
    check_shell_env,
    check_shm,
    check_sysctl_numbers,
    check_torch,
)
from ddpfix.model.facts import NodeFacts
from ddpfix.model.net import is_cidr, is_ip, valid_ifname


def guard_facts(node_facts: Mapping[str, Any]) -> tuple[list[Problem], NodeFacts]:
    """(every value of the node's facts that is not of its field's grammar, the facts without them)."""
    ck = Checker()
    f: dict[str, Any] = dict(node_facts)
    hn = f.get("hostname")
    if hn is not None:
        if not (isinstance(hn, str) and is_hostname(hn)):
            ck.problems.append(("hostname", show_value(hn), "not an RFC 1123 host name"))
            f["hostname"] = None
        elif is_reserved_name(hn):
            ck.problems.append(("hostname", hn, "a reserved loopback name: give the node a unique hostname"))
            f["hostname"] = None
    fq = f.get("fqdn")
    if fq is not None and not (isinstance(fq, str) and is_hostname(fq)):
        ck.problems.append(("fqdn", show_value(fq), "not an RFC 1123 host name"))
        f["fqdn"] = None
    elif isinstance(fq, str) and is_reserved_name(fq):
        f["fqdn"] = None  # a loopback name is no peer's name to write: left out, no finding (Debian's default)
    c = dict(f.get("cluster") or {})
    if not ck.ok("cluster.address", c.get("address"), optional(is_ip), "not an IP address"):
        c["address"] = None
    if not ck.ok("cluster.ifname", c.get("ifname"), optional(valid_ifname), "not an interface name"):
        c["ifname"] = None
    if not ck.ok("cluster.cidr", c.get("cidr"), optional(is_cidr), "not a CIDR"):
        c["cidr"] = None
    if "cluster" in f:
        f["cluster"] = c
    if "master_ip" in f and not ck.ok("master_ip", f["master_ip"], optional(is_ip), "not an IP address"):
        f["master_ip"] = None
    pr = f.get("probe")
    if isinstance(pr, Mapping):
        addr_ok = ck.ok("probe.address", pr.get("address") or None, optional(is_ip), "not an IP address")
        port_ok = ck.ok("probe.port", pr.get("port"), optional(int_in(1, 65535)), "not a TCP port")
        if not (addr_ok and port_ok):
            f["probe"] = {**pr, "address": None, "port": None}
        if "reach" in pr:
            f["probe"] = {**f["probe"], "reach": check_reach(ck, pr["reach"])}
    digest = f.get("hosts_block_sha256")
    if digest is not None and not ck.ok("hosts_block_sha256", digest, matches(SHA256_HEX), "not a SHA-256 digest"):
        f.pop("hosts_block_sha256")  # not compared: as if the node had not said
    if "interfaces" in f:
        f["interfaces"] = check_interfaces(ck, f.get("interfaces"))
    if isinstance(f.get("env_file"), Mapping):
        f["env_file"] = check_env_file(ck, f["env_file"])
    if isinstance(f.get("fabric"), Mapping):
        f["fabric"] = check_fabric(ck, f["fabric"])
    if isinstance(f.get("limits"), Mapping):
        f["limits"] = check_limits(ck, f["limits"])
    if isinstance(f.get("sysctl"), Mapping):
        f["sysctl"] = check_sysctl_numbers(ck, f["sysctl"])
    if isinstance(f.get("sysctl"), Mapping) and "arp" in f["sysctl"]:
        f["sysctl"] = {**f["sysctl"], "arp": check_arp(ck, f["sysctl"]["arp"])}
    if isinstance(f.get("torch"), Mapping):
        f["torch"] = check_torch(ck, f["torch"])
    if isinstance(f.get("shm"), Mapping):
        f["shm"] = check_shm(ck, f["shm"])
    if isinstance(f.get("shell_env"), Mapping):
        f["shell_env"] = check_shell_env(ck, f["shell_env"])
    # the files' text for the dry run's diff, checked above (preview_text_ok): lines, kept as lines
    ef, lim = f.get("env_file"), f.get("limits")
    texts = {k: ef[k] for k in _PREVIEW_KEYS if k in ef} if isinstance(ef, Mapping) else {}
    if texts:
        f["env_file"] = {k: v for k, v in ef.items() if k not in texts}  # type: ignore[union-attr]
    dropins = lim.get("nofile_dropins") if isinstance(lim, Mapping) else None
    if dropins is not None:
        f["limits"] = {k: v for k, v in lim.items() if k != "nofile_dropins"}  # type: ignore[union-attr]
    # what is left is well-formed or free text a node reports about itself: shown only, and then as one line
    shown = {k: v for k, v in f.items() if k not in PARSED_TEXT}
    if not printable_json(shown):
        f = {k: (v if k in PARSED_TEXT else neutral(v)) for k, v in f.items()}
    if texts:
        f["env_file"] = {**f["env_file"], **texts}
    if dropins is not None:
        f["limits"] = {**f["limits"], "nofile_dropins": dropins}
    return ck.problems, cast(NodeFacts, f)  # values as returned: every message shows them with repr()


#: env_file's parts that are a file's text (validated by preview_text_ok in check_env_file)
_PREVIEW_KEYS = ("text", "cluster_file")


def validate_facts(node_facts: Mapping[str, Any]) -> list[Problem]:
    """Problems with the values a node returned: [(field, value, why)], the audit's invalid-fact findings."""
    return guard_facts(node_facts)[0]


def sanitize_facts(node_facts: Mapping[str, Any]) -> NodeFacts:
    """A copy with every invalid value removed (what the checks and the plan read)."""
    return guard_facts(node_facts)[1]
