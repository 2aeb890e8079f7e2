"""No torch in ddp_python is not a host fault: the torch comparison is listed as not evaluated (with how to point
ddpfix at the jobs' interpreter), never an incomplete-facts finding, never a failing audit; an interpreter that could
not be run at all still is one (a broken container runtime, a timeout)."""

from __future__ import annotations

import copy
from typing import Any

from test_rule_fixtures import context, load

from ddpfix.model.finding import Severity
from ddpfix.rules import env as env_rules
from ddpfix.rules import reachability
from ddpfix.rules.engine import not_evaluated, run_checks

BASE = load(f"{env_rules.TORCH_VERSION_MISMATCH.id}/pass-node3-has-no-torch-not-evaluated-there")
ABSENT = "torch is not installed for this interpreter"


def _facts(doc: dict[str, Any], name: str) -> dict[str, Any]:
    got: dict[str, Any] = doc["hosts"][name]["facts"]
    return got


def _cluster(python: Any = "python3", absent: bool | None = True, why: str = ABSENT, nodes: tuple[str, ...] = (
        "node1", "node2", "node3")) -> dict[str, Any]:
    """Every node of `nodes` answered as torch_info does for an interpreter without torch."""
    doc = copy.deepcopy(BASE)
    shown = python if isinstance(python, str) else " ".join(python)
    for n in nodes:
        f = _facts(doc, n)
        f["torch"] = {"python": python, "version": None, "cuda": None, "hip": None, "nccl": None, "cached": False}
        if absent is not None:
            f["torch"]["absent"] = absent
        f["unread"] = [u for u in f.get("unread") or [] if u.get("source") != "torch"]
        f["unread"].append({"source": "torch", "reason": f"{shown}: {why}"})
    return doc


def test_no_torch_anywhere_is_not_evaluated_and_no_finding() -> None:
    ctx = context(_cluster())
    findings = run_checks(ctx)
    assert not [f for f in findings if f.id == reachability.INCOMPLETE.id], findings
    assert not [f for f in findings if f.severity in (Severity.ERROR, Severity.WARNING)], findings
    ne = not_evaluated(ctx, findings)
    for n in ("node1", "node2", "node3"):
        (item,) = [i for i in ne[n] if i["id"] == env_rules.TORCH_VERSION_MISMATCH.id]
        assert "no torch in ddp_python (python3), not a host fault" in item["reason"]
        assert "[docker, run, --rm, --network, host, IMAGE, python3]" in item["reason"]
        assert 'docs/launch.md, "Torch in containers"' in item["reason"]


def test_a_container_argv_without_torch_is_named_as_the_operator_wrote_it() -> None:
    argv = ["docker", "run", "--rm", "--network", "host", "my image", "python3"]
    ctx = context(_cluster(argv, nodes=("node3",)))
    findings = run_checks(ctx)
    assert not [f for f in findings if f.id == reachability.INCOMPLETE.id], findings
    (item,) = [i for i in not_evaluated(ctx, findings)["node3"] if i["id"] == env_rules.TORCH_VERSION_MISMATCH.id]
    assert "no torch in ddp_python (docker run --rm --network host 'my image' python3)" in item["reason"]


def test_an_interpreter_that_could_not_run_is_still_a_host_fault() -> None:
    """A runtime that failed (the image missing, the daemon down, a timeout): the node cannot run what the jobs
    run, an incomplete-facts finding as before, with the tool's own error."""
    why = "Unable to find image 'nvcr.io/nvidia/pytorch:24.05-py3' locally"
    ctx = context(_cluster(["docker", "run", "nvcr.io/nvidia/pytorch:24.05-py3", "python3"], absent=False, why=why,
                           nodes=("node2",)))
    (f,) = [f for f in run_checks(ctx) if f.id == reachability.INCOMPLETE.id and f.host == "node2"]
    assert why in f.evidence and env_rules.TORCH_VERSION_MISMATCH.id in f.message


def test_absent_claimed_with_a_version_or_not_a_boolean_is_not_believed() -> None:
    doc = _cluster(nodes=("node3",))
    _facts(doc, "node3")["torch"]["absent"] = "yes"  # not of the field's grammar: dropped, an invalid-facts finding
    ids = {(f.id, f.host) for f in run_checks(context(doc))}
    assert (reachability.INVALID.id, "node3") in ids and (reachability.INCOMPLETE.id, "node3") in ids
    doc = _cluster(nodes=("node3",))
    _facts(doc, "node3")["torch"]["version"] = "2.13.0+cpu"  # a version read: absent means nothing
    ids = {(f.id, f.host) for f in run_checks(context(doc))}
    assert (reachability.INCOMPLETE.id, "node3") in ids
