"""Unit tests for roles/ddpfix_firewall/module_utils/ddpfix_fw.py: what ddpfix persists, finds and reverts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddpfix.ansible import collection
from ddpfix.remediate import firewall_backend

HERE = os.path.dirname(__file__)
fw = collection.module_utils("ddpfix_fw")

CIDR = "192.168.77.0/24"
LINE = f"-A INPUT -s {CIDR} -m comment --comment ddpfix-cluster -j ACCEPT"

RULES_V4 = """# saved by hand
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
COMMIT
*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:f2b-sshd - [0:0]
-A INPUT -p tcp -m tcp --dport 22 -j f2b-sshd
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
"""


def test_iptables_line_goes_to_top_of_filter_input_and_nothing_else_changes() -> None:
    new, why = fw.iptables_persisted(RULES_V4, CIDR)
    assert why == ""
    lines = new.splitlines()
    assert lines.index(LINE) == lines.index(":f2b-sshd - [0:0]") + 1
    assert [ln for ln in lines if ln != LINE] == RULES_V4.splitlines()
    again, why = fw.iptables_persisted(new, CIDR)
    assert again is None and why == ""  # idempotent


def test_iptables_file_without_filter_table_is_not_touched() -> None:
    new, why = fw.iptables_persisted("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n", CIDR)
    assert new is None and "*filter" in why


def test_iptables_tagged_finds_only_ddpfix_rules() -> None:
    save = RULES_V4.replace(":f2b-sshd - [0:0]\n", ":f2b-sshd - [0:0]\n" + LINE + "\n"
                            "-A INPUT -p tcp -m tcp --dport 22 -m comment --comment ddpfix-cluster -j DROP\n"
                            '-A INPUT -s 10.0.0.0/8 -m comment --comment "ddpfix-cluster-not" -j ACCEPT\n')
    assert fw.iptables_tagged(save) == [
        fw.iptables_rule(CIDR),
        ["-p", "tcp", "-m", "tcp", "--dport", "22", "-m", "comment", "--comment", "ddpfix-cluster", "-j", "DROP"],
    ]
    assert fw.iptables_tagged("*nat\nCOMMIT\n") == []


def test_iptables_blocks_tells_which_variant_holds_the_blocking_rules() -> None:
    assert fw.iptables_blocks(RULES_V4)  # policy DROP
    reject = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 1:2 -j REJECT --reject-with tcp-reset\nCOMMIT\n"
    assert fw.iptables_blocks(reject)
    assert not fw.iptables_blocks("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n-A FORWARD -j DROP\nCOMMIT\n")
    assert not fw.iptables_blocks("")


def test_iptables_variant_binaries() -> None:
    assert fw.iptables_bins("legacy") == ("iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore")
    assert fw.iptables_bins("nft")[2] == "iptables-nft-restore"
    assert fw.iptables_bins("auto") == ("iptables", "iptables-save", "iptables-restore")


def _chain(fam, table, name, hook=None, policy=None):
    c = {"family": fam, "table": table, "name": name}
    if hook:
        c.update(hook=hook, type="filter", prio=0, policy=policy or "accept")
    return {"chain": c}


def _rule(fam, table, chain, handle, expr, comment=None):
    r = {"family": fam, "table": table, "chain": chain, "handle": handle, "expr": expr}
    if comment:
        r["comment"] = comment
    return {"rule": r}


RULESET = {"nftables": [
    _chain("inet", "filter", "input", "input", "drop"),
    _chain("inet", "hostfw", "input", "input", "accept"),
    _rule("inet", "hostfw", "input", 4, [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                                                   "right": 23}}, {"reject": None}]),
    _chain("inet", "kube-proxy", "filter-input", "input", "accept"),
    _rule("inet", "kube-proxy", "filter-input", 5, [{"jump": {"target": "services"}}]),
    _chain("inet", "docker-like", "input", "input", "accept"),
    _chain("ip", "filter", "INPUT", "input", "drop"),  # iptables-nft
    _chain("inet", "firewalld", "filter_INPUT", "input", "drop"),
    _chain("ip6", "filter6", "input", "input", "drop"),
    _rule("inet", "filter", "input", 9, [{"accept": None}], "ddpfix-cluster"),
    _rule("ip", "filter", "DOCKER-USER", 10, [{"xt": {"type": "match", "name": "physdev"}}, {"return": None}]),
]}


def test_nft_blocking_chains_are_native_input_chains_that_drop() -> None:
    owned = fw.nft_iptables_owned(RULESET)  # ip filter: iptables-nft's by its xt match, not by the name INPUT
    assert owned == {("ip", "filter")}
    assert fw.nft_blocking_input_chains(RULESET, owned) == [("inet", "filter", "input"), ("inet", "hostfw", "input")]
    native = {"nftables": [i for i in RULESET["nftables"] if "DOCKER-USER" not in str(i)]}
    assert fw.nft_iptables_owned(native, set()) == set()  # iptables-nft-save: "table filter is incompatible"
    assert ("ip", "filter", "INPUT") in fw.nft_blocking_input_chains(native, set())
    assert fw.nft_blocking_input_chains(native, fw.nft_iptables_owned(native, {"filter"})) == [
        ("inet", "filter", "input"), ("inet", "hostfw", "input")]  # iptables-nft-save prints it: iptables-nft's


def test_planned_nft_chains_are_checked_against_a_strict_grammar() -> None:
    """The controller's chains (issue 38) reach nft as arguments: plain names, ip/inet, never firewalld's."""
    ok = [{"family": "inet", "table": "filter", "chain": "input"}, {"family": "ip", "table": "filter", "chain": "INPUT"}]
    assert fw.nft_chains_checked(ok + ok[:1]) == [("inet", "filter", "input"), ("ip", "filter", "INPUT")]
    assert fw.nft_chains_checked([]) == []
    for bad in ([{"family": "ip6", "table": "filter", "chain": "input"}],
                [{"family": "inet", "table": "filter", "chain": "input; flush ruleset"}],
                [{"family": "inet", "table": "-f", "chain": "rules.nft"}],  # an option to nft, not a name
                [{"family": "inet", "table": "filter", "chain": "-c"}],
                [{"family": "inet", "table": "filter", "chain": "{{ 7*191 }}"}],
                [{"family": "inet", "table": "filter", "chain": "in\nput"}],
                [{"family": "inet", "table": "filter", "chain": "$(id)"}],
                [{"family": "inet", "table": "firewalld", "chain": "filter_INPUT"}],
                [{"family": "inet", "table": "filter"}],
                [{"family": "inet", "table": "filter", "chain": "input", "extra": "x"}],
                [{"family": "inet", "table": "t", "chain": f"c{i}"} for i in range(9)],
                "inet filter input"):
        with pytest.raises(ValueError):
            fw.nft_chains_checked(bad)
    assert fw.nft_input_chains(RULESET) >= {("inet", "filter", "input"), ("ip", "filter", "INPUT")}
    assert ("ip", "filter", "DOCKER-USER") not in fw.nft_input_chains(RULESET)


def test_nft_tagged_rules_by_comment() -> None:
    assert fw.nft_tagged(RULESET) == [("inet", "filter", "input", 9)]


def test_nft_snippet_holds_only_ddpfix_rule() -> None:
    text = fw.nft_snippet([("inet", "filter", "input")], CIDR)
    rules = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert rules == [f'insert rule inet filter input ip saddr {CIDR} accept comment "ddpfix-cluster"']
    assert fw.is_ddpfix_snippet(text) and not fw.is_ddpfix_snippet("table inet filter {}\n")


def test_include_block_appended_once_and_moved_to_the_end() -> None:
    main = "#!/usr/sbin/nft -f\nflush ruleset\ntable inet filter {\n}"
    one = fw.with_include(main, "/etc/ddpfix/firewall.nft")
    assert one.startswith(main + "\n") and one.endswith(
        '# BEGIN ddpfix managed block\ninclude "/etc/ddpfix/firewall.nft"\n# END ddpfix managed block\n')
    assert fw.with_include(one, "/etc/ddpfix/firewall.nft") == one
    assert fw.block_include(one) == "/etc/ddpfix/firewall.nft" and fw.block_include(main) == ""
    assert fw.without_include(one) == main + "\n"
    # a table the operator appended after ddpfix's block: the block moves behind it, once
    later = one + "table inet extra {\n}\n"
    moved = fw.with_include(later, "/etc/ddpfix/firewall.nft")
    assert moved.count("include") == 1 and moved.index("table inet extra") < moved.index("include")


def test_includes_are_read_without_comments_and_without_ddpfix_block() -> None:
    text = ('flush ruleset\ninclude "/etc/nftables.d/*.nft"  # site rules\n# include "/etc/old.nft"\n'
            'table inet filter { include "inner.nft"; }\n')
    text = fw.with_include(text, "/etc/ddpfix/firewall.nft")
    assert fw.nft_includes(text) == ["/etc/nftables.d/*.nft", "inner.nft"]
    assert [fw.nft_include_path(p) for p in ("inner.nft", "/x/y.nft", "./z.nft")] == [
        "/etc/inner.nft", "/x/y.nft", "/./z.nft"]


def test_glob_matches_like_glob3() -> None:
    assert fw.glob_matches("/etc/nftables.d/*.nft", "/etc/nftables.d/ddpfix.nft")
    assert fw.glob_matches("/etc/nftables.d/*", "/etc/nftables.d/ddpfix.nft")
    assert fw.glob_matches("/etc/nftables/ddpfix.nft", "/etc/nftables/ddpfix.nft")
    assert not fw.glob_matches("/etc/nftables.d/*.nft", "/etc/ddpfix/firewall.nft")
    assert not fw.glob_matches("/etc/*", "/etc/ddpfix/firewall.nft")  # `*` stops at `/`
    assert not fw.glob_matches("/etc/nftables.d/*", "/etc/nftables.d/.ddpfix.nft")  # nor matches a leading dot
    assert fw.glob_matches("/etc/nftables.d/[a-e]*.nft", "/etc/nftables.d/ddpfix.nft")


def test_rule_ahead_of_the_drop() -> None:
    drop = [{"drop": None}]
    chain = ("inet", "filter", "input")
    ours = _rule("inet", "filter", "input", 2, [{"accept": None}], "ddpfix-cluster")
    other = _rule("inet", "filter", "input", 1, [{"accept": None}])
    dropper = _rule("inet", "filter", "input", 3, drop)
    assert fw.nft_rule_ahead({"nftables": [other, ours, dropper]}, chain)
    assert not fw.nft_rule_ahead({"nftables": [other, dropper, ours]}, chain)
    assert not fw.nft_rule_ahead({"nftables": [other]}, chain)


#: /etc/ufw/user.rules as ufw writes it (backend_iptables.py: `### tuple ### action proto dport dst sport src
#: direction[_iface] [comment=HEX]`, 9 fields with applications)
UFW_RULES = """*filter
:ufw-user-input - [0:0]
### RULES ###

### tuple ### allow tcp 22 0.0.0.0/0 any 192.168.77.0/24 in
-A ufw-user-input -p tcp --dport 22 -s 192.168.77.0/24 -j ACCEPT

### tuple ### allow any any 0.0.0.0/0 any 192.168.77.0/24 in_eth1
-A ufw-user-input -i eth1 -s 192.168.77.0/24 -j ACCEPT

### tuple ### allow tcp 22 0.0.0.0/0 any 192.168.77.0/24 OpenSSH - in
### tuple ### deny any any 0.0.0.0/0 any 192.168.77.0/24 in
### tuple ### route:allow any any 0.0.0.0/0 any 192.168.77.0/24 in
### tuple ### allow any any 10.9.9.9 any 192.168.77.0/24 in
### END RULES ###
COMMIT
"""


def test_ufw_port_22_rule_from_the_cidr_is_not_an_allow_of_the_cidr() -> None:
    assert not fw.ufw_allows(UFW_RULES, CIDR)
    every = "### tuple ### allow any any 0.0.0.0/0 any 192.168.77.0/24 in comment=646470666978\n"
    assert fw.ufw_allows(UFW_RULES + every, CIDR)
    assert fw.ufw_allows("### tuple ### allow_log any any 0.0.0.0/0 any 192.168.0.0/16 in\n", CIDR)  # a supernet
    assert not fw.ufw_allows("### tuple ### allow any any 0.0.0.0/0 any 192.168.77.128/25 in\n", CIDR)
    assert not fw.ufw_allows("### tuple ### allow any any ::/0 any 2001:db8::/32 in\n", CIDR)
    assert not fw.ufw_allows("", CIDR)


def test_backend_follows_the_iptables_variant_that_blocks() -> None:
    assert firewall_backend({}, "auto", {"iptables-legacy"}) == "iptables-legacy"
    assert firewall_backend({}, "iptables", {"iptables-legacy"}) == "iptables-legacy"
    assert firewall_backend({}, "iptables", {"iptables", "iptables-legacy"}) == "iptables"
    assert firewall_backend({}, "auto", {"nftables"}) == "nftables"
    # no finding names a layer (a failed probe only): the legacy tables when they alone hold rules
    assert firewall_backend({"iptables": "", "iptables_legacy": "*filter\n"}, "auto", set()) == "iptables-legacy"
    assert firewall_backend({"iptables": "*filter\n", "iptables_legacy": "*filter\n"}, "auto", set()) == "iptables"


# --------------------------------------------------------------------------- the module, on real nft (as root)

BOOT_CONF = """#!/usr/sbin/nft -f
flush ruleset
include "{d}/nftables.d/*.nft"
table inet filter {{
\tchain input {{
\t\ttype filter hook input priority filter; policy drop;
\t\ttcp dport 22 accept
\t}}
}}
"""


def _persist(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], check: bool = False,
             **args: Any) -> dict[str, Any]:
    from ansible.module_utils import basic

    mod = collection.module("ddpfix_fw_persist")
    monkeypatch.setattr(mod, "OLD_NFT_INCLUDES", tuple(args.pop("old", ())))
    payload = {"ANSIBLE_MODULE_ARGS": {"backend": "nftables", "cidr": CIDR, **args, "_ansible_check_mode": check}}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps(payload).encode())
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy", raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        mod.main()
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


needs_nft = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
                               reason="needs root, nft and unshare")


def _boot(main: Path) -> subprocess.CompletedProcess[str]:
    """What boot does, in a private network namespace: load the main config, list what it loaded."""
    return subprocess.run(["unshare", "--net", "sh", "-c", f"nft -f {main} && nft list ruleset"],
                          capture_output=True, text=True, check=False)


@needs_nft
def test_glob_ahead_of_the_tables_and_old_ddpfix_file_under_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's node: `flush ruleset`, a glob include, then the table; an older ddpfix left its file under the
    glob plus an explicit include: nothing loads at boot. ddpfix moves its file out, once, and proves the load."""
    d = tmp_path
    (d / "nftables.d").mkdir()
    legacy = d / "nftables.d" / "ddpfix.nft"
    legacy.write_text(fw.nft_snippet([("inet", "filter", "input")], CIDR))
    (d / "nftables.d" / "site.nft").write_text("define SITE = 10.1.0.0/16\n")
    main = d / "nftables.conf"
    main.write_text(fw.with_include(BOOT_CONF.format(d=d), str(legacy)))
    assert _boot(main).returncode != 0  # broken as found
    before = main.read_text()
    inc = d / "ddpfix" / "firewall.nft"
    args = {"nft_layouts": [{"config": str(main), "include": str(inc)}], "old": [str(legacy)]}

    dry = _persist(monkeypatch, capsys, check=True, **args)
    assert dry["changed"] and not dry.get("failed"), dry
    assert dry["files"] == [str(inc), str(main), str(legacy)]
    assert main.read_text() == before and legacy.exists() and not inc.exists()  # the dry run writes nothing

    done = _persist(monkeypatch, capsys, **args)
    assert done["changed"] and not done.get("failed"), done
    assert not legacy.exists() and (d / "nftables.d" / "site.nft").exists()
    text = main.read_text()
    assert text.count("include") == 2 and text.endswith(f'include "{inc}"\n# END ddpfix managed block\n')
    booted = _boot(main)
    assert booted.returncode == 0, booted.stderr
    assert booted.stdout.index(f"ip saddr {CIDR} accept") < booted.stdout.index("tcp dport 22 accept")
    again = _persist(monkeypatch, capsys, **args)
    assert not again["changed"] and not again.get("failed"), again


@needs_nft
def test_include_matched_by_a_glob_or_a_config_that_cannot_boot_fails_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path
    (d / "nftables.d").mkdir()
    main = d / "nftables.conf"
    main.write_text(BOOT_CONF.format(d=d))
    inc = d / "nftables.d" / "ddpfix.nft"
    out = _persist(monkeypatch, capsys, nft_layouts=[{"config": str(main), "include": str(inc)}])
    assert out["failed"] and f'also matched by include "{d}/nftables.d/*.nft" in the config' in out["msg"], out
    assert not inc.exists() and main.read_text() == BOOT_CONF.format(d=d)
    # a config that refers to a table only the running rule set has does not load at boot, with or without ddpfix
    broken = BOOT_CONF.format(d=d) + "add rule inet hostfw input tcp dport 23 drop\n"
    main.write_text(broken)
    out = _persist(monkeypatch, capsys, nft_layouts=[{"config": str(main), "include": str(d / "x" / "f.nft")}])
    assert out["failed"] and "does not load in an empty ruleset (as at boot) even without ddpfix's rule" in out["msg"]
    assert f"{main}:" in out["msg"] and "Error" in out["msg"] and "old file stays" in out["msg"], out["msg"]
    assert main.read_text() == broken and not (d / "x").exists()


@needs_nft
def test_config_that_already_holds_ddpfix_rule_gets_no_second_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """RHEL's own advice, `nft list ruleset > /etc/sysconfig/nftables.conf`, saves ddpfix's running rule in the
    config: ddpfix's include then adds nothing, and an old one goes."""
    main = tmp_path / "nftables.conf"
    dumped = BOOT_CONF.format(d=tmp_path).replace(
        "\t\ttcp dport 22", f'\t\tip saddr {CIDR} accept comment "ddpfix-cluster"\n\t\ttcp dport 22')
    inc = tmp_path / "ddpfix" / "firewall.nft"
    inc.parent.mkdir()
    inc.write_text(fw.nft_snippet([("inet", "filter", "input")], CIDR))
    main.write_text(fw.with_include(dumped, str(inc)))
    out = _persist(monkeypatch, capsys, nft_layouts=[{"config": str(main), "include": str(inc)}])
    assert out["changed"] and not out.get("failed"), out
    assert main.read_text() == dumped and not inc.exists()
    assert _boot(main).stdout.count("ddpfix-cluster") == 1


@needs_nft
def test_a_later_run_keeps_the_persisted_accepts_it_does_not_plan_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run 1 fixes egress (and persists it); the live accept then lets the connects out, so run 2's plan, for a new
    ingress block, carries no egress change. The include file is rewritten from run 2's plan: the persisted egress
    accept used to be dropped from it (lost at the next boot while the audit, on the live rule, passed). It stays,
    as the input accept already did for an egress-only run."""
    main = tmp_path / "nftables.conf"
    main.write_text(BOOT_CONF.format(d=tmp_path).replace(f'include "{tmp_path}/nftables.d/*.nft"\n', "")
                    .replace("\t}\n}", "\t}\n\tchain output {\n\t\ttype filter hook output priority filter; "
                             "policy accept;\n\t\tip daddr 192.168.0.0/16 drop\n\t}\n}"))
    inc = tmp_path / "ddpfix" / "firewall.nft"
    egress = [{"backend": "nftables", "family": "inet", "table": "filter", "chain": "output",
               "ports": "29500,32768-60999"}]
    layouts = [{"config": str(main), "include": str(inc)}]
    one = _persist(monkeypatch, capsys, nft_layouts=layouts, egress=egress, ingress=False)
    assert one["changed"] and not one.get("failed"), one
    assert "daddr" in inc.read_text() and " saddr " not in inc.read_text()
    two = _persist(monkeypatch, capsys, nft_layouts=layouts, nft_chains=[
        {"family": "inet", "table": "filter", "chain": "input"}])
    assert two["changed"] and not two.get("failed"), two
    text = inc.read_text()
    assert f"ip saddr {CIDR} accept" in text and f"ip daddr {CIDR} tcp dport {{ 29500, 32768-60999 }}" in text, text
    booted = _boot(main).stdout
    assert booted.index(f"ip daddr {CIDR} tcp dport") < booted.index("ip daddr 192.168.0.0/16 drop"), booted
    three = _persist(monkeypatch, capsys, nft_layouts=layouts, nft_chains=[
        {"family": "inet", "table": "filter", "chain": "input"}])
    assert not three["changed"] and not three.get("failed"), three


@needs_nft
def test_an_egress_only_run_keeps_the_input_chains_the_controller_chose(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run 1 persists the input accept in the chain the controller's evaluator chose: a base chain whose drop is in
    the regular chain it jumps to. Run 2 fixes egress only (no chains planned): the node used to choose the input
    chains again by its own rule (a chain with a drop of its own), found none and dropped the persisted input accept
    from the include file. The chains of the file stay."""
    main = tmp_path / "nftables.conf"
    main.write_text("#!/usr/sbin/nft -f\nflush ruleset\ntable inet filter {\n\tchain in_drop {\n\t\ttcp dport 22 "
                    "accept\n\t\tdrop\n\t}\n\tchain input {\n\t\ttype filter hook input priority filter; policy "
                    "accept;\n\t\tjump in_drop\n\t}\n\tchain output {\n\t\ttype filter hook output priority filter; "
                    "policy accept;\n\t\tip daddr 192.168.0.0/16 drop\n\t}\n}\n")
    inc = tmp_path / "ddpfix" / "firewall.nft"
    layouts = [{"config": str(main), "include": str(inc)}]
    one = _persist(monkeypatch, capsys, nft_layouts=layouts, nft_chains=[
        {"family": "inet", "table": "filter", "chain": "input"}])
    assert one["changed"] and not one.get("failed"), one
    two = _persist(monkeypatch, capsys, nft_layouts=layouts, ingress=False, egress=[
        {"backend": "nftables", "family": "inet", "table": "filter", "chain": "output", "ports": "29500"}])
    assert two["changed"] and not two.get("failed"), two
    text = inc.read_text()
    assert f"insert rule inet filter input ip saddr {CIDR} accept" in text and "tcp dport { 29500 }" in text, text


@needs_nft
def test_a_later_ingress_run_keeps_the_input_chains_an_earlier_run_persisted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run 1 persists the input accept in `services` (the Arch wiki's two input chains); later `input` refuses the
    cluster too, and run 2's plan names `input` only (its live accept lets the cluster through `services`). The file
    used to be rewritten with run 2's chain alone: `services` lost its accept at the next boot. Both stay."""
    main = tmp_path / "nftables.conf"
    main.write_text("#!/usr/sbin/nft -f\nflush ruleset\ntable inet filter {\n\tchain services {\n\t\ttype filter "
                    "hook input priority 0; policy accept;\n\t\ttcp dport 80 drop\n\t}\n\tchain input {\n\t\ttype "
                    "filter hook input priority 1; policy drop;\n\t\ttcp dport 22 accept\n\t}\n}\n")
    inc = tmp_path / "ddpfix" / "firewall.nft"
    layouts = [{"config": str(main), "include": str(inc)}]
    for chain in ("services", "input"):
        out = _persist(monkeypatch, capsys, nft_layouts=layouts, nft_chains=[
            {"family": "inet", "table": "filter", "chain": chain}])
        assert out["changed"] and not out.get("failed"), out
    text = inc.read_text()
    for chain in ("services", "input"):
        assert f"insert rule inet filter {chain} ip saddr {CIDR} accept" in text, text
    again = _persist(monkeypatch, capsys, nft_layouts=layouts, nft_chains=[
        {"family": "inet", "table": "filter", "chain": "input"}])
    assert not again["changed"] and not again.get("failed"), again
