"""`ddpfix explain` on the field corpus: log excerpts built around messages copied from torch's, Gloo's, NCCL's and
aws-ofi-nccl's sources and from public logs (each fixture's `# source:` line), and non-distributed failures that
must name nothing. Each fixture declares `# expect:` (the failure keys, or `none`) and `# findings:` (the finding
ids the named failures point at)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from unit_helpers import FIXTURES, ROOT

from ddpfix.cli import cli
from ddpfix.diagnose.match import diagnose, finding_ids
from ddpfix.diagnose.patterns import PATTERNS
from ddpfix.rules import env as env_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import host as host_rules
from ddpfix.rules import netif as netif_rules

LOGS = FIXTURES / "logs"
FIELD = LOGS / "field"


def _read(path: Path) -> tuple[dict[str, str], list[str]]:
    head: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    body = list(lines)
    while body and body[0].startswith("# "):
        k, _, v = body.pop(0)[2:].partition(":")
        head[k.strip()] = v.strip()
    return head, body


def _expected(head: dict[str, str]) -> tuple[list[str], list[str]]:
    exp = [] if head["expect"] == "none" else head["expect"].split()
    ids = [] if head["findings"] == "-" else head["findings"].split()
    return exp, ids


CORPUS = sorted(FIELD.glob("*.log"))


def test_corpus_size_and_headers() -> None:
    dist = [p for p in CORPUS if _read(p)[0]["expect"] != "none"]
    assert len(dist) >= 50 and len(CORPUS) - len(dist) >= 15
    for p in CORPUS:
        head, body = _read(p)
        assert head.get("source") and body, p.name


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_field_log(path: Path) -> None:
    head, body = _read(path)
    exp, ids = _expected(head)
    got = diagnose(body)
    assert sorted(d.pattern.key for d in got) == sorted(exp), [d.line for d in got]
    assert finding_ids(got) == ids


def test_share_named_correctly(capsys: pytest.CaptureFixture[str]) -> None:
    ok = dist = quiet = quiet_ok = 0
    for p in CORPUS:
        head, body = _read(p)
        exp, _ = _expected(head)
        got = sorted(d.pattern.key for d in diagnose(body))
        if exp:
            dist += 1
            ok += got == sorted(exp)
        else:
            quiet += 1
            quiet_ok += not got
    with capsys.disabled():
        print(f"\nfield corpus: {ok}/{dist} distributed logs named correctly ({100 * ok // dist}%), "
              f"{quiet_ok}/{quiet} non-distributed logs name nothing")
    assert ok == dist and quiet_ok == quiet


def test_every_pattern_is_tested_on_two_wordings() -> None:
    seen: dict[str, set[str]] = {}
    for p in [*CORPUS, *LOGS.glob("*.log")]:
        body = _read(p)[1]
        for d in diagnose(body):
            seen.setdefault(d.pattern.key, set()).add(d.line)
    for pat in PATTERNS:
        if pat.scope == "all":
            assert len(seen.get(pat.key, ())) >= 2, pat.key


#: rows whose example line is a bare symptom any program prints: named only next to a distributed line
BARE_BY_DESIGN = ("connect-failed",)


def test_every_example_line_names_its_pattern() -> None:
    for pat in PATTERNS:
        extra = ["NCCL INFO Using network Socket"] if pat.also else []  # the fall-back line it needs
        got = [d.pattern.key for d in diagnose([pat.example, *extra], scope=pat.scope)]
        if pat.key in BARE_BY_DESIGN:  # a bare refusal is named only with a distributed line next to it
            assert got == [], (pat.key, got)
            got = [d.pattern.key for d in diagnose(["[c10d] ProcessGroupGloo", pat.example])]
        assert pat.key in got, (pat.key, got)  # the README's example line, pasted alone


def test_bare_symptoms_name_nothing_without_a_distributed_context() -> None:
    for line in ("ConnectionResetError: [Errno 104] Connection reset by peer", "curl: (6) host not found",
                 "ssh: connect to host x port 22: Connection timed out", "Name or service not known"):
        assert diagnose([line]) == [], line


def test_ansi_prefixes_and_details() -> None:
    d = diagnose(["\x1b[31m[rank3]:[W socket.cpp:1] [c10d] The client socket has failed to connect to any network "
                  "address of (node1, 29400). x\x1b[0m"])
    assert [x.pattern.key for x in d] == ["master-unreachable"] and d[0].detail == ("node1", "29400")
    d = diagnose(["socketStartConnect: Connect to 10.0.0.2<44801> failed : Connection refused"])
    assert d[0].detail == ("10.0.0.2", "44801", "Connection refused")
    d = diagnose(["Timed out after 901 seconds waiting for clients. 2/4 clients joined."])
    assert d[0].detail == ("901", "2", "4")


def test_ib_no_device_alone_is_not_a_fallback() -> None:
    assert diagnose(["NCCL INFO NET/IB : No device found."]) == []


def test_cli_several_files_stdin_and_bytes(tmp_path: Path) -> None:
    a, b = FIELD / "store-clients-901s-2of4.log", FIELD / "nccl-connect-abort.log"
    r = CliRunner().invoke(cli, ["explain", str(a), str(b), "--format", "json"])
    assert r.exit_code == 0, r.output
    import json
    keys = [f["key"] for f in json.loads(r.stdout)["failures"]]
    assert keys == ["store-clients-missing", "nccl-socket-connect"]
    raw = tmp_path / "bytes.log"
    raw.write_bytes(b"\xff\xfe garbage \x80\n" + b.read_bytes())
    r = CliRunner().invoke(cli, ["explain", "-"], input=raw.read_bytes())
    assert r.exit_code == 0 and "nccl-socket-connect" in r.output, r.output


def test_several_mb_are_read_without_backtracking_blowup() -> None:
    """A guard against catastrophic backtracking, not a benchmark: the bounds are ten times what an idle machine
    takes (~0.3 s and ~0.6 s), so a loaded CI machine passes and a quadratic pattern still fails."""
    noise = [f"[rank{i % 8}]: step {i} loss 2.{i % 97:02d} lr 3e-4 tokens/s 81234" for i in range(120_000)]
    lines = [*noise, "[rank3]: torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
             "2/4 clients joined.", *noise]
    assert sum(map(len, lines)) > 8_000_000
    t = time.perf_counter()
    got = diagnose(lines)
    assert time.perf_counter() - t < 10.0
    assert [d.pattern.key for d in got] == ["store-clients-missing"]
    # the whole command on stdin, an NCCL_DEBUG=INFO log: one line in ten an NCCL INFO line holding an anchor
    busy = "\n".join(f"node1:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> {ln}" if i % 10 == 0 else ln
                     for i, ln in enumerate(lines))
    t = time.perf_counter()
    r = CliRunner().invoke(cli, ["explain", "-"], input=busy.encode())
    assert time.perf_counter() - t < 20.0 and "store-clients-missing" in r.output, r.output


def test_docs_state_the_share() -> None:
    dist = [p for p in CORPUS if _read(p)[0]["expect"] != "none"]
    text = (ROOT / "docs" / "explain.md").read_text()  # the explain section, moved from the README
    assert f"{len(dist)}/{len(dist)} field logs named correctly" in text
    assert f"{len(CORPUS) - len(dist)}/{len(CORPUS) - len(dist)} non-distributed logs name nothing" in text


def test_verify_cause_comes_from_the_table() -> None:
    from ddpfix.diagnose.match import cause_line
    from ddpfix.verify.torch import likely_cause

    # verify's own launch output is distributed by construction: a bare refusal is named without context
    assert firewall_rules.MASTER_PORT_BLOCKED.id in likely_cause("RuntimeError: Connection refused", [])
    assert likely_cause("x", [netif_rules.MISSING.id]) == f"audit findings here: {netif_rules.MISSING.id}"
    assert likely_cause("x", []) == "unknown: see the error text"
    both = "ModuleNotFoundError: No module named 'torch'\nRuntimeError: Connection refused"
    assert cause_line(both).startswith("ddp_python on this node cannot run torch")
    c = likely_cause("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 2/4 "
                     "clients joined.", [env_rules.INCONSISTENT.id])
    assert "k/n joined" in c and c.endswith(f"; audit findings here: {env_rules.INCONSISTENT.id}")
    assert netif_rules.MISSING.id in likely_cause("RuntimeError: No such device", [])
    # verify-only rows are not named in a user's log
    assert diagnose(["ModuleNotFoundError: No module named 'torch'"]) == []


def _cluster() -> object:
    from ddpfix.model.cluster import Cluster, Node

    nodes = (Node("node1", "10.0.0.1", 0, socket_ifname="ens5"), Node("node2", "10.0.0.2", 1, socket_ifname="ens5"))
    return Cluster(nodes=nodes, master="node1", master_port=29500, nproc_per_node=2)


def test_against_inventory_names_what_the_log_contradicts() -> None:
    from ddpfix.diagnose.match import against_inventory, log_facts

    lines = ["[rank5]: torch.distributed.DistNetworkError: The client socket has failed to connect to any network "
             "address of (172.17.0.1, 29500). x",
             "node2:1:1 [0] NCCL INFO NET/Socket : Using [0]docker0:172.17.0.1<0>",
             "socketStartConnect: Connect to 172.17.0.1<44801> failed : Connection refused",
             "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 2/8 clients joined.",
             "NCCL version 2.21.5+cuda12.4"]
    ds = diagnose(lines)
    facts = log_facts(lines)
    assert facts.ranks == (5,) and facts.nccl_versions == ("2.21.5",)
    whole = against_inventory(ds, facts, _cluster())
    notes = {d.pattern.key: d.notes for d in ds}
    assert "the inventory's master is node1 at 10.0.0.1:29500" in notes["master-unreachable"][0]
    assert notes["nccl-virtual-interface"] == ["interface docker0 is not the inventory's (ens5)"]
    assert "172.17.0.1 is no node's cluster address" in notes["nccl-socket-connect"][0]
    assert "waited for 8 clients; the inventory's world size is 4" in notes["store-clients-missing"][0]
    assert whole and "rank 5 in the log is beyond the inventory's world size 4" in whole[0]


def test_against_inventory_is_quiet_when_the_log_agrees() -> None:
    from ddpfix.diagnose.match import against_inventory, log_facts

    lines = ["[rank3]: The client socket has failed to connect to any network address of (node1, 29500). x",
             "Timed out after 901 seconds waiting for clients. 2/4 clients joined."]
    ds = diagnose(lines)
    assert against_inventory(ds, log_facts(lines), _cluster()) == [] and all(not d.notes for d in ds)


def test_cli_with_inventory_prints_the_contradictions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import json
    from types import SimpleNamespace

    import ddpfix.cli.common
    import ddpfix.pipeline

    monkeypatch.setattr(ddpfix.cli.common, "cluster_of", lambda app: _cluster())
    monkeypatch.setattr(ddpfix.pipeline, "audit", lambda *a, **k: SimpleNamespace(findings=[]))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    log = "[rank3]: The client socket has failed to connect to any network address of (10.9.9.9, 29500). x\n"
    r = CliRunner().invoke(cli, ["-i", str(inv), "explain", "-", "--format", "json"], input=log)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert "the log dials 10.9.9.9:29500" in doc["failures"][0]["inventory"][0] and doc["log"]["ranks"] == [3]
    r = CliRunner().invoke(cli, ["-i", str(inv), "explain", "-"], input=log)
    assert "against the inventory: the log dials 10.9.9.9:29500" in r.output, r.output


def test_each_regex_match_holds_one_of_its_anchors() -> None:
    # the prefilter skips a regex on a line without its anchors: every line any regex matches must hold one
    from ddpfix.diagnose.match import ANCHORS, regex_anchors

    lines = [ln for p in [*CORPUS, *LOGS.glob("*.log")] for ln in _read(p)[1]] + [p.example for p in PATTERNS]
    for pat in PATTERNS:
        for rx in pat.compiled():
            need = regex_anchors(rx.pattern)
            for ln in lines:
                if rx.search(ln):
                    assert any(a in ln for a in ANCHORS), (pat.key, ln)
                    assert not need or any(a in ln for a in need), (pat.key, rx.pattern, ln)


def test_cli_says_when_no_host_check_applies() -> None:
    r = CliRunner().invoke(cli, ["explain", str(FIELD / "watchdog-later-allgather.log")])
    assert r.exit_code == 0 and "collective-timeout-later" in r.output
    assert "checked by: no host check (not the network" in r.output and "run: ddpfix audit" not in r.output


def test_store_based_barrier_counts_name_missing_ranks_or_a_shared_store() -> None:
    line = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 1, for key: "
            "store_based_barrier_key:1 (world_size={w}, worker_count={j}, timeout=0:30:00)")
    assert [d.pattern.key for d in diagnose([line.format(w=8, j=3)])] == ["store-clients-missing"]
    assert [d.pattern.key for d in diagnose([line.format(w=4, j=31)])] == ["store-shared"]
    assert diagnose([line.format(w=4, j=4)]) == []  # neither: a count that agrees names nothing
    from ddpfix.diagnose.match import against_inventory, log_facts

    lines = [line.format(w=8, j=3)]
    ds = diagnose(lines)
    against_inventory(ds, log_facts(lines), _cluster())
    assert "waited for 8 clients; the inventory's world size is 4" in ds[0].notes[0]
    lines = [line.format(w=8, j=16)]  # another world size than the inventory's, whatever joined
    ds = diagnose(lines)
    against_inventory(ds, log_facts(lines), _cluster())
    assert [d.pattern.key for d in ds] == ["store-shared"] and "world size is 4" in ds[0].notes[0]


def test_open_files_is_named_unless_a_download_or_web_server_line_is_near() -> None:
    bare = "OSError: [Errno 24] Too many open files"
    assert [d.pattern.key for d in diagnose([bare])] == ["open-files-exhausted"]
    pip = '  File "/usr/lib/python3/dist-packages/pip/_internal/operations/install/wheel.py", line 620, in _install'
    web = 'INFO:     10.1.4.7:51234 - "GET /v1/models HTTP/1.1" 200 OK'
    for near in (pip, web):
        assert diagnose([near, bare]) == [], near
    # verify's own launch output is a training process by construction
    assert host_rules.NOFILE_LOW.id in diagnose([web, bare], scope="verify")[0].pattern.finding_ids


def test_generic_nccl_errors_yield_to_a_named_cause() -> None:
    sys_err = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled "
               "system error, NCCL version 2.14.3")
    shm = "misc/shmutils.cc:38 NCCL WARN Error: failed to extend /dev/shm/nccl-IjJ0gS to 9637892 bytes"
    assert [d.pattern.key for d in diagnose([sys_err])] == ["nccl-system-error"]
    assert [d.pattern.key for d in diagnose([shm, sys_err])] == ["shm-exhausted"]
    remote = "NCCL error: remote process exited or there was a network error, NCCL version 2.20.5"
    reset = "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer"
    assert [d.pattern.key for d in diagnose([remote, reset])] == ["nccl-remote-error"]
