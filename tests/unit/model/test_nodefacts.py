"""`ddpfix.model.facts.NodeFacts` describes what `ddpfix_node_facts` really returns (recorded facts, and the module's
own `facts = {...}` keys): a key added on the node without its type, or a typed key the node no longer returns, fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_type_hints

from unit_helpers import FACTS, load_role_module

from ddpfix.model.facts import (
    ChronyTracking,
    EnvFile,
    Interface,
    NodeFacts,
    ProbeResult,
    Sysctl,
    TimeFacts,
)


def _collected(tmp_path: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """This machine's facts as the module's collector returns them (in-process, as `ddpfix check --local` runs it; no
    probe, no torch), with its per-reader profile."""
    mod = load_role_module("modules/ddpfix_node_facts.py", "ddpfix_node_facts")
    params = {"cluster_cidr": "", "master_address": "127.0.0.1", "master_port": 29500, "is_master": False,
              "socket_ifname": "", "env_path": str(tmp_path / "ddp.env"), "probe": None,
              "lock_path": str(tmp_path / "lock"), "run_id": "", "sysfs_root": "/sys", "dev_root": "/dev",
              "python": "", "launcher_units": [], "fi_info": ""}
    profile: dict[str, float] = {}
    return mod.collect(params, profile), profile


def test_nodefacts_keys_are_the_modules_keys(tmp_path: Path) -> None:
    facts, _ = _collected(tmp_path)
    assert set(get_type_hints(NodeFacts)) == set(facts)
    for key, typed in (("sysctl", Sysctl), ("time", TimeFacts)):
        assert set(get_type_hints(typed)) == set(facts[key]), key
    # `unread`: every reader's, then the firewall layers' (the firewall's own list); `errors`: the readers' reasons
    n = len(facts["errors"])
    assert [u["reason"] for u in facts["unread"][:n]] == facts["errors"]
    assert facts["unread"][n:] == list(facts["firewall"].get("unread") or [])


def test_every_reader_returns_facts_and_unread_and_is_profiled(tmp_path: Path) -> None:
    readers = load_role_module("module_utils/ddpfix_readers.py", "ddpfix_readers")
    _, profile = _collected(tmp_path)
    assert list(profile) == [r.__name__ for r in readers.READERS]
    assert all(isinstance(ms, float) and ms >= 0 for ms in profile.values())


def test_recorded_facts_fit_the_types() -> None:
    docs = [json.loads(p.read_text()) for p in sorted((FACTS / "clean3").glob("node*.json"))]
    assert docs
    for doc in docs:
        node, probe = doc["node"], doc["probe"]
        assert set(node) <= set(get_type_hints(NodeFacts)), set(node) - set(get_type_hints(NodeFacts))
        for i in node["interfaces"]:
            assert Interface.__required_keys__ <= set(i) <= set(get_type_hints(Interface)), i
        assert set(node["env_file"]) <= set(get_type_hints(EnvFile))  # recorded before some keys were added
        tracking = node["time"]["chrony_tracking"]
        if tracking:
            assert set(tracking) <= set(get_type_hints(ChronyTracking))
        assert set(probe) <= set(get_type_hints(ProbeResult))
