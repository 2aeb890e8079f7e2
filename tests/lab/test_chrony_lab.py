"""A fix must reach the file the service reads (issue 8, item 8), on real lab hosts.

chronyd on node3 reads a configuration that names no drop-in directory: a hand-written /etc/chrony/chrony.conf, or
RHEL's /etc/chrony.conf (`chronyd -f /etc/chrony.conf`, no /etc/chrony/). `remediate --apply` must leave time.*
fixed (exit 0), with one managed confdir line in that file and the file backed up; a second apply changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import ddpfix_json, sh_out

from ddpfix import lab
from ddpfix.cli import cli
from ddpfix.rules import time as time_rules

pytestmark = pytest.mark.lab

MARKER = "ddpfix managed block: read the ddpfix drop-in directory"


@pytest.mark.parametrize(("scenario", "conf", "dropin"), [
    ("chrony-no-confdir", "/etc/chrony/chrony.conf", "/etc/chrony/conf.d"),
    ("chrony-rhel-layout", "/etc/chrony.conf", "/etc/chrony.d"),
])
def test_chrony_fix_reaches_the_configuration_chronyd_reads(temp_lab: Any, scenario: str, conf: str, dropin: str) -> None:
    info = temp_lab(nodes=3, scenario=scenario)
    inv = str(info.inventory)
    code, before = ddpfix_json(inv, "audit")
    assert code == 1 and (time_rules.UNSYNCHRONIZED.id, "node3") in {(f["id"], f["host"]) for f in before["findings"]}
    original = sh_out(info, "node3", f"cat {conf}")

    code, doc = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0, (doc["remaining_fixable"], doc["failed_hosts"], doc["refused"], doc.get("not_effective"))
    assert not [f for f in doc["findings"] if f["id"].startswith("time.")], doc["findings"]
    assert lab.chrony_tracking(info.name, "node3")["leap_status"] == "Normal"

    text = sh_out(info, "node3", f"cat {conf}")
    assert text.startswith(original), text  # the user's lines are kept, in place
    added = text[len(original):]
    assert added == f"# BEGIN {MARKER}\nconfdir {dropin}\n# END {MARKER}\n", added
    backups = sh_out(info, "node3", f"ls {conf}.*~").split()
    assert len(backups) == 1 and sh_out(info, "node3", f"cat {backups[0]}") == original
    assert "server " in sh_out(info, "node3", f"cat {dropin}/ddpfix.conf")
    if scenario == "chrony-rhel-layout":
        assert sh_out(info, "node3", "test -e /etc/chrony && echo yes || echo no").strip() == "no"

    code, again = ddpfix_json(inv, "remediate", "--apply")
    assert code == 0 and again["changed"] == {n.name: 0 for n in info.nodes}, again["changes"]
    assert sh_out(info, "node3", f"cat {conf}") == text


def test_invalid_chrony_configuration_is_not_written_and_chronyd_keeps_running(temp_lab: Any) -> None:
    info = temp_lab(nodes=3, scenario="chrony-no-confdir")
    inv = str(info.inventory)
    conf = "/etc/chrony/chrony.conf"
    sh_out(info, "node3", f"echo 'bogusdirective 1' >> {conf}")  # the user's file no longer parses
    original = sh_out(info, "node3", f"cat {conf}")
    pid = sh_out(info, "node3", "pgrep -o -x chronyd").strip()

    code, doc = ddpfix_json(inv, "remediate", "--apply")
    assert code == 1 and "node3" in doc["failed_hosts"], doc["failed_hosts"]
    assert "chronyd" in doc["failed_hosts"]["node3"] or "validat" in doc["failed_hosts"]["node3"], doc["failed_hosts"]
    assert sh_out(info, "node3", f"cat {conf}") == original  # not written
    assert sh_out(info, "node3", "pgrep -o -x chronyd").strip() == pid  # not restarted, still running


def test_fix_that_does_not_take_effect_is_reported(temp_lab: Any) -> None:
    """The user points ddpfix_chrony_conf_path at a file chronyd does not read: the re-audit still finds node3
    unsynchronised and remediate says the fix did not take effect (exit 1), instead of a silent 'remaining'."""
    import yaml

    info = temp_lab(nodes=3, scenario="chrony-rhel-layout")
    inv = str(info.inventory)
    sh_out(info, "node3", "printf '# not what chronyd reads\\nmakestep 1 3\\n' > /etc/chrony-unused.conf")
    doc = yaml.safe_load(info.inventory.read_text())
    doc["all"]["children"]["ddp_nodes"]["hosts"]["node3"]["ddpfix_chrony_conf_path"] = "/etc/chrony-unused.conf"
    info.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))

    r = CliRunner().invoke(cli, ["-i", inv, "remediate", "--apply", "-o", str(info.state_dir / "report.json")],
                           catch_exceptions=False)
    assert r.exit_code == 1, r.output
    report = json.loads((info.state_dir / "report.json").read_text())
    stuck = report["not_effective"]
    assert [(x["id"], x["host"]) for x in stuck] == [(time_rules.UNSYNCHRONIZED.id, "node3")], stuck
    assert "did not take effect" in stuck[0]["message"] and "ddpfix_chrony_conf_path" in stuck[0]["message"]
    assert "not fixed" in r.stderr and f"{time_rules.UNSYNCHRONIZED.id} on node3 is still open" in r.stderr
    assert "confdir /etc/chrony.d" in sh_out(info, "node3", "cat /etc/chrony-unused.conf")
