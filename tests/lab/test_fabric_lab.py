"""GPU fabric checks on real lab hosts: synthetic RDMA sysfs trees per node (see scenarios.fabric.fabric_everywhere), the
facts module reading them over SSH, the findings through `ddpfix audit -i INV`, memlock fixed by `remediate --apply`.

One 2-node lab serves every case: a fabric scenario differs from `clean` only in node files and inventory
variables, so `apply_fabric` switches the running lab to each case in place (as `lab up --scenario CASE` would
have built it) before the audit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helpers as h
import pytest
from click.testing import CliRunner
from helpers import ddpfix_json

from ddpfix.cli import cli
from ddpfix.lab.scenarios.inplace import apply_fabric
from ddpfix.rules import fabric as fabric_rules
from ddpfix.rules import reachability as reachability_rules

pytestmark = pytest.mark.lab


def fabric_findings(doc: dict[str, Any]) -> set[tuple[str, str | None]]:
    return {(f["id"], f["host"]) for f in doc["findings"] if f["id"].startswith("fabric.")}


FABRIC_CASES = [
    ("fabric-port-down", {(fabric_rules.PORT_DOWN.id, "node2")}),
    ("fabric-gid-differs", {(fabric_rules.GID_INDEX_DIFFERS.id, None)}),
    ("fabric-pkey-mismatch", {(fabric_rules.PKEY_MISMATCH.id, None)}),
    ("fabric-link-layer-mixed", {(fabric_rules.LINK_LAYER_MIXED.id, None)}),
    ("fabric-rate-mismatch", {(fabric_rules.RATE_MISMATCH.id, "node2")}),
    ("fabric-roce-no-v2-gid", {(fabric_rules.ROCE_NO_V2_GID.id, "node2")}),
    ("fabric-hca-includes-mgmt", {(fabric_rules.HCA_INCLUDES_MGMT.id, "node2")}),
    ("fabric-no-uverbs", {(fabric_rules.NO_UVERBS.id, "node2")}),
    ("fabric-peermem-missing", {(fabric_rules.PEERMEM_MISSING.id, "node2")}),
    ("fabric-efa-provider-missing", {(fabric_rules.EFA_PROVIDER_MISSING.id, "node2")}),
    ("fabric-nccl-version-mismatch", {(fabric_rules.NCCL_VERSION_MISMATCH.id, None)}),
]


@pytest.fixture(scope="module")
def fabric_lab(lab_factory: Any) -> Any:
    """The module's one lab, built by `lab up` with the first case; each test applies its own case to it."""
    return lab_factory(nodes=2, scenario=FABRIC_CASES[0][0], wait_sync=False)


@pytest.mark.parametrize(("scenario", "want"), FABRIC_CASES)
def test_scenario_yields_its_finding(fabric_lab: Any, scenario: str, want: set[tuple[str, str | None]]) -> None:
    apply_fabric(fabric_lab, scenario)
    code, doc = ddpfix_json(str(fabric_lab.inventory), "audit")
    assert code == 1
    assert fabric_findings(doc) == want, doc["findings"]


def test_memlock_low_found_and_fixed_for_new_logins(fabric_lab: Any) -> None:
    apply_fabric(fabric_lab, "fabric-memlock-low")
    inv = str(fabric_lab.inventory)
    code, doc = ddpfix_json(inv, "audit")
    assert fabric_findings(doc) == {(fabric_rules.MEMLOCK_LOW.id, "node2")}, doc["findings"]
    f = next(f for f in doc["findings"] if f["id"] == fabric_rules.MEMLOCK_LOW.id)
    assert "soft 65536 (64 KiB)" in f["evidence"] and f["fixable"]

    code, dry = ddpfix_json(inv, "remediate", "--only", fabric_rules.MEMLOCK_LOW.id)
    assert any("90-ddpfix-memlock.conf" in c["diff"] or "memlock" in c["task"] for c in dry["changes"]), dry["changes"]
    code, applied = ddpfix_json(inv, "remediate", "--apply", "--only", fabric_rules.MEMLOCK_LOW.id)
    assert code == 0, (applied.get("remaining_fixable"), applied.get("failed_hosts"))
    code, after = ddpfix_json(inv, "audit")
    assert not fabric_findings(after), after["findings"]
    code, again = ddpfix_json(inv, "remediate", "--apply", "--only", fabric_rules.MEMLOCK_LOW.id)
    assert again["changed"].get("node2", 0) == 0, again["changes"]


HOSTILE_DEVICES = ("{{ 7*191 }}", "{{ lookup('pipe', 'touch ddpfix-pwned') }}")
HOSTILE_MAC = "52:54:00:aa:bb:cc\n{{ 7*191 }}"
#: `ip` as a compromised node's could print it: the real one's output, every MAC replaced (bind-mounted
#: over /usr/bin/ip inside node2's private mount namespace only)
FAKE_IP = f"""#!/usr/bin/python3
import json, subprocess, sys
p = subprocess.run(["/run/ip.real", *sys.argv[1:]], capture_output=True, text=True)
out = p.stdout
if "-j" in sys.argv[1:] and p.returncode == 0:
    doc = json.loads(out)
    for i in doc:
        if i.get("ifname") != "lo":
            i["address"] = {HOSTILE_MAC!r}
    out = json.dumps(doc)
sys.stdout.write(out)
sys.stderr.write(p.stderr)
sys.exit(p.returncode)
"""


def test_hostile_rdma_device_names_and_mac_are_refused_never_evaluated(fabric_lab: Any, tmp_path: Path) -> None:
    """A node that returns template syntax (RDMA device directories named `{{ 7*191 }}` and `{{ lookup('pipe',
    ...) }}`, a MAC with a line break through a fake `ip`) is reachability_rules.INVALID naming the field; the dry run,
    through the CLI and through `ansible-playbook playbooks/remediate.yml`, refuses with exit 2 / a failed plan, and
    nothing is evaluated: no 1337 anywhere, no file created by the lookup in the user's directory (the working
    directory of ansible-playbook), no file written on the node."""
    from ddpfix import lab
    from ddpfix.lab.scenarios.fabric import FABRIC_RUN

    apply_fabric(fabric_lab, "fabric-memlock-low")
    base = f"/run/{FABRIC_RUN}/sys/class/infiniband"
    for name in HOSTILE_DEVICES:
        lab.node_exec(fabric_lab.name, "node2", ["cp", "-a", f"{base}/mlx5_1", f"{base}/{name}"])
    lab.node_exec(fabric_lab.name, "node2", ["cp", "/usr/bin/ip", "/run/ip.real"])
    lab.node_exec(fabric_lab.name, "node2", ["sh", "-c", "cat > /run/ip.fake && chmod 755 /run/ip.fake"],
                  input=FAKE_IP)
    lab.node_exec(fabric_lab.name, "node2", ["mount", "--bind", "/run/ip.fake", "/usr/bin/ip"])
    inv = str(fabric_lab.inventory)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        _code, doc = ddpfix_json(inv, "audit")
        invalid = [f for f in doc["findings"] if f["id"] == reachability_rules.INVALID.id]
        assert {f["host"] for f in invalid} == {"node2"}, invalid
        evidence = {re.sub(r"^fabric\.devices\[\d+\]", "fabric.devices[]", f["evidence"]) for f in invalid}
        assert {f"fabric.devices[].name = {n!r}" for n in HOSTILE_DEVICES} <= evidence, evidence
        assert f"interfaces[eth0].mac = {HOSTILE_MAC!r}" in evidence, evidence
        r = CliRunner().invoke(cli, ["-i", inv, "remediate"], catch_exceptions=False)
        assert r.exit_code == 2 and reachability_rules.INVALID.id in r.stderr, (r.exit_code, r.output)
        pb = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", inv,
             str(Path(__file__).resolve().parents[2] / "playbooks" / "remediate.yml"), "--check", "--diff"],
            capture_output=True, text=True, timeout=600, cwd=str(tmp_path), check=False,
            env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
        assert pb.returncode != 0 and reachability_rules.INVALID.id in pb.stdout, pb.stdout[-3000:]
        for out in (json.dumps(doc), r.output, pb.stdout, pb.stderr):
            assert "1337" not in out
        assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
        assert lab.node_exec(fabric_lab.name, "node2", ["test", "-e", "/etc/ddpfix/ddp.env"],
                             check=False).returncode != 0
    finally:
        os.chdir(cwd)
        lab.node_exec(fabric_lab.name, "node2", ["umount", "/usr/bin/ip"], check=False)
        for name in HOSTILE_DEVICES:
            lab.node_exec(fabric_lab.name, "node2", ["rm", "-rf", f"{base}/{name}"])


def test_clean_lab_has_no_fabric_facts_or_findings(fabric_lab: Any) -> None:
    apply_fabric(fabric_lab, "clean")  # back to what `lab up --scenario clean` builds
    _code, doc = ddpfix_json(str(fabric_lab.inventory), "audit")
    assert not fabric_findings(doc), doc["findings"]


@pytest.mark.torch
def test_verify_nccl_on_the_lab(fabric_lab: Any) -> None:
    """One real NCCL sweep where the nodes have a GPU; without one the command says so per node and the test skips."""
    h.need_node_torch()
    apply_fabric(fabric_lab, "clean")
    r = CliRunner().invoke(cli, ["-i", str(fabric_lab.inventory), "env", "--apply"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    code, doc = ddpfix_json(str(fabric_lab.inventory), "verify", "--backend", "nccl", "--no-checks", "--sizes", "8M,64M",
                            "--iters", "5")
    gang = doc["nccl"]["gang"]
    if not h.node_cuda():
        assert code == 1 and all(e.get("skipped") and "torch.cuda.is_available() is False" in e["error"] for e in gang), gang
        pytest.skip("no GPU on the lab nodes (torch.cuda.is_available() is False): the NCCL sweep itself is not run")
    assert code == 0, gang
    assert all(e["ok"] and len(e["sweep"]) == 2 and e["sweep"][-1]["busbw"] >= 0 for e in gang), gang
