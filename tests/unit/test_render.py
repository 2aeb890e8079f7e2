"""Reports on a recorded multi-fault audit: root causes first, text/plain/JUnit/Prometheus/HTML outputs, --skip.

fixtures/reports/multi-fault.json is the real `ddpfix audit --format json` of a 3-node lab with the scenarios
firewalld-master, hostname-loopback, iptables-worker2 and env-wrong (`ddpfix lab up --scenario ...`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from ddpfix.causes import attribute_causes
from ddpfix.render import render_html, render_junit, render_plain, render_prometheus, render_text
from ddpfix.rules import env as env_rules
from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import time as time_rules
from ddpfix.rules.registry import finding

DOC: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "fixtures" / "reports" / "multi-fault.json").read_text())


def test_probe_failures_are_grouped_under_the_firewall_that_causes_them() -> None:
    by_key = {(f["id"], f["host"]): f for f in DOC["findings"]}
    assert by_key[(probes_rules.MASTER_PORT_UNREACHABLE.id, "node2")]["caused_by"] == f"{firewall_rules.MASTER_PORT_BLOCKED.id}@node1"
    peer = [f for f in DOC["findings"] if f["id"] == probes_rules.PEER_UNREACHABLE.id]
    assert peer and all(f["caused_by"] in (f"{firewall_rules.PEER_PORTS_BLOCKED.id}@node1", f"{firewall_rules.PEER_PORTS_BLOCKED.id}@node2")
                        for f in peer)
    assert by_key[(firewall_rules.PEER_PORTS_BLOCKED.id, "node2")]["caused_by"] is None
    assert by_key[(env_rules.INCONSISTENT.id, "node3")]["caused_by"] == f"{env_rules.INCONSISTENT.id}@cluster"


def test_unexplained_probe_failure_stays_a_cause() -> None:
    fl = [finding(probes_rules.PEER_UNREACHABLE.id, "node1", "TCP connect to peer node2 failed", "timed out", target="node2"),
          finding(probes_rules.PEER_UNREACHABLE.id, "node3", "TCP connect to peer node1 failed", "timed out", target="node1"),
          finding(firewall_rules.PEER_PORTS_BLOCKED.id, "node1", "blocked", "rule", cidr="10.0.0.0/24", range="1-2")]
    out = {(f.host, f.id): f.caused_by for f in attribute_causes(fl, "node1")}
    assert out[("node1", probes_rules.PEER_UNREACHABLE.id)] is None  # node2's firewall is fine: outside the hosts
    assert out[("node3", probes_rules.PEER_UNREACHABLE.id)] == f"{firewall_rules.PEER_PORTS_BLOCKED.id}@node1"


def test_peer_rows_on_one_node_are_one_cause() -> None:
    fl = [finding(hosts_rules.PEER_UNRESOLVABLE.id, "node2", f"peer {p} does not resolve", "no address", target=p)
          for p in ("node1", "node3", "node4")]
    out = attribute_causes(fl, "node1")
    assert [f.caused_by for f in out] == [None, f"{hosts_rules.PEER_UNRESOLVABLE.id}@node2", f"{hosts_rules.PEER_UNRESOLVABLE.id}@node2"]


def test_text_is_grouped_by_host_causes_first_summary_and_exit_line() -> None:
    text = render_text(DOC, width=80, exit_line="exit 1: 18 findings at or above warning")
    lines = text.splitlines()
    assert lines[0].startswith("ddpfix audit: 3 hosts, 3 reachable; 18 errors") and "root causes" in lines[0]
    assert lines[-1] == "exit 1: 18 findings at or above warning"
    assert all(len(ln) <= 80 for ln in lines), max(lines, key=len)
    assert lines.index("cluster") < next(i for i, ln in enumerate(lines) if ln.startswith("node1"))
    # consequences appear only under "explains", never as lines of their own
    assert not any(ln.lstrip().startswith("ERROR   probe.") for ln in lines)
    assert f"explains: {probes_rules.MASTER_PORT_UNREACHABLE.id} on node2, node3" in " ".join(ln.strip() for ln in lines)
    assert "│" not in text and "None" not in text


def test_fix_texts_carry_real_values_and_the_inventory() -> None:
    for f in DOC["findings"]:
        assert not re.search(r"\b(IF|NAME|INVENTORY|INV)\b|=N\b|None|droped", f["fix"] + f["message"]), f
    assert any("ddpfix env -i /tmp/rpt-inv --apply" in f["fix"] for f in DOC["findings"])


def test_plain_one_line_per_finding() -> None:
    lines = render_plain(DOC).splitlines()
    assert len(lines) == len(DOC["findings"])
    assert f"error {firewall_rules.MASTER_PORT_BLOCKED.id} node1 TCP" in lines[next(i for i, ln in enumerate(lines)
                                                                        if "master-port-blocked" in ln)]


def test_junit_parses_and_counts() -> None:
    root = ET.fromstring(render_junit(DOC))
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("tests", "0")) == len(cases) and int(suite.get("failures", "0")) == len(failed)
    keys = {(c.get("classname"), c.get("name")) for c in failed}
    assert (firewall_rules.PEER_PORTS_BLOCKED.id, "node2") in keys and (env_rules.INCONSISTENT.id, "cluster") in keys
    f = next(c for c in failed if c.get("classname") == hosts_rules.HOSTNAME_LOOPBACK.id).find("failure")
    assert f is not None and "evidence: /etc/hosts: 127.0.1.1" in (f.text or "")


def test_prometheus_textfile_parses() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(render_prometheus(DOC))}
    samples = fams["ddpfix_finding"].samples
    assert {(s.labels["id"], s.labels["host"], s.labels["severity"]) for s in samples} >= {
        (firewall_rules.MASTER_PORT_BLOCKED.id, "node1", "error"), (env_rules.INCONSISTENT.id, "cluster", "error")}
    assert sum(s.value for s in samples) == len(DOC["findings"])  # a count per (id, host, severity): none collapse
    assert all(s.labels["command"] == "audit" for s in samples)
    assert fams["ddpfix_hosts_unreachable"].samples[0].value == 0
    assert fams["ddpfix_audit_timestamp_seconds"].samples[0].value == DOC["generated_at_unix"]


def test_skipped_findings_are_reported_not_hidden() -> None:
    doc = dict(DOC, skipped=[{"id": time_rules.SKEW.id, "host": None, "message": "clocks differ by 2.00s",
                              "severity": "warning"}])
    assert f"skipped (accepted): {time_rules.SKEW.id} on cluster" in render_text(doc, width=100)
    assert f"skipped {time_rules.SKEW.id} cluster" in render_plain(doc)


def test_html_is_self_contained() -> None:
    html = render_html(DOC)
    assert not re.search(r"(src|href)=\"(https?:)?//", html) and "<script" not in html
    assert 'data-row="node3" data-col="node2" data-state="refused"' in html


def test_html_shows_how_each_cause_reads_in_a_job_log() -> None:
    # from explain's one pattern table: a peer firewall shows as Gloo/NCCL peer connect failures
    from ddpfix.diagnose.match import symptoms

    html = render_html(DOC)
    ids = {f["id"] for f in DOC["findings"] if not f.get("caused_by")}
    assert firewall_rules.PEER_PORTS_BLOCKED.id in ids
    for p in symptoms(firewall_rules.PEER_PORTS_BLOCKED.id):
        assert f"<code>{p.key}</code>" in html
    assert "in a job&#39;s log (ddpfix explain)" in html or "in a job's log (ddpfix explain)" in html


@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed (scripts/apt-deps.sh)")
def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(DOC))
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    cells = {(m[0], m[1]): m[2] for m in re.findall(
        r'data-row="([^"]+)" data-col="([^"]+)" data-state="([^"]+)"', dom)}
    assert cells[("node3", "node2")] == "refused" and cells[("node2", "node3")] == "ok"
    assert cells[("node1", "node1")] == "self"
    assert "Root causes" in dom and firewall_rules.MASTER_PORT_BLOCKED.id in dom
    shot = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1100,900", page.as_uri()], capture_output=True,
                   timeout=120)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
