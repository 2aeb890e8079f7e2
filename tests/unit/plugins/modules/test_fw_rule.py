"""ddpfix_fw_rule on nftables (issue 38): the chains the controller planned, exactly; the node's own choice only
without a plan (the role run without the controller)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ddpfix.ansible import collection

CIDR = "192.168.83.0/24"
#: The Arch wiki's two input chains (tests/fixtures/rulesets/wiki-priorities.nft): `services` drops http only.
RULESET = {"nftables": [
    {"table": {"family": "inet", "name": "filter"}},
    {"chain": {"family": "inet", "table": "filter", "name": "services", "type": "filter", "hook": "input", "prio": 0,
               "policy": "accept"}},
    {"rule": {"family": "inet", "table": "filter", "chain": "services", "handle": 3, "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}},
        {"drop": None}]}},
    {"chain": {"family": "inet", "table": "filter", "name": "input", "type": "filter", "hook": "input", "prio": 1,
               "policy": "drop"}}]}


class Done(Exception):
    def __init__(self, failed: bool, result: dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.failed, self.result = failed, result


def run(params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Done, list[list[str]]]:
    mod = collection.module("ddpfix_fw_rule")
    ran: list[list[str]] = []

    class Fake:
        check_mode = False

        def __init__(self, argument_spec: dict[str, Any], supports_check_mode: bool) -> None:
            self.params = {k: v.get("default") for k, v in argument_spec.items()}
            self.params.update(params)

        def get_bin_path(self, name: str, required: bool = False) -> str | None:
            return None if name.endswith("-nft-save") else f"/usr/sbin/{name}"

        def run_command(self, argv: list[str]) -> tuple[int, str, str]:
            if argv[1:] == ["-j", "list", "ruleset"]:
                return 0, json.dumps(RULESET), ""
            ran.append(argv)
            return 0, "", ""

        def exit_json(self, **kw: Any) -> None:
            raise Done(False, kw)

        def fail_json(self, **kw: Any) -> None:
            raise Done(True, kw)

    monkeypatch.setattr(mod, "AnsibleModule", Fake)
    with pytest.raises(Done) as exc:
        mod.main()
    return exc.value, ran


def test_the_planned_chains_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = [{"family": "inet", "table": "filter", "chain": "input"}]
    done, ran = run({"backend": "nftables", "cidr": CIDR, "nft_chains": planned}, monkeypatch)
    assert not done.failed and done.result["chains"] == ["inet filter input"]
    assert [a[:6] for a in ran] == [["/usr/sbin/nft", "insert", "rule", "inet", "filter", "input"]]


def test_without_a_plan_the_node_chooses_by_text(monkeypatch: pytest.MonkeyPatch) -> None:
    done, ran = run({"backend": "nftables", "cidr": CIDR}, monkeypatch)
    assert not done.failed and done.result["chains"] == ["inet filter services", "inet filter input"]
    assert len(ran) == 2


@pytest.mark.parametrize("planned, why", [
    ([{"family": "inet", "table": "filter", "chain": "gone"}], "not an input base chain of the live rule set"),
    ([{"family": "inet", "table": "filter", "chain": "input; flush ruleset"}], "plain table/chain names"),
    ([{"family": "inet", "table": "firewalld", "chain": "filter_INPUT"}], "through firewalld"),
])
def test_a_planned_chain_that_is_not_there_or_not_plain_changes_nothing(
        planned: list[dict[str, str]], why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    done, ran = run({"backend": "nftables", "cidr": CIDR, "nft_chains": planned}, monkeypatch)
    assert done.failed and why in done.result["msg"] and ran == []


def test_an_egress_accept_for_other_ports_is_not_the_planned_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier run's egress accept to the cluster for the old master port (29500) is in the output chain; the plan
    now needs 29600 (the master port or a peer's ephemeral range changed, so the evaluator still finds the connect
    refused). The live check used to look at the destination alone, found 'ddpfix's accept to CIDR' and added nothing
    (changed false, the block stayed). The planned ports must be covered."""
    import sys
    old = {"rule": {"family": "inet", "table": "filter", "chain": "out", "handle": 7, "comment": "ddpfix-cluster",
                    "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                   "right": {"prefix": {"addr": "192.168.83.0", "len": 24}}}},
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                   "right": {"set": [29500, {"range": [32768, 60999]}]}}},
        {"accept": None}]}}
    ruleset = {"nftables": [*RULESET["nftables"], {"chain": {
        "family": "inet", "table": "filter", "name": "out", "type": "filter", "hook": "output", "prio": 0,
        "policy": "drop"}}, old]}
    monkeypatch.setattr(sys.modules[__name__], "RULESET", ruleset)
    egress = [{"backend": "nftables", "family": "inet", "table": "filter", "chain": "out", "ports": ""}]
    for ports, added in (("29500,32768-60999", False), ("29500,40000-50000", False), ("29600,32768-60999", True),
                         ("29500,32768-61000", True)):
        egress[0]["ports"] = ports
        done, ran = run({"backend": "nftables", "cidr": CIDR, "ingress": False, "egress": egress}, monkeypatch)
        assert not done.failed and bool(ran) == added == done.result["changed"], (ports, ran)
    fw = collection.module_utils("ddpfix_fw")
    save = ("*filter\n:OUTPUT DROP [0:0]\n-A OUTPUT -d 192.168.83.0/24 -p tcp -m multiport --dports 29500,32768:60999"
            " -m comment --comment ddpfix-cluster -j ACCEPT\nCOMMIT\n")
    assert fw.iptables_has_egress(save, CIDR, [(29500, 29500), (32768, 60999)])
    assert not fw.iptables_has_egress(save, CIDR, [(29600, 29600), (32768, 60999)])
