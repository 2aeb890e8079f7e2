"""The playbooks stand alone: `ansible-playbook` finds what `ddpfix audit` finds, on one lab.

One 3-node lab (module scope) with two faults: node2 and node3 put their hostname on 127.0.1.1
(hosts_rules.HOSTNAME_LOOPBACK) and node3's iptables rejects TCP to its ephemeral range (firewall_rules.PEER_PORTS_BLOCKED,
probes_rules.PEER_UNREACHABLE on the nodes that dial it). In order:

- `ddpfix audit -i INV --format json` and `ansible-playbook -i INV playbooks/audit.yml -e ddpfix_report=PATH`
  report the same findings (id, host, severity) in the same `ddpfix.report/v1` document;
- the sliced fact-cache pattern (AWX job slicing): two `--limit` slices of the facts play write a jsonfile fact
  cache, then the analysis alone (`-e ddpfix_collect=false`) reads it. Every finding from facts is the single
  run's. Probes need both ends at once: a slice dials only the nodes of that slice (never a listener of another
  slice, which is gone), so the probe findings over the cache are a subset of the single run's, never a false one;
- the same through the CLI (`ddpfix audit --limit BATCH --facts-out DIR` per batch, then `ddpfix audit
  --facts-in DIR --facts-in DIR2`, which contacts no node): the findings of the single run, probe ones a subset;
- `--only` with a detect-only id: the playbook refuses it as the CLI does (exit 2, the same words);
- `ansible-playbook playbooks/remediate.yml --check` plans and reports changes without the CLI
  (`-e ddpfix_only=hosts_rules.HOSTNAME_LOOPBACK`), on the hosts `ddpfix remediate --only` (dry run) changes, and without --check (`--tags hosts_rules.HOSTNAME_LOOPBACK`) fixes the
  hostname fault and nothing else (the re-audit no longer reports it); last, as it changes the lab.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import ansible_playbook, playbook_env

from ddpfix.rules import firewall as firewall_rules
from ddpfix.rules import hosts as hosts_rules
from ddpfix.rules import probes as probes_rules
from ddpfix.rules import time as time_rules

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
SCENARIO = "hostname-loopback,iptables-worker"
ONLY = hosts_rules.HOSTNAME_LOOPBACK.id



def keys(doc: dict[str, Any]) -> set[tuple[str, str | None, str]]:
    return {(f["id"], f["host"], f["severity"]) for f in doc["findings"]}


def probe_ids(ks: set[tuple[str, str | None, str]]) -> set[tuple[str, str | None, str]]:
    return {k for k in ks if k[0].startswith("probe.")}


@pytest.fixture(scope="module")
def lab_info(lab_factory):
    return lab_factory(nodes=3, scenario=SCENARIO)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("standalone")


@pytest.fixture(scope="module")
def cli_doc(lab_info, work: Path) -> dict[str, Any]:
    r = cli(lab_info.inventory, "audit", "--format", "json", tmp=work)
    assert r.returncode == 1, r.stderr[-3000:]
    return json.loads(r.stdout)


#: settings of a user's ansible.cfg that change what a play sees: the roles' defaults private to their roles
#: (private_role_vars), facts only under ansible_facts (inject_facts_as_vars off)
USER_CFG = {"ANSIBLE_PRIVATE_ROLE_VARS": "True", "ANSIBLE_INJECT_FACT_VARS": "False"}


def test_audit_playbook_reports_what_the_cli_reports(lab_info, work: Path, cli_doc: dict[str, Any]) -> None:
    report = work / "audit.json"
    r = ansible_playbook(PLAYBOOKS / "audit.yml", lab_info.inventory, "-e", f"ddpfix_report={report}", tmp=work,
                         **USER_CFG)
    assert r.returncode == 2, r.stdout[-4000:]  # the play fails: errors reach the default threshold (warning)
    assert "findings at or above warning" in r.stdout
    doc = json.loads(report.read_text())
    assert doc["schema"] == cli_doc["schema"] == "ddpfix.report/v1"
    assert keys(doc) == keys(cli_doc), (sorted(keys(doc)), sorted(keys(cli_doc)))
    assert {(hosts_rules.HOSTNAME_LOOPBACK.id, "node2", "error"), (hosts_rules.HOSTNAME_LOOPBACK.id, "node3", "error"),
            (firewall_rules.PEER_PORTS_BLOCKED.id, "node3", "error"), (probes_rules.PEER_UNREACHABLE.id, "node1", "error"),
            (probes_rules.PEER_UNREACHABLE.id, "node2", "error")} <= keys(doc)
    assert doc["hosts"] == cli_doc["hosts"]
    assert doc["summary"] == cli_doc["summary"]
    # the threshold (nothing fails at ddpfix_fail_on=none, the report is still written): the last test's re-audit


def test_sliced_fact_cache_gives_the_single_run_findings(lab_info, work: Path, cli_doc: dict[str, Any]) -> None:
    cache = work / "fact_cache"
    cached = {"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache)}
    for limit in ("node1,node2", "node3"):
        r = ansible_playbook(PLAYBOOKS / "audit.yml", lab_info.inventory, "--limit", limit, "-e", "ddpfix_analyze=false", tmp=work,
                     **cached)
        assert r.returncode == 0, r.stdout[-4000:]
        assert "Audit, analysis on the controller (ddpfix)" in r.stdout and "skipping: no hosts matched" in r.stdout
    report = work / "sliced.json"
    r = ansible_playbook(PLAYBOOKS / "audit.yml", lab_info.inventory, "-e", "ddpfix_collect=false", "-e", f"ddpfix_report={report}",
                 tmp=work, **cached)
    assert r.returncode == 2, r.stdout[-4000:]
    doc = json.loads(report.read_text())
    single = keys(cli_doc)
    sliced = keys(doc)
    # every finding from facts is the single run's
    assert sliced - probe_ids(sliced) == single - probe_ids(single), (sorted(sliced), sorted(single))
    # probes: only within a slice, never a false failure across slices
    assert probe_ids(sliced) <= probe_ids(single)
    assert doc["summary"]["reachable"] == 3
    # a node without facts in the cache is not read (never a pass): an empty cache reads nothing
    empty = {"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(work / "empty_cache")}
    r = ansible_playbook(PLAYBOOKS / "audit.yml", lab_info.inventory, "-e", "ddpfix_collect=false", "-e", f"ddpfix_report={report}",
                 "-e", "ddpfix_fail_on=none", tmp=work, **empty)
    assert r.returncode == 0, r.stdout[-4000:]
    doc = json.loads(report.read_text())
    assert doc["summary"]["reachable"] == 0
    assert all(h["error"] == "no facts in the fact cache" for h in doc["hosts"].values())


def test_cli_batches_saved_and_merged_give_the_single_run_findings(lab_info, work: Path,
                                                                   cli_doc: dict[str, Any]) -> None:
    dirs = []
    for i, limit in enumerate(("node1,node2", "node3")):
        out = work / f"facts-batch{i}"
        r = cli(lab_info.inventory, "audit", "--limit", limit, "--facts-out", str(out), "--fail-on", "none",
                "--format", "json", tmp=work)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["facts_out"]["hosts"] == len(limit.split(","))
        dirs += ["--facts-in", str(out)]
    # a file of a host the inventory does not name: ignored, with a note
    (work / "facts-batch1" / "node9.facts.json").write_text((work / "facts-batch1" / "node3.facts.json").read_text())
    r = cli(lab_info.inventory, "audit", *dirs, "--format", "json", tmp=work)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "node9.facts.json: ignored" in r.stderr
    # node3's batch did not hold the master: its master port was not dialled from there, and the merge says so
    assert "the master port was probed from 1 of the 2 other nodes read" in r.stderr
    doc = json.loads(r.stdout)
    single, merged = keys(cli_doc), keys(doc)
    assert merged - probe_ids(merged) == single - probe_ids(single), (sorted(merged), sorted(single))
    assert probe_ids(merged) <= probe_ids(single)  # probes within a batch only, never a false block across
    assert doc["summary"]["reachable"] == 3 and len(doc["facts_in"]["runs"]) == 2
    # past --facts-max-age: not read, never a pass
    time.sleep(1.1)
    r = cli(lab_info.inventory, "audit", *dirs, "--facts-max-age", "1", "--format", "json", "--fail-on", "none",
            tmp=work)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["summary"]["reachable"] == 0 and "--facts-max-age" in doc["hosts"]["node1"]["error"]


def cli(inventory: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from ddpfix.cli import main; main()", "-i", str(inventory), *args],
                          capture_output=True, text=True, timeout=300, env=playbook_env(tmp), check=False)


def recap_changed(stdout: str) -> set[str]:
    """The hosts the play changed (or, in check mode, would change), from its PLAY RECAP."""
    lines = stdout.split("PLAY RECAP")[-1].splitlines()
    return {ln.split()[0] for ln in lines if " changed=" in ln and " changed=0 " not in ln}


def test_remediate_playbook_plans_and_fixes_without_the_cli(lab_info, work: Path) -> None:
    # --only with an id remediate does not fix (detect-only): refused as `ddpfix remediate --only` refuses it, exit 2,
    # before any node is contacted (the playbook's plan task fails; -e ddpfix_collect=false: no facts play). The CLI's
    # side, and an unknown id on both, never reach a node: tests/unit/test_pipeline.py
    r = ansible_playbook(PLAYBOOKS / "remediate.yml", lab_info.inventory, "--check", "-e", f"ddpfix_only={time_rules.SKEW.id}",
                 "-e", "ddpfix_collect=false", tmp=work)
    assert r.returncode == 2 and f"ddpfix_only: not fixed by remediate (detect-only): {time_rules.SKEW.id}" in r.stdout, \
        r.stdout[-4000:]
    # a fixable id: the CLI's dry run and the playbook's check mode change the same hosts
    r = cli(lab_info.inventory, "remediate", "--only", ONLY, "--format", "json", tmp=work)
    assert r.returncode == 1, r.stderr[-3000:]
    cli_changed = {h for h, n in json.loads(r.stdout)["changed"].items() if n}
    r = ansible_playbook(PLAYBOOKS / "remediate.yml", lab_info.inventory, "--check", "--diff", "-e", f"ddpfix_only={ONLY}", tmp=work,
                         **USER_CFG)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "node3" in recap_changed(r.stdout) and recap_changed(r.stdout) == cli_changed, r.stdout[-2000:]
    assert "127.0.1.1" in r.stdout  # the diff of /etc/hosts
    # the fix tasks carry their finding ids as tags: the audit and plan plays run whatever --tags select
    r = ansible_playbook(PLAYBOOKS / "remediate.yml", lab_info.inventory, "--tags", ONLY, tmp=work)
    assert r.returncode == 0, r.stdout[-4000:]
    report = work / "after.json"
    r = ansible_playbook(PLAYBOOKS / "audit.yml", lab_info.inventory, "-e", f"ddpfix_report={report}", "-e", "ddpfix_fail_on=none",
                 "-e", "ddpfix_facts_probe=false", tmp=work)
    assert r.returncode == 0, r.stdout[-4000:]  # the threshold: nothing fails at ddpfix_fail_on=none
    after = keys(json.loads(report.read_text()))  # and the report is still written
    assert probe_ids(after) == set()
    assert not {k for k in after if k[0] == ONLY}, sorted(after)
    assert (firewall_rules.PEER_PORTS_BLOCKED.id, "node3", "error") in after  # not in --tags: left as it was
