"""Every analysis of node data is bounded (issue 36 item 3): the chain walk is linear in rules and paths (a chain
reached again on the same path is cut, undecided, never re-walked; a chain's ways are worked out once per walk), and
a node's whole firewall analysis has a time budget after which its checks are not evaluated, never a pass.

Property tests (hypothesis) over generated chain graphs (loops, deep jump trees) and 100,000-rule chains. No host.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unit_helpers import Sim

from ddpfix import firewall as fw
from ddpfix.firewall.verdict import MAX_DEPTH, MAX_PATHS, Alt, BudgetExceeded, budget, settle, walk
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules.context import Thresholds
from ddpfix.rules.engine import not_evaluated, run_checks

SRC = "192.168.77.12"
HEAD = "*filter\n:INPUT {policy} [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"

#: A synthetic rule for `walk`: (step, target, undecided): step one of accept/drop/return/jump/goto/None.
SRule = tuple[str | None, str | None, bool]


def _walk(chains: dict[str, list[SRule]], start: str = "C0") -> tuple[list[fw.verdict.Path], bool, int]:
    """walk() over synthetic chains; -> (paths, complete, rules decided)."""
    calls = 0

    def decide(chain: str, n: int, rule: SRule) -> tuple[Sequence[Alt], str]:
        nonlocal calls
        calls += 1
        step, target, undecided = rule
        alt: Alt = (step, target)  # type: ignore[assignment]
        if step is None:
            return (), f"{chain} #{n}"
        return ((None, None), alt) if undecided else (alt,), f"{chain} #{n}"

    paths, complete = walk(start, lambda c: chains.get(c, []), decide)
    return paths, complete, calls


def _has_cycle(chains: dict[str, list[SRule]], start: str = "C0") -> bool:
    state: dict[str, int] = {}

    def visit(c: str) -> bool:
        state[c] = 1
        for step, target, _ in chains.get(c, []):
            if step in ("jump", "goto") and target is not None and (
                    state.get(target) == 1 or (target not in state and visit(target))):
                return True
        state[c] = 2
        return False

    return visit(start)


N_CHAINS = 6
_srule = st.tuples(
    st.sampled_from(["accept", "drop", "return", "jump", "goto", None]),
    st.sampled_from([f"C{i}" for i in range(N_CHAINS)]),
    st.booleans(),
).map(lambda r: (r[0], r[1] if r[0] in ("jump", "goto") else None, r[2]))
_graph = st.lists(st.lists(_srule, max_size=8), min_size=N_CHAINS, max_size=N_CHAINS).map(
    lambda cs: {f"C{i}": rules for i, rules in enumerate(cs)})


@settings(max_examples=400, deadline=None)
@given(chains=_graph)
def test_any_chain_graph_is_walked_in_linear_time_and_a_loop_is_never_a_pass(chains: dict[str, list[SRule]]) -> None:
    """Loops (jump or goto back into a chain on the path), forks and repeated jumps: the walk decides each rule at
    most once per way through its chain (rules x paths), and a path that meets a loop is cut: the verdict is
    undecided whatever the policy, never a pass."""
    n_rules = sum(len(r) for r in chains.values())
    t = time.monotonic()
    paths, complete, calls = _walk(chains)
    assert time.monotonic() - t < 2.0
    assert calls <= max(n_rules, 1) * (MAX_PATHS + 1)
    assert paths and not paths[0].assumed  # the nominal path first
    for policy in ("accept", "drop"):
        nominal, undecided, _ = settle(paths, complete, policy)
        if nominal.cut:
            assert nominal.cut in undecided  # the nominal way met a loop: its fate is unknown
        if any(p.cut for p in paths):
            assert undecided
    if not _has_cycle(chains):
        assert not any(p.cut and "loop" in p.cut for p in paths)


def test_a_goto_loop_is_cut_at_once_and_undecided() -> None:
    """The issue's case: INPUT -j A, A -g B, B -g A took 95.8 s per packet and read as accepted (policy)."""
    text = HEAD.format(policy="ACCEPT") + ":A - [0:0]\n:B - [0:0]\n-A INPUT -j A\n-A A -g B\n-A B -g A\nCOMMIT\n"
    t = time.monotonic()
    v = fw.evaluate({"iptables": text}, SRC, 29500)
    assert time.monotonic() - t < 0.5
    assert not v.decided and "-A B -g A (goto A: reached again on the same path (a loop); not walked)" in v.undecided[0]
    # a jump loop, and a chain jumping to itself
    for rules in ("-A INPUT -j A\n-A A -j B\n-A B -j A\n", "-A INPUT -j A\n-A A -j A\n"):
        v = fw.evaluate({"iptables": HEAD.format(policy="DROP") + ":A - [0:0]\n:B - [0:0]\n" + rules + "COMMIT\n"},
                        SRC, 29500)
        assert not v.decided and "a loop" in v.undecided[0]


@pytest.mark.parametrize("depth", [20, 60])
def test_a_deep_jump_tree_is_linear(depth: int) -> None:
    """Each chain jumps twice to the next: 2^depth ways of reaching the last chain, each chain walked once."""
    chains: dict[str, list[SRule]] = {f"C{i}": [("jump", f"C{i + 1}", False), ("jump", f"C{i + 1}", False)]
                                      for i in range(depth)}
    chains[f"C{depth}"] = [(None, None, False)] * 3
    t = time.monotonic()
    paths, complete, calls = _walk(chains)
    assert time.monotonic() - t < 1.0 and calls == 2 * depth + 3
    assert complete and len(paths) == 1 and paths[0].verdict is None and paths[0].cut is None


def test_jumps_nested_deeper_than_the_limit_are_undecided() -> None:
    chains: dict[str, list[SRule]] = {f"C{i}": [("jump", f"C{i + 1}", False)] for i in range(MAX_DEPTH + 10)}
    chains[f"C{MAX_DEPTH + 10}"] = [("accept", None, False)]
    paths, complete, _ = _walk(chains)
    nominal, undecided, _ = settle(paths, complete, "drop")
    assert nominal.cut and f"nested deeper than {MAX_DEPTH}" in undecided[0]


@settings(max_examples=30, deadline=None)
@given(forks=st.integers(min_value=9, max_value=40), depth=st.integers(min_value=1, max_value=30))
def test_forks_beyond_the_path_budget_are_cut_and_undecided(forks: int, depth: int) -> None:
    """More undecided rules than the path budget allows, behind a jump tree: bounded, and undecided."""
    chains: dict[str, list[SRule]] = {f"C{i}": [("jump", f"C{i + 1}", False)] for i in range(depth)}
    chains[f"C{depth}"] = [("accept", None, True)] * forks
    paths, complete, calls = _walk(chains)
    assert calls <= (depth + forks) * (MAX_PATHS + 1)
    _, undecided, _ = settle(paths, complete, "drop")
    assert undecided and len(paths) <= MAX_PATHS + 1


def _long_chain(n: int) -> str:
    lines = [f"-A INPUT -s 172.{16 + i // 62500}.{i // 250 % 250}.{i % 250}/32 -p tcp -m tcp --dport {1000 + i % 20000} "
             "-j ACCEPT" for i in range(n)]
    return HEAD.format(policy="DROP") + "\n".join(lines) + "\n-A INPUT -s 192.168.77.0/24 -j ACCEPT\nCOMMIT\n"


def test_a_100000_rule_chain_is_walked_once() -> None:
    chains: dict[str, list[SRule]] = {"C0": [(None, None, False)] * 99_999 + [("jump", "C1", False)],
                                      "C1": [("return", None, True)] + [(None, None, False)] * 99_999}
    t = time.monotonic()
    paths, complete, calls = _walk(chains)
    assert time.monotonic() - t < 5 and calls == 200_000 and complete and len(paths) == 2


def test_a_100000_rule_iptables_chain_is_evaluated_or_stopped_by_the_budget() -> None:
    """Parsing is linear; the walk of 100,000 rules for one packet ends within the budget, and a budget too short
    for it stops it (BudgetExceeded: the check then lists the node's firewall as not evaluated)."""
    rs = fw.Ruleset({"iptables": _long_chain(100_000)})
    t = time.monotonic()
    with budget(Thresholds().firewall_budget_s):
        v = fw.evaluate(rs, SRC, 29500)
    assert time.monotonic() - t < Thresholds().firewall_budget_s
    assert v.allowed and v.decided and "192.168.77.0/24" in v.evidence
    t = time.monotonic()
    with pytest.raises(BudgetExceeded), budget(0.05):
        fw.evaluate(rs, SRC, 29501)
    assert time.monotonic() - t < 1.0


def _sim_with(text: str) -> Sim:
    sim = Sim()
    sim.node("node2")["firewall"]["iptables"] = text
    return sim  # the recorded probes: every connect succeeded


def test_a_node_past_its_firewall_budget_is_not_evaluated_never_a_pass() -> None:
    """The check's answer on a node whose analysis runs past the budget: no firewall finding, every firewall check
    of that node listed as not evaluated, the other nodes analysed as usual."""
    unmodelled = [f"-A INPUT -s 172.{16 + i // 62500}.{i // 250 % 250}.{i % 250}/32 -m recent --rcheck --name r{i} "
                  "-j ACCEPT" for i in range(20_000)]
    sim = _sim_with(HEAD.format(policy="DROP") + "\n".join(unmodelled) + "\nCOMMIT\n")
    ctx = sim.context(Thresholds(firewall_budget_s=0.2))
    t = time.monotonic()
    findings = run_checks(ctx)
    assert time.monotonic() - t < 30
    assert not [f for f in findings if f.id.startswith("firewall.") and f.host == "node2"]
    ne = {x["id"]: x["reason"] for x in not_evaluated(ctx, findings).get("node2", [])}
    for rule in (firewall_rules.PEER_PORTS_BLOCKED, firewall_rules.WORLD_OPEN):
        assert "ran past its budget of 0.2 s" in ne[rule.id]
    assert "node1" not in not_evaluated(ctx, findings) and "node3" not in not_evaluated(ctx, findings)
    assert "netfilter" in ctx.unread("node2")


def test_a_goto_loop_on_one_node_ends_the_checks_at_once() -> None:
    """Undecided at once, and not decided by the probes that connected: rules that loop are not what the node's
    kernel runs (it refuses a loop), so one port's connect says nothing about them."""
    text = HEAD.format(policy="ACCEPT") + ":A - [0:0]\n:B - [0:0]\n-A INPUT -j A\n-A A -g B\n-A B -g A\nCOMMIT\n"
    sim = _sim_with(text)
    ctx = sim.context()
    t = time.monotonic()
    findings = run_checks(ctx)
    assert time.monotonic() - t < 10
    assert [f.id for f in findings if f.host == "node2" and f.id.startswith("firewall.")] == [
        firewall_rules.UNDECIDED.id]
    ne = [x["id"] for x in not_evaluated(ctx, findings)["node2"]]
    assert firewall_rules.PEER_PORTS_BLOCKED.id in ne
