"""`ddpfix.nodefacts.NodeFacts` describes what `ddpfix_node_facts` really returns (recorded facts, and the module's
own `facts = {...}` keys): a key added on the node without its type, or a typed key the node no longer returns, fails."""

from __future__ import annotations

import ast
import json
from typing import get_type_hints

from conftest import FACTS, ROOT
from ddpfix.nodefacts import ChronyTracking, EnvFile, Interface, NodeFacts, ProbeResult


def _module_fact_keys() -> set[str]:
    """The keys of the dict literal `facts = {...}` that the facts module's collect() returns."""
    tree = ast.parse((ROOT / "roles" / "ddpfix_facts" / "library" / "ddpfix_node_facts.py").read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "facts" for t in node.targets)):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    raise AssertionError("no `facts = {...}` in ddpfix_node_facts.py")


def test_nodefacts_keys_are_the_modules_keys() -> None:
    assert set(get_type_hints(NodeFacts)) == _module_fact_keys()


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
