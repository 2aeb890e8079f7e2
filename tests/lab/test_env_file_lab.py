"""The env file on real lab hosts: ddpfix's keys in a managed block, the user's lines and secrets kept on the node
and never shown, foreign files refused, directories untouched, symlinks followed, immutable files named
(issue 8 item 6 ddp_env_path, issue 9 item 3)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ddpfix, inventory_vars, sh

from ddpfix import paths, schemas
from ddpfix.rules import env as env_rules

pytestmark = pytest.mark.lab

SECRET = "wandb-s3cr3t-4f9a77"
TOKEN = "hf_tok_77c1d2e0"
PRIVATE = "c2VjcmV0LWJsb2I"
ONLY_ENV = ("--only", f"{env_rules.INCONSISTENT.id},{env_rules.MISSING.id}")  # the lab's other findings (time sync) are not this test's
BEGIN, END = "# BEGIN ddpfix managed block", "# END ddpfix managed block"


def user_env(stale_master: str) -> str:
    return (
        "# my launch settings\n"
        "NCCL_IB_HCA=mlx5_0,mlx5_1\n"
        "export NCCL_DEBUG=INFO\n"
        f"WANDB_API_KEY='{SECRET}'\n"
        f"HF_TOKEN={TOKEN}\n"
        f"#OLD_API_KEY={SECRET}\n"
        f'SSH_PRIVATE_KEY="-----BEGIN-----\n{PRIVATE}\n-----END-----"\n'
        f"MASTER_ADDR={stale_master}\n"
    )


def cat(info: Any, node: str, path: str) -> str:
    return sh(info, node, f"cat {path}").stdout


def sha(info: Any, node: str, path: str) -> str:
    return hashlib.sha256(cat(info, node, path).encode()).hexdigest()


def tree_text(base: Path) -> str:
    """Everything under `base` (a run directory, the state dir) as one string, for leak checks."""
    out = []
    for p in sorted(base.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out.append(p.read_bytes().decode(errors="replace"))
    return "\n".join(out)


@pytest.fixture(scope="module")
def lab2(lab_factory: Any) -> Any:
    return lab_factory(nodes=2, scenario="clean", wait_sync=False)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(d))
    return d


def test_user_keys_and_secrets_kept_never_shown_and_second_apply_changes_nothing(lab2: Any, state: Path) -> None:
    info, inv = lab2, str(lab2.inventory)
    master = info.nodes[0].address
    for n in info.nodes:
        sh(info, n.name, "mkdir -p /etc/ddpfix && cat > /etc/ddpfix/ddp.env && chmod 0640 /etc/ddpfix/ddp.env",
           input=user_env("10.99.0.1"))

    outputs = []
    code, out, err = ddpfix(inv, "env", "--apply")
    outputs += [out, err]
    assert code == 0, err
    assert all(f"{n.name}: /etc/ddpfix/ddp.env written" in err for n in info.nodes), err
    for rank, n in enumerate(info.nodes):
        text = cat(info, n.name, "/etc/ddpfix/ddp.env")
        # every user line is still there, in order, the stale MASTER_ADDR commented out, the block last
        kept = user_env("10.99.0.1").replace("MASTER_ADDR=10.99.0.1", "# ddpfix: superseded: MASTER_ADDR=10.99.0.1")
        assert text.startswith(kept), text
        lines = text.splitlines()
        assert BEGIN in lines and lines[-1] == END and f"NODE_RANK={rank}" in lines
        assert sh(info, n.name, "stat -c %a /etc/ddpfix/ddp.env").stdout.strip() == "640"  # mode kept
        # as a launch script sees it
        seen = sh(info, n.name, "set -a; . /etc/ddpfix/ddp.env; set +a; "
                                "echo $MASTER_ADDR $NODE_RANK $NCCL_DEBUG $NCCL_IB_HCA $WANDB_API_KEY").stdout.split()
        assert seen == [master, str(rank), "INFO", "mlx5_0,mlx5_1", SECRET]
        assert sh(info, n.name, "ls /etc/ddpfix/ddp.env.*~").stdout.strip()  # backup on the node

    # the audit reads the keys as bash does: clean, and nothing secret in its report
    code, out, err = ddpfix(inv, "audit", "--format", "json")
    outputs += [out, err]
    doc = json.loads(out)
    assert not [f for f in doc["findings"] if f["id"].startswith(("env.", "addr."))], doc["findings"]

    # a second apply changes nothing (Ansible's stats), and remediate agrees
    code, out, err = ddpfix(inv, "env", "--apply")
    outputs += [out, err]
    assert code == 0 and all(f"{n.name}: /etc/ddpfix/ddp.env unchanged" in err for n in info.nodes), err
    code, out, err = ddpfix(inv, "remediate", "--apply", *ONLY_ENV, "--format", "json")
    outputs += [out, err]
    doc = json.loads(out)
    assert doc["changed"] == {n.name: 0 for n in info.nodes}, doc["changes"]
    schemas.validate(doc)  # ddpfix.report/v1, remediate's keys included

    # verify's end-state check agrees (from the facts: the file is not read back)
    code, out, err = ddpfix(inv, "verify", "--format", "json")
    outputs += [out, err]
    assert out, (code, err)
    schemas.validate(json.loads(out))  # ddpfix.verify/v1
    checks = [c for c in json.loads(out)["checks"] if c["check"].startswith("env file")]
    assert len(checks) == len(info.nodes) and all(c["ok"] for c in checks), checks

    # a user line that shadows a managed key again: the dry run shows it redacted-safe, --apply neutralises it
    sh(info, "node2", f"printf 'NODE_RANK=5\\nDB_PASSWORD={SECRET}\\n' >> /etc/ddpfix/ddp.env")
    code, out, err = ddpfix(inv, "remediate", *ONLY_ENV, "--format", "json")
    outputs += [out, err]
    doc = json.loads(out)
    diff = next(c["diff"] for c in doc["changes"] if c["host"] == "node2" and env_rules.INCONSISTENT.id in c["rules"])
    assert "+# ddpfix: superseded: NODE_RANK=5" in diff and "DB_PASSWORD=***" in diff
    code, out, err = ddpfix(inv, "remediate", "--apply", *ONLY_ENV, "--format", "json")
    outputs += [out, err]
    assert json.loads(out)["changed"]["node2"] >= 1
    assert sh(info, "node2", ". /etc/ddpfix/ddp.env; echo $NODE_RANK $DB_PASSWORD").stdout.split() == ["1", SECRET]

    # no secret value anywhere the controller keeps or prints: CLI output, report JSON, run dirs (job events,
    # fact cache, artifacts)
    runs = state / "runs"
    assert runs.is_dir() and list(runs.rglob("job_events/*.json")), "no run directory was written"
    leak = "\n".join(outputs) + tree_text(state)
    for secret in (SECRET, TOKEN, PRIVATE):
        assert secret not in leak


def test_foreign_file_refused_file_unchanged(lab2: Any, state: Path) -> None:
    info, inv = lab2, str(lab2.inventory)
    for n in info.nodes:
        sh(info, n.name, "test -s /etc/environment || echo 'PATH=\"/usr/local/bin:/usr/bin:/bin\"' > /etc/environment")
    sh(info, "node2", f"echo 'API_TOKEN={TOKEN}' >> /etc/environment")
    before = {n.name: sha(info, n.name, "/etc/environment") for n in info.nodes}
    with inventory_vars(info, ddp_env_path="/etc/environment"):
        code, out, err = ddpfix(inv, "env", "--apply")
        assert code == 2, (out, err)
        assert "ddp_env_path /etc/environment exists and was not written by ddpfix" in err and "ddp_env_adopt" in err
        assert len(err.strip().splitlines()) == 1, err
        code, out, err = ddpfix(inv, "remediate", "--apply", *ONLY_ENV, "--format", "json")
        doc = json.loads(out)
        assert code == 1 and any("/etc/environment" in r and "not written by ddpfix" in r for r in doc["refused"])
        assert not [c for c in doc["changes"] if env_rules.INCONSISTENT.id in c["rules"]]
        assert TOKEN not in out + err
    assert {n.name: sha(info, n.name, "/etc/environment") for n in info.nodes} == before

    # the role on its own (plain ansible-playbook, no controller) refuses too
    play = state / "env.yml"
    state.mkdir(parents=True, exist_ok=True)
    play.write_text(yaml.safe_dump([{"hosts": "ddp_nodes", "gather_facts": False, "roles": [
        {"role": "ddpfix.cluster.ddpfix_env", "ddpfix_env_path": "/etc/environment", "ddpfix_env_values": {"MASTER_ADDR": "10.0.0.1"}}]}]))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(paths.collections_dir()), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(Path(paths_ansible_bin()) / "ansible-playbook"), "-i", inv, str(play)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "/etc/environment exists and was not written by ddpfix" in r.stdout, r.stdout[-3000:]
    assert TOKEN not in r.stdout + r.stderr
    assert {n.name: sha(info, n.name, "/etc/environment") for n in info.nodes} == before

    # opting in: the block is added, every existing line kept
    with inventory_vars(info, ddp_env_adopt=True, ddp_env_path="/etc/environment"):
        code, out, err = ddpfix(inv, "env", "--apply")
        assert code == 0, err
        text = cat(info, "node2", "/etc/environment")
        assert f"API_TOKEN={TOKEN}" in text and BEGIN in text
        assert sh(info, "node2", "ls /etc/environment.*~").stdout.strip()
        code, out, err = ddpfix(inv, "env", "--apply")
        assert code == 0 and "node2: /etc/environment unchanged" in err


def paths_ansible_bin() -> str:
    from ddpfix.ansible.env import find_ansible_playbook

    return str(Path(find_ansible_playbook()).parent)


def test_existing_directory_mode_and_owner_never_changed(lab2: Any, state: Path) -> None:
    info, inv = lab2, str(lab2.inventory)
    for n in info.nodes:
        sh(info, n.name, "mkdir -p /etc/ddp-private && chmod 0700 /etc/ddp-private && chown 65534:65534 /etc/ddp-private")
    with inventory_vars(info, ddp_env_path="/etc/ddp-private/ddp.env"):
        code, _out, err = ddpfix(inv, "env", "--apply")
        assert code == 0, err
    with inventory_vars(info, ddp_env_path="/etc/ddp-private/new/ddp.env"):
        code, _out, err = ddpfix(inv, "env", "--apply")
        assert code == 0, err
    for n in info.nodes:
        assert sh(info, n.name, "stat -c '%a %u:%g' /etc/ddp-private").stdout.strip() == "700 65534:65534"
        assert sh(info, n.name, "stat -c '%a %u' /etc/ddp-private/new /etc/ddp-private/ddp.env").stdout.split() == \
            ["755", "0", "600", "0"]  # a new env file is 0600
        assert BEGIN in cat(info, n.name, "/etc/ddp-private/new/ddp.env")


def test_symlinked_env_file_target_updated_link_kept(lab2: Any, state: Path) -> None:
    info, inv = lab2, str(lab2.inventory)
    code, _out, err = ddpfix(inv, "env", "--apply")
    assert code == 0, err
    for n in info.nodes:  # the file moves to a shared-config place; the usual path becomes a link to it
        sh(info, n.name, "mkdir -p /etc/shared-cfg && mv /etc/ddpfix/ddp.env /etc/shared-cfg/ddp.env && "
                         "sed -i 's/^NODE_RANK=.*/NODE_RANK=9/' /etc/shared-cfg/ddp.env && "
                         "ln -s ../shared-cfg/ddp.env /etc/ddpfix/ddp.env")
    code, _out, err = ddpfix(inv, "env", "--apply")
    assert code == 0, err
    for rank, n in enumerate(info.nodes):
        assert sh(info, n.name, "readlink /etc/ddpfix/ddp.env").stdout.strip() == "../shared-cfg/ddp.env"
        assert f"NODE_RANK={rank}\n" in cat(info, n.name, "/etc/shared-cfg/ddp.env")
    code, _out, err = ddpfix(inv, "env", "--apply")
    assert code == 0 and all(f"{n.name}: /etc/ddpfix/ddp.env unchanged" in err for n in info.nodes), err
    # a dangling link is refused with a message naming it, nothing created
    sh(info, "node2", "rm /etc/shared-cfg/ddp.env")
    code, _out, err = ddpfix(inv, "env", "--apply")
    assert code == 2 and "/etc/ddpfix/ddp.env" in err and "symlink" in err, err
    assert sh(info, "node2", "test -e /etc/shared-cfg/ddp.env", check=False).returncode == 1
    for n in info.nodes:
        sh(info, n.name, "rm -f /etc/ddpfix/ddp.env /etc/shared-cfg/ddp.env")


def test_immutable_file_named_with_chattr(lab2: Any, state: Path) -> None:
    info, inv = lab2, str(lab2.inventory)
    code, _out, err = ddpfix(inv, "env", "--apply")
    assert code == 0, err
    sh(info, "node2", "sed -i 's/^NODE_RANK=.*/NODE_RANK=9/' /etc/ddpfix/ddp.env")
    r = sh(info, "node2", "chattr +i /etc/ddpfix/ddp.env", check=False)
    if r.returncode != 0:
        pytest.skip(f"the lab's /etc does not support chattr +i: {r.stderr.strip()}")
    try:
        before = cat(info, "node2", "/etc/ddpfix/ddp.env")
        code, out, err = ddpfix(inv, "env", "--apply")
        assert code == 1, err
        assert "node2: /etc/ddpfix/ddp.env failed:" in err and "chattr -i /etc/ddpfix/ddp.env" in err, err
        assert cat(info, "node2", "/etc/ddpfix/ddp.env") == before
        code, out, err = ddpfix(inv, "remediate", *ONLY_ENV, "--format", "json")  # the dry run says so too
        assert json.loads(out)["failed_hosts"].get("node2", "").find("chattr -i") >= 0, out
    finally:
        sh(info, "node2", "chattr -i /etc/ddpfix/ddp.env", check=False)
    code, out, err = ddpfix(inv, "env", "--apply")
    assert code == 0 and "node2: /etc/ddpfix/ddp.env written" in err, err


# the shim that records what AnsibleModule hands to syslog (the node's journal) for every module run on the node:
# the lab nodes share the host's /dev (no /dev/log of their own), so the calls themselves are recorded
SYSLOG_SHIM = """import syslog
def _record(*args):
    with open("/root/ddpfix-module-syslog.txt", "a") as f:
        f.write(repr(args[-1]) + "\\n")
syslog.syslog = _record
"""
API_KEY = "wandb-journal-5c0ffee51"
PROXY_PW = "pr0xy-pw-77aa"


def test_secret_trail_journal_outputs_modes_and_convergence(lab2: Any, state: Path) -> None:
    """issue 20 item 2 on real nodes: a secret in ddp_env_extra reaches the env file (0600) and nothing else: not
    the node's journal, not any CLI output or run directory file (all private to the owner), and the audit right
    after the write is clean; a world-readable file that gets the secret is tightened, and said so."""
    info, inv = lab2, str(lab2.inventory)
    for n in info.nodes:
        sh(info, n.name, "rm -f /etc/ddpfix/ddp.env /etc/ddpfix/ddp.env.*~ /root/ddpfix-module-syslog.txt && "
                         "mkdir -p /root/ddpfix-logshim && cat > /root/ddpfix-logshim/sitecustomize.py && "
                         "printf '#!/bin/sh\\nPYTHONPATH=/root/ddpfix-logshim exec /usr/bin/python3 \"$@\"\\n' "
                         "> /root/pylog && chmod 0755 /root/pylog", input=SYSLOG_SHIM)
    extra = {"WANDB_API_KEY": API_KEY, "HTTPS_PROXY": f"http://bob:{PROXY_PW}@10.0.0.9:3128"}
    outputs: list[str] = []
    with inventory_vars(info, {"ansible_python_interpreter": "/root/pylog"}, ddp_env_extra=extra, ddp_backup_keep=1):
        code, out, err = ddpfix(inv, "env", "--apply")
        outputs += [out, err]
        assert code == 0 and all(f"{n.name}: /etc/ddpfix/ddp.env written" in err for n in info.nodes), err
        for n in info.nodes:
            assert sh(info, n.name, "stat -c '%a %u' /etc/ddpfix/ddp.env").stdout.split() == ["600", "0"]
            seen = sh(info, n.name, "set -a; . /etc/ddpfix/ddp.env; echo $WANDB_API_KEY $HTTPS_PROXY").stdout.split()
            assert seen == [API_KEY, extra["HTTPS_PROXY"]]  # the secret is in its file
        # the audit right after: clean (compared by digest, not *** against the value); -v and JSON in one run
        # (ddpfix env's own outputs: tests/unit/test_secrets.py)
        code, out, err = ddpfix(inv, "-v", "audit", "--format", "json", "--no-probe")
        outputs += [out, err]
        ids = [f["id"] for f in json.loads(out)["findings"]]
        assert not [i for i in ids if i.startswith("env.")], (ids, err)

        # a world-readable file on node2 with a stale rank: --apply tightens it and says so; two writes with
        # ddp_backup_keep: 1 leave one backup, with the tightened mode
        for i in range(2):
            sh(info, "node2", ("chmod 0644 /etc/ddpfix/ddp.env && " if i == 0 else "")
               + "sed -i 's/^NODE_RANK=.*/NODE_RANK=7/' /etc/ddpfix/ddp.env")
            code, out, err = ddpfix(inv, "remediate", "--apply", *ONLY_ENV, "--format", "json")
            outputs += [out, err]
            assert code == 0 and json.loads(out)["changed"]["node2"] >= 1, (out, err)
            assert ("0644 -> 0640" in out) is (i == 0), out  # the note names the change of mode
        assert sh(info, "node2", "stat -c %a /etc/ddpfix/ddp.env").stdout.strip() == "640"
        backups = sh(info, "node2", "stat -c '%a %n' /etc/ddpfix/ddp.env.*~").stdout.splitlines()
        assert len(backups) == 1 and backups[0].startswith("640 "), backups

    # the node's journal: the shim saw the modules' invocation entries (it works), the env module's with its
    # content-carrying argument not logged, and none with the secret
    for n in info.nodes:
        logged = sh(info, n.name, "cat /root/ddpfix-module-syslog.txt").stdout
        assert "Invoked with" in logged and "body=NOT_LOGGING_PARAMETER" in logged, logged[:500]
        assert API_KEY not in logged and PROXY_PW not in logged
    # the controller: outputs, and every file under the state directory, owner-only and without the secret
    printed = "\n".join(outputs)
    assert API_KEY not in printed and PROXY_PW not in printed
    kept = [p for p in state.rglob("*") if p.is_file() and not p.is_symlink()
            and (API_KEY.encode() in p.read_bytes() or PROXY_PW.encode() in p.read_bytes())]
    assert kept == [], kept
    runs = state / "runs"
    # the runs' event files were searched (the facts live in a memory fact cache: no fact_cache files to search)
    assert list(runs.rglob("job_events/*.json")) and not list(runs.rglob("fact_cache/*"))
    for p in [runs, *runs.rglob("*")]:
        if p.is_symlink():
            continue
        assert p.stat().st_mode & 0o077 == 0, f"{p} is {oct(p.stat().st_mode)}"
