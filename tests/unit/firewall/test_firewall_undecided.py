"""What the firewall evaluator cannot decide is undecided, never a pass (issue 20, item 3).

Recorded by fixtures/firewall/record-unmodelled.sh from the real tools (iptables 1.8.9 nf_tables with ipset, nftables
1.0.6): one rule per match kind the evaluator does not model, each on its own port, and the ordering cases. A rule
that could turn around whether the packet is accepted makes the verdict undecided, naming the rule; one that cannot
(after the accepting rule, limited to another port, same verdict as the policy) leaves it decided, as a note.
"""
import json
import os

import pytest
from unit_helpers import FIREWALL_FIXTURES

from ddpfix import firewall as fw
from ddpfix.rules import firewall as firewall_rules

FIX = str(FIREWALL_FIXTURES)


def read(name):
    with open(os.path.join(FIX, name)) as fh:
        return fh.read()


def state(ipt=None, nft=None, nft_text=None):
    return {"schema": fw.SCHEMA, "firewalld": None, "iptables": read(ipt) if ipt else None, "iptables_legacy": None,
            "ip6tables": None, "nft": json.loads(read(nft)) if nft else None,
            "nft_text": read(nft_text) if nft_text else None, "errors": []}


IPT = state("ipt_unmodelled.iptables-save", "ipt_unmodelled.nft.json", "ipt_unmodelled.nft.txt")
#: the same rules seen only through `nft -j` (iptables-save missing): the xt expressions are opaque there
IPT_NFT_ONLY = state(None, "ipt_unmodelled.nft.json", "ipt_unmodelled.nft.txt")
NFT = state(None, "nft_unmodelled.json", "nft_unmodelled.txt")

SRC = "10.20.1.1"

#: port -> the rule (as iptables-save prints it) that makes TCP from a peer to it undecided: a DROP/REJECT ahead of
#: the policy ACCEPT
IPT_UNDECIDED_DENY = {
    29500: "-m set ! --match-set ok src -j DROP",
    29501: "-m recent --rcheck --seconds 60 --name seen",
    29502: "-m hashlimit --hashlimit-above 10/sec",
    29503: '-m string --string "evil" --algo bm -j DROP',
    29504: "-m u32 --u32",
    29505: '-m bpf --bytecode "1,6 0 0 0" -j DROP',
    29506: "-m connlimit --connlimit-above 10",
    29507: "-m limit --limit 5/min -j DROP",
    29508: "-j NFQUEUE --queue-num 1",
    29509: "-m mark --mark 0x1 -j DROP",
    29560: "-m recent --rcheck --name seen",  # jumps to BLOCK, which drops
}


@pytest.mark.parametrize("port", sorted(IPT_UNDECIDED_DENY))
def test_iptables_unmodelled_match_before_the_accept_is_undecided(port):
    v = fw.evaluate(IPT, SRC, port, iface="eth0")
    assert not v.decided, (port, v.evidence)
    assert v.allowed and v.evidence == "iptables filter INPUT policy ACCEPT"  # the way it goes if nothing matches
    assert len(v.undecided) == 1 and IPT_UNDECIDED_DENY[port] in v.undecided[0], v.undecided
    assert f"--dport {port} " in v.undecided[0] and v.undecided[0].startswith("iptables filter INPUT #")


def test_iptables_unmodelled_accept_before_the_drop_is_undecided():
    v = fw.evaluate(IPT, SRC, 29540, iface="eth0")
    assert not v.allowed and not v.decided and v.verdict == "drop"
    assert v.evidence.endswith("-A INPUT -p tcp -m tcp --dport 29540 -j DROP")
    assert v.undecided == ("iptables filter INPUT #15: -A INPUT -p tcp -m tcp --dport 29540 -m set --match-set ok src "
                           "-j ACCEPT",)


def test_iptables_return_only_for_set_members_is_undecided():
    v = fw.evaluate(IPT, SRC, 29570, iface="eth0")  # -j CHK: RETURN if in @ok, else DROP
    assert not v.allowed and not v.decided
    assert "(via INPUT #19)" in v.evidence and v.evidence.startswith("iptables filter CHK #2: -A CHK -j DROP")
    assert v.undecided == ("iptables filter CHK #1: -A CHK -m set --match-set ok src -j RETURN",)


@pytest.mark.parametrize(("port", "allowed", "note"), [
    (29530, True, None),  # after the accepting rule: never reached
    (29550, True, "--dport 29550 -m set --match-set ok src -j ACCEPT"),  # accepts what the policy accepts anyway
    (22, True, None),  # the unmodelled rules are limited to other ports: False AND unknown is False
    (8081, True, None),
])
def test_iptables_unmodelled_rule_that_cannot_change_the_verdict_is_a_note(port, allowed, note):
    v = fw.evaluate(IPT, SRC, port, iface="eth0")
    assert v.decided and v.allowed is allowed, v.undecided
    if note:
        assert any(note in n for n in v.notes) and "cannot change this verdict" in v.evidence
    else:
        assert not v.notes


def test_iptables_privileged_source_port_never_matches_a_dialer():
    assert fw.evaluate(IPT, SRC, 29580, iface="eth0").decided  # --sport 1:1023: never a dialer's port
    v = fw.evaluate(IPT, SRC, 29581, iface="eth0")  # --sport 40000: may be the dialer's ephemeral port
    assert not v.decided and "--sport 40000" in v.undecided[0]


def test_iptables_rules_seen_only_through_nft_are_undecided_too():
    for port in (29500, 29507, 29540):
        v = fw.evaluate(IPT_NFT_ONLY, SRC, port, iface="eth0")
        assert not v.decided and v.layer == "nftables", (port, v.evidence)
        assert f"dport {port}" in v.undecided[0]
        assert ("xt match" in v.undecided[0]) is (port != 29507), v.undecided  # `limit` has a native nft form


@pytest.mark.parametrize(("port", "rule"), [
    (29600, "ip saddr . tcp dport != @pairs drop"),  # a concatenated set: not modelled
    (29601, "limit rate over 10/second drop"),
    (29602, "meta mark 0x00000001 drop"),
    (29604, "ip saddr @seen drop"),  # a dynamic set: what the dump lists is not what the packet meets
    (29630, "fib daddr type != local drop"),
])
def test_nft_unmodelled_expression_before_the_accept_is_undecided(port, rule):
    v = fw.evaluate(NFT, SRC, port, iface="eth0")
    assert v.allowed and not v.decided, (port, v.evidence)
    assert v.undecided == (f"nft inet filter input: tcp dport {port} {rule}",)


def test_nft_ordering():
    a = fw.evaluate(NFT, "10.10.1.1", 29610, iface="eth0")  # accepted by the address rule before the mark rule
    assert a.allowed and a.decided and a.evidence == "nft inet filter input: tcp dport 29610 ip saddr 10.10.0.0/16 accept"
    b = fw.evaluate(NFT, SRC, 29610, iface="eth0")  # not in 10.10/16: the mark rule could drop it
    assert b.allowed and not b.decided and "meta mark 0x00000002 drop" in b.undecided[0]
    c = fw.evaluate(NFT, SRC, 29620, iface="eth0")  # only an unmodelled accept stands before the drop
    assert not c.allowed and not c.decided and "meta mark 0x00000002 accept" in c.undecided[0]
    assert c.evidence == "nft inet filter input: tcp dport 29620 drop"
    d = fw.evaluate(NFT, SRC, 22, iface="eth0")  # every unmodelled rule is limited to another port
    assert d.allowed and d.decided


def test_undecided_is_never_world_open():
    # 29540: only the ipset rule accepts it; 29500: accepted unless the ipset rule drops it. Neither is world-open.
    for port in (29540, 29500):
        assert fw.world_open(IPT, port, "10.20.0.0/16") is None


def test_walk_gives_up_beyond_its_path_budget_and_stays_undecided():
    lines = [f"-A INPUT -p tcp -m tcp --dport 29500 -m recent --rcheck --name r{i} -j ACCEPT" for i in range(12)]
    text = read("ipt_empty.iptables-save").replace(":INPUT ACCEPT", ":INPUT DROP").replace(
        "COMMIT", "\n".join(lines) + "\nCOMMIT", 1)
    v = fw.evaluate(state() | {"iptables": text}, SRC, 29500, iface="eth0")
    assert not v.allowed and not v.decided and len(v.undecided) >= 1


# --------------------------------------------------------------------------- the checks: findings, probes, report

from unit_helpers import Sim  # noqa: E402

from ddpfix.rules.engine import not_evaluated  # noqa: E402

RULE = "-A INPUT -p tcp -m tcp --dport 29500 -m set ! --match-set ok src -j DROP"
IPT_MASTER = ("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n" + RULE + "\nCOMMIT\n")


def _master_rule(sim, connects_ok=None):
    """The master holds the issue's rule. connects_ok: None = no probes (--no-probe), True/False = every peer's
    connect to the master port succeeded / timed out."""
    sim.node("node1")["firewall"]["iptables"] = IPT_MASTER
    for n in sim.docs:
        cs = sim.probe(n)["connects"]
        if connects_ok is None:
            cs.clear()
        for c in cs:
            if c["kind"] == "master":
                c["ok"], c["error"] = connects_ok, None if connects_ok else "[Errno 110] ETIMEDOUT: timed out"


def _fw(sim):
    return [(f.id, f.host, f) for f in sim.findings() if f.id.startswith("firewall.")]


def test_no_probe_reports_undecided_and_lists_the_check_as_not_evaluated():
    sim = Sim()
    _master_rule(sim)
    got = _fw(sim)
    assert [(i, h) for i, h, _ in got] == [(firewall_rules.UNDECIDED.id, "node1")]
    f = got[0][2]
    assert RULE in f.evidence and "not evaluated" in f.message and "192.168.77.0/24" in f.fix and "node1" in f.fix
    ctx = sim.context()
    ne = not_evaluated(ctx, sim.findings())
    assert {"id": firewall_rules.MASTER_PORT_BLOCKED.id,
            "reason": f"undecided ({firewall_rules.UNDECIDED.id}): iptables filter INPUT #1: {RULE}"} in ne["node1"]


def test_probes_that_connected_decide_accepted():
    sim = Sim()
    _master_rule(sim, connects_ok=True)
    assert _fw(sim) == []


def test_a_failed_probe_decides_blocked_and_says_what_it_found():
    sim = Sim()
    _master_rule(sim, connects_ok=False)
    got = _fw(sim)
    assert [(i, h) for i, h, _ in got] == [(firewall_rules.MASTER_PORT_BLOCKED.id, "node1")]
    ev = got[0][2].evidence
    assert "the probe from node2 (192.168.77.12) to node1:29500 failed: [Errno 110] ETIMEDOUT" in ev
    assert RULE in ev  # and why the rules could not decide
    assert "{" not in got[0][2].fix


def test_the_probe_port_decides_the_ephemeral_range_when_the_same_rules_decide_it():
    sim = Sim()
    rule = "-A INPUT -p tcp -m tcp --dport 32768:60999 -m recent --rcheck --name seen -j DROP"
    sim.node("node3")["firewall"]["iptables"] = IPT_MASTER.replace(RULE, rule)
    assert _fw(sim) == []  # the recorded peers' connects to node3's probe port succeeded
    for n in sim.docs:
        for c in sim.probe(n)["connects"]:
            if c["name"] == "node3":
                c["ok"], c["error"] = False, "[Errno 111] ECONNREFUSED: refused"
    sim.probe("node3")["up_at"], sim.probe("node3")["down_at"] = None, None
    got = _fw(sim)
    assert [(i, h) for i, h, _ in got] == [(firewall_rules.PEER_PORTS_BLOCKED.id, "node3")], got
    assert "failed: [Errno 111] ECONNREFUSED" in got[0][2].evidence


def test_undecided_accept_is_a_warning_and_no_block():
    sim = Sim()
    sim.node("node1")["firewall"]["iptables"] = IPT_MASTER.replace(":INPUT ACCEPT", ":INPUT DROP").replace(
        RULE, "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n-A INPUT -m set --match-set cluster src -j ACCEPT")
    for n in sim.docs:
        sim.probe(n)["connects"].clear()
    got = _fw(sim)
    assert {(i, h) for i, h, _ in got} == {(firewall_rules.UNDECIDED_ACCEPT.id, "node1")}
    fixes = sorted(f.fix for _, _, f in got)
    assert len(got) == 2 and "port 29500" in fixes[0] and "the ephemeral range 32768-60999" in fixes[1], fixes
    for _, _, f in got:
        assert f.severity.label == "warning" and "-m set --match-set cluster src -j ACCEPT" in f.evidence


@pytest.mark.parametrize(("spec", "want"), [("1:1023", False), ("53", False), (":1023", False), ("40000", None),
                                            ("1024:", None), ("0:", None), ("1000:2000", None), ("x", None)])
def test_source_port_match_is_known_only_for_privileged_ports(spec, want):
    from ddpfix.firewall.iptables import Option, _option
    from ddpfix.firewall.verdict import Packet

    pkt = Packet.of(SRC, 29500)
    assert _option(Option(False, "--sport", (spec,)), pkt) is want
    assert _option(Option(True, "--sport", (spec,)), pkt) is (None if want is None else not want)


def test_firewalld_ipset_source_zone_ahead_of_the_interface_zone_is_undecided():
    st = json.loads(read("fwd_cli.json"))
    st["iptables"], st["nft"] = "", None
    zones = st["firewalld"]["zones"]
    zones["drop"]["sources"] = ["ipset:blocked"]  # firewall-cmd --zone=drop --add-source=ipset:blocked
    v = fw.evaluate(st, SRC, 29500, iface="eth0")  # public on eth0 opens 29500/tcp, unless the source is blocked
    assert v.allowed and not v.decided and v.undecided == (
        "firewalld zone 'drop' source ipset:blocked (the packet may come from it)",)
    zones["trusted"]["sources"] = ["ipset:cluster"]  # a zone that accepts too: cannot change an accept
    zones["drop"]["sources"] = []
    v = fw.evaluate(st, SRC, 29500, iface="eth0")
    assert v.allowed and v.decided and any("ipset:cluster" in n for n in v.notes)


# --------------------------------------------------------------------------- property: undecided exactly when it matters

from itertools import product  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_MATCHES = ["", "-p tcp -m tcp --dport 29500", "-p tcp -m tcp --dport 8080", "-s 10.20.0.0/16", "UNKNOWN"]
_TARGETS = ["ACCEPT", "DROP", "REJECT", "RETURN", "LOG", "A", "B"]
_rule = st.tuples(st.sampled_from(_MATCHES), st.sampled_from(_TARGETS))


def _ruleset(policy, chains, assign=None):
    """iptables-save text; each UNKNOWN match is `-m recent` (not modelled) or, under `assign`, a match that always
    (`-m comment`) or never (`-s 192.0.2.0/32`) holds for the packet."""
    lines, k = [], 0
    for chain, rules in chains.items():
        for m, target in rules:
            if m == "UNKNOWN":
                m = (f"-m recent --rcheck --name u{k}" if assign is None
                     else f"-m comment --comment u{k}" if assign[k] else "-s 192.0.2.0/32")
                k += 1
            lines.append(f"-A {chain} {m} -j {target}".replace("  ", " "))
    return ("*filter\n" f":INPUT {policy} [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n"
            + "\n".join(lines) + "\nCOMMIT\n"), k


@settings(max_examples=300, deadline=None)
@given(policy=st.sampled_from(["ACCEPT", "DROP"]),
       inp=st.lists(_rule, max_size=5),
       a=st.lists(_rule.filter(lambda r: r[1] not in ("A",)), max_size=3),
       b=st.lists(_rule.filter(lambda r: r[1] not in ("A", "B")), max_size=3))
def test_a_decided_verdict_holds_whatever_the_unmodelled_rules_do(policy, inp, a, b):
    """Decided -> every way the unmodelled matches can go gives the same acceptance; the nominal verdict is the one
    where none matches; undecided -> some way really differs (checked where no chain is entered twice, so the walk's
    paths are all feasible)."""
    chains = {"INPUT": inp, "A": a, "B": b}
    text, k = _ruleset(policy, chains)
    v = fw.evaluate(state() | {"iptables": text}, SRC, 29500, iface="eth0")
    outcomes = set()
    for assign in product([False, True], repeat=k):
        concrete, _ = _ruleset(policy, chains, assign)
        c = fw.evaluate(state() | {"iptables": concrete}, SRC, 29500, iface="eth0")
        assert c.decided, c.undecided
        outcomes.add(c.allowed)
        if not any(assign):
            assert c.allowed == v.allowed  # the nominal way: no unmodelled rule matches
    if v.decided:
        assert outcomes == {v.allowed}, (text, v)
    elif sum(t in ("A", "B") for _, t in inp + a) <= 1:
        assert outcomes == {True, False}, (text, v.undecided)


def test_cli_audit_reports_undecided_as_not_evaluated_in_json_and_text(monkeypatch):
    """Through the CLI (`ddpfix audit --no-probe`, recorded facts): exit 1, the finding in the JSON report (which
    validates against its schema) and a NOT EVALUATED row in the text report naming the rule."""
    from click.testing import CliRunner

    import ddpfix.audit
    import ddpfix.cli.audit as audit_cli
    from ddpfix import schemas
    from ddpfix.cli import cli

    sim = Sim()
    _master_rule(sim)
    monkeypatch.setattr(ddpfix.audit, "collect", lambda cluster, **_: (sim.context(), None))
    monkeypatch.setattr(audit_cli, "inventory_of", lambda app: ("x.yml",))
    r = CliRunner().invoke(cli, ["audit", "-i", "x.yml", "--no-probe", "--format", "json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    schemas.validate(doc)
    assert [(f["id"], f["severity"]) for f in doc["findings"] if f["id"].startswith("firewall.")] == [
        (firewall_rules.UNDECIDED.id, "error")]
    assert [x["id"] for x in doc["hosts"]["node1"]["not_evaluated"]] == [firewall_rules.MASTER_PORT_BLOCKED.id]
    r = CliRunner().invoke(cli, ["audit", "-i", "x.yml", "--no-probe"], env={"COLUMNS": "250", "NO_COLOR": "1"})
    assert r.exit_code == 1 and "NOT EVALUATED" in r.stdout and "--match-set ok src -j DROP" in r.stdout, r.stdout
