"""Log text and node output are hostile input: long lines, adversarial repetitions, terminal control sequences,
malformed result lines and input past the caps. explain and verify stay linear in time, show no control
character raw, report what they cut, and name a malformed node line as that node's error."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from unit_helpers import ROOT

from ddpfix.cli import cli
from ddpfix.cli.explain import read_logs
from ddpfix.diagnose.bounded import MAX_LINE, cap_text, for_matching, shown, then
from ddpfix.diagnose.match import diagnose
from ddpfix.diagnose.patterns import PATTERNS
from ddpfix.rules import firewall as firewall_rules
from ddpfix.verify.nccl import nccl_entry
from ddpfix.verify.torch import torch_entry

#: the plain-text pieces of a regex: what an adversarial line repeats to make a backtracking regex retry
_META = re.compile(r"\\[dswDSWbB]|\\.|\[(?:\\.|[^\]])*\]|\(\?[:!=P<>]*(?:<\w+>)?|\{\d*,?\d*\}|[()?*+|^$.]")
_CLOSED = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _pieces(rx: str) -> list[str]:
    return [p for p in _META.split(rx) if len(p) >= 2] or [rx[:8]]


def _adversarial(rx: str, n: int) -> list[str]:
    out = []
    pieces = _pieces(rx)
    for p in pieces:
        out += [p * (n // len(p)), (p + " ") * (n // (len(p) + 1)), p + "a" * n, p + "1" * n, p + " " * n,
                p + "(" * n, (p + "a" * 40) * (n // (len(p) + 40))]
    both = "".join(pieces)
    out += [both * (n // len(both)), " ".join(pieces) * (n // (len(both) + len(pieces)))]
    return out


def _slowest(rx: re.Pattern[str]) -> float:
    """The longest one search of `rx` takes on its adversarial lines of 100 000 characters (a linear regex:
    milliseconds; a quadratic one: seconds to hours)."""
    worst = 0.0
    for line in _adversarial(rx.pattern, 100_000):
        t = time.perf_counter()
        rx.search(line)
        worst = max(worst, time.perf_counter() - t)
    return worst


@pytest.mark.parametrize("pat", PATTERNS, ids=[p.key for p in PATTERNS])
def test_every_pattern_runs_in_linear_time_on_long_adversarial_lines(pat) -> None:  # type: ignore[no-untyped-def]
    """100 000 characters, uncut: a linear regex takes milliseconds, a quadratic one (`getaddrinfo.*failed` on a
    line repeating `getaddrinfo`) ~10^10 steps. The bound (0.5 s for one search) is generous for a loaded CI
    machine."""
    for rx in pat.compiled():
        took = _slowest(rx)
        assert took < 0.5, (pat.key, rx.pattern, round(took, 2))


def test_then_matches_what_dot_star_matches() -> None:
    rx = re.compile(then("getaddrinfo", "failed"))
    for line, want in (("getaddrinfo() failed", True), ("x getaddrinfo: a getaddrinfo b failed", True),
                       ("failed getaddrinfo", False), ("getaddrinfo" * 5000, False), ("", False)):
        assert bool(rx.search(line)) == bool(re.search("getaddrinfo.*failed", line)) == want, line[:40]


def test_a_5_mb_one_line_log_ends_in_under_10_s() -> None:
    hostile = ("getaddrinfo connectFullMesh failed NET/IB : ibv_ibv_ trying to connect to (" * 70_000)[:5_000_000]
    t = time.perf_counter()
    r = CliRunner().invoke(cli, ["explain", "-"], input=hostile.encode())
    took = time.perf_counter() - t
    assert r.exit_code == 0, r.output
    assert took < 10.0, took
    assert f"1 line is longer than {MAX_LINE} characters" in r.output, r.output
    # many long lines, each adversarial, and the failure after them
    lines = [hostile[:20_000]] * 250 + ["[rank3]: torch.distributed.DistStoreError: Timed out after 901 seconds "
                                       "waiting for clients. 2/4 clients joined."]
    t = time.perf_counter()
    got = diagnose(lines)
    assert time.perf_counter() - t < 10.0 and "store-clients-missing" in [d.pattern.key for d in got]


def test_input_beyond_the_cap_is_reported_not_dropped_in_silence() -> None:
    log = b"[rank3]: The client socket has failed to connect to any network address of (node1, 29500). x\n"
    lines, cuts = read_logs((io.BytesIO(log), io.BytesIO(b"more\n" * 100)), cap=len(log) + 10)
    assert diagnose(lines)[0].pattern.key == "master-unreachable"
    assert len(cuts) == 1 and "cap" in cuts[0] and "not matched" in cuts[0], cuts
    lines, cuts = read_logs((io.BytesIO(log),), cap=len(log))  # exactly the cap: nothing beyond it
    assert cuts == [] and len(lines) == 1
    assert read_logs((io.BytesIO(b"x" * (MAX_LINE + 1)),))[1] == [
        f"1 line is longer than {MAX_LINE} characters: only the first {MAX_LINE} of each were matched"]


def test_over_cap_input_is_named_in_the_cli_output(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpfix.cli.explain as explain_cli

    real = explain_cli.read_logs
    monkeypatch.setattr(explain_cli, "read_logs", lambda streams: real(streams, cap=1024))
    r = CliRunner().invoke(cli, ["explain", "-"], input=b"x\n" * 2000)
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "input: the log (stdin and what follows it) is longer than the 1 KiB cap: the rest " \
        "was not matched" in said, said
    r = CliRunner().invoke(cli, ["explain", "-", "--format", "json"], input=b"x\n" * 2000)
    assert "1 KiB cap" in json.loads(r.stdout)["input"][0]


HOSTILE = [
    "\x1b]52;c;cm0gLXJmIH4K\x07[rank1]: RuntimeError: Connection refused while talking to TCPStore",  # OSC 52 clipboard
    "\x1b]0;pwned title\x1b\\ more",  # OSC window title, ST-terminated
    "\x1bP+q544e\x1b\\ DCS request",  # DCS
    "\x9b31m C1 CSI colour \x9b2J clear screen",  # C1 CSI
    "\x9d0;c1 title\x9c after",  # C1 OSC
    "evil \u202egnp.exe\u202c bidi override, bell \x07, backspace \x08\x08",
]


def test_shown_text_escapes_every_control_character() -> None:
    for line in HOSTILE:
        out = shown(line)
        assert not _CLOSED.search(out), repr(out)
    assert shown("\x1b[31mred\x1b[0m") == "red"  # colour codes are dropped, not escaped
    assert shown(HOSTILE[0]).startswith("\\x1b]52;c;cm0gLXJmIH4K\\x07[rank1]")


def test_control_sequences_neither_reach_the_terminal_nor_hide_a_failure() -> None:
    log = "\n".join([*HOSTILE, "\x1b]2;x\x07[rank3]: The client socket has failed to connect to any network address "
                     "of (node1\x9b1m, 29500). x"])
    assert for_matching(["\x1b]2;t\x07a\x9b1mb\x1bPq\x1b\\c"]) == ["abc"]
    r = CliRunner().invoke(cli, ["explain", "-"], input=log.encode())
    assert r.exit_code == 0 and "master-unreachable" in r.output, r.output
    assert not _CLOSED.search(r.output), repr(r.output)
    assert "line 1, and 1 more line: \\x1b]52;c;cm0gLXJmIH4K\\x07[rank1]" in r.output, r.output
    r = CliRunner().invoke(cli, ["explain", "-", "--format", "json"], input=log.encode())
    assert not _CLOSED.search(r.stdout)


MALFORMED = ["DDPFIX_RESULT ", "DDPFIX_RESULT {", "DDPFIX_RESULT [1, 2]", 'DDPFIX_RESULT {"ok": "yes"}',
             'DDPFIX_RESULT {"ok": true, "rank": "0"}', "DDPFIX_RESULT " + "[" * 100_000,
             'DDPFIX_RESULT {"ok": true, "seconds": NaN}', "DDPFIX_RESULT\x1b]52;c;x\x07"]


@pytest.mark.parametrize("line", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_torch_result_line_is_the_nodes_error(line: str) -> None:
    e = torch_entry("node1", {"rc": 0, "stdout": line + "\n", "stderr": ""})
    assert not e["ok"] and e["error"].startswith("malformed DDPFIX_RESULT line from the node ("), e
    assert not _CLOSED.search(e["error"])


@pytest.mark.parametrize("line", ['DDPFIX_NCCL_RESULT {"ok": true, "sweep": [{"size": "8M", "seconds": 1}]}',
                                  'DDPFIX_NCCL_RESULT {"ok": true, "sweep": [{"size": 8}]}',
                                  'DDPFIX_NCCL_RESULT {"ok": true, "sweep": {"size": 8}}',
                                  'DDPFIX_NCCL_RESULT {"ok": true, "world_size": 1e400}',
                                  'DDPFIX_NCCL_RESULT {"ok": true, "sweep": [7]}', "DDPFIX_NCCL_RESULT nope"])
def test_a_malformed_nccl_result_line_is_the_nodes_error(line: str) -> None:
    e = nccl_entry("node1", {"rc": 0, "stdout": line + "\n", "stderr": ""}, False, None)
    assert not e["ok"] and "malformed DDPFIX_NCCL_RESULT line from the node (" in e["error"], e


def test_node_output_is_capped_before_matching_and_the_cut_reported() -> None:
    huge = "getaddrinfo " * 400_000 + "\n"  # 4.8 MB, one line
    t = time.perf_counter()
    e = torch_entry("node1", {"rc": 1, "stdout": huge, "stderr": huge + "RuntimeError: Connection refused\n"})
    assert time.perf_counter() - t < 10.0
    assert not e["ok"] and len(e["output_cut"]) == 2 and "1 MiB cap" in e["output_cut"][0], e
    assert cap_text("é" * 10, 6).dropped == 14 and cap_text("ok", 5).dropped == 0
    kept = cap_text("FIRST " + "x" * 5000 + " LAST", 1024)
    assert kept.text.startswith("FIRST ") and kept.text.endswith(" LAST") and "bytes cut here" in kept.text
    # the refusal at the very end of 4.8 MB is kept (the output's last half) and matched
    assert e["error"] == "RuntimeError: Connection refused" and firewall_rules.MASTER_PORT_BLOCKED.id in e["cause"]
    good = 'DDPFIX_RESULT {"rank": 0, "world_size": 2, "sum": 3.0, "expected": 3.0, "ok": true, "hostname": "n", ' \
           '"seconds": 1.5}\n'
    assert torch_entry("node1", {"rc": 0, "stdout": good, "stderr": ""})["ok"]


def _event_and_host_regexes() -> list[re.Pattern[str]]:
    from ddpfix.diagnose import events, hosts, narrow

    out = [rx for _, rx in events.LAYERS] + [events.USER_FAILURE, events.KILLED, events.CONSEQUENCE, events._RANK,
                                             events._NODE, events._ERRNO, events._PEER, events._ERRNO_TEXT]
    out += [*hosts.VERSION_RX.values(), hosts._USING, hosts._ONE, hosts._STORE, hosts._WHO, hosts._RANK]
    return out + [rx for rx, _, _ in narrow._IB] + [narrow._TO_STORE, narrow._ABORT]


def test_event_and_host_regexes_run_in_linear_time_on_long_adversarial_lines() -> None:
    for rx in _event_and_host_regexes():
        took = _slowest(rx)
        assert took < 0.5, (rx.pattern[:80], round(took, 2))


def test_every_job_failure_line_holds_a_job_anchor() -> None:
    from ddpfix.diagnose.events import JOB_ANCHORS, is_job_failure

    lines = ["torch.OutOfMemoryError: CUDA out of memory.", "HIP out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
             "KeyError: 'x'", "CUDA error: device-side assert triggered", "mat1 and mat2 shapes cannot be multiplied",
             "size mismatch for fc.weight", "Error(s) in loading state_dict", "Loss is NaN", "exitcode  : -9",
             "Signal 9 (SIGKILL) received by PID 1", "Out of memory: Killed process 1 (python)", "oom-kill:constraint",
             "SyntaxError: invalid syntax", "json.decoder.JSONDecodeError: Expecting value"]
    for line in lines:
        assert is_job_failure(line) and any(a in line for a in JOB_ANCHORS), line


@pytest.mark.parametrize("script,prefix", [("ddpfix_allreduce.py", "DDPFIX_RESULT "),
                                           ("ddpfix_nccl_sweep.py", "DDPFIX_NCCL_RESULT ")])
def test_ranks_sharing_a_nodes_stdout_under_python_u_keep_their_result_lines_whole(tmp_path, script: str,
                                                                                   prefix: str) -> None:
    """torchrun starts its workers with `python -u`: two ranks of one node writing result lines to the same pipe at
    once must never join them (print() there writes the text and its newline apart; the CI run of 5b8c42a read
    `{...}DDPFIX_RESULT {...}` as one line)."""
    for mod in ("torch/__init__.py", "torch/distributed/__init__.py"):  # the scripts import torch at the top
        (tmp_path / mod).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / mod).write_text("")
    path = ROOT / "roles" / "ddpfix_verify" / "files" / script
    code = ("import importlib.util, sys; sys.path.insert(0, sys.argv[1]);"
            "s = importlib.util.spec_from_file_location('s', sys.argv[2]); m = importlib.util.module_from_spec(s);"
            "s.loader.exec_module(m); [m.emit({'rank': int(sys.argv[3]), 'i': i, 'pad': 'x' * 200}) for i in range(3000)]")
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-u", "-c", code, str(tmp_path), str(path), str(rank)], stdout=write)
             for rank in (0, 1)]
    os.close(write)
    with os.fdopen(read) as out:
        lines = out.read().splitlines()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    results = [json.loads(ln.removeprefix(prefix)) for ln in lines if ln.startswith(prefix) and ln.count(prefix) == 1]
    assert len(results) == len(lines) == 6000, [ln for ln in lines if ln.count(prefix) != 1][:2]
