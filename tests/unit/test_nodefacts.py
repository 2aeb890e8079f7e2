"""`ddpfix.model.facts.NodeFacts` describes what `ddpfix_node_facts` really returns (recorded facts, and the module's
own `facts = {...}` keys): a key added on the node without its type, or a typed key the node no longer returns, fails."""

from __future__ import annotations

import ast
import json
from typing import get_type_hints

from conftest import FACTS, ROOT

from ddpfix.model.facts import (
    ChronyTracking,
    EnvFile,
    Interface,
    NodeFacts,
    ProbeResult,
    Sysctl,
    TimeFacts,
)


def _facts_literal() -> ast.Dict:
    """The dict literal `facts = {...}` that the facts module's collect() returns."""
    tree = ast.parse((ROOT / "plugins" / "modules" / "ddpfix_node_facts.py").read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "facts" for t in node.targets)):
            return node.value
    raise AssertionError("no `facts = {...}` in ddpfix_node_facts.py")


def _keys(d: ast.Dict) -> dict[str, ast.expr]:
    return {k.value: v for k, v in zip(d.keys, d.values, strict=True) if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def test_nodefacts_keys_are_the_modules_keys() -> None:
    facts = _keys(_facts_literal())
    assert set(get_type_hints(NodeFacts)) == set(facts)
    for key, typed in (("sysctl", Sysctl), ("time", TimeFacts)):
        literal = facts[key]
        assert isinstance(literal, ast.Dict)
        assert set(get_type_hints(typed)) == set(_keys(literal)), key


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
