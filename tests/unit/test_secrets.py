"""Secrets stay in their file: the one secret detector (`ddpfix_envfile.is_secret`), redaction of every output
that shows env values, comparison by digest (an audit after a clean write converges), the env file module's modes,
no_log and backups, and the controller's run directory modes. No host."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from unit_helpers import ROOT, Sim, envfile, nodeinfo

from ddpfix.ansible.rundirs import scrub
from ddpfix.model.cluster import Node
from ddpfix.plan import env_differs, env_write_needed, plan_cluster, render_env
from ddpfix.remediate import render_diff
from ddpfix.rules import env as env_rules
from tools import tags

lib = envfile()
parse = nodeinfo().parse_env_file
SECRET = "wandb-0123456789abcdef"

#: (key, value, secret?) -- names containing KEY, TOKEN, SECRET, PASS, PWD, AUTH, CREDENTIAL, DSN, COOKIE, SESSION in
#: any case are secret, and any value with URL userinfo. Substrings, not words: MONKEY and KEYBOARD are flagged (a
#: false positive only hides a value; a word rule would miss PGPASSWORD, APIKEY, SECRETKEY).
CASES = [
    ("WANDB_API_KEY", "x", True), ("HF_TOKEN", "x", True), ("aws_secret_access_key", "x", True),
    ("DB_PASS", "x", True), ("DB_PASSWORD", "x", True), ("PGPASSWORD", "x", True), ("SMTP_PASSWD", "x", True),
    ("MYSQL_PWD", "x", True), ("APIKEY", "x", True), ("GITHUB_AUTH", "x", True), ("BASIC_AUTH_USER", "x", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp.json", True), ("AZURE_CREDENTIAL", "x", True),
    ("SENTRY_DSN", "https://k@o1.ingest.sentry.io/1", True), ("DATABASE_DSN", "x", True),
    ("SESSION_COOKIE", "x", True), ("JUPYTER_SESSION", "x", True), ("ssh_key", "x", True),
    ("MONKEY", "banana", True), ("KEYBOARD", "us", True),  # chosen: flagged (substring rule)
    ("HTTPS_PROXY", "http://user:pw@proxy:3128", True), ("https_proxy", "http://user:pw@10.0.0.1:3128/", True),
    ("PIP_INDEX_URL", "https://__token__:pypi-AgEI@pypi.example/simple", True),
    ("GIT_REMOTE", "https://ghp_abc123@github.com/x/y.git", True),  # a bare token as userinfo: secret
    ("HTTPS_PROXY", "http://proxy:3128", False), ("NO_PROXY", "localhost,127.0.0.1", False),
    ("MASTER_ADDR", "192.168.77.11", False), ("MASTER_PORT", "29500", False), ("NCCL_SOCKET_IFNAME", "=eth0", False),
    ("GLOO_SOCKET_IFNAME", "eth0", False), ("NCCL_IB_HCA", "=mlx5_0:1", False), ("NCCL_DEBUG", "INFO", False),
    ("PET_NODE_RANK", "1", False), ("NODE_RANK", "0", False), ("WANDB_PROJECT", "ddp", False),
    ("CONTACT", "ops@example.com", False), ("DOCS", "https://example.com/a@b", False),  # @ in the path: no userinfo
]

#: Secrets by what they are (issue 36 item 7): a key that names none of the words above, a value in a provider's
#: documented format (the examples of Slack's, Discord's, GitHub's, AWS's, GitLab's, OpenAI's and Hugging Face's
#: docs, with the placeholders filled to the format's length).
SLACK_HOOK = "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
DISCORD_HOOK = "https://discord.com/api/webhooks/123456789012345678/Abc_defGhIJklmNOPqrstUVwxyz0123456789-abcdEFGH"
GH_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
FORMAT_CASES = [
    ("SLACK_WEBHOOK_URL", SLACK_HOOK, True), ("NOTIFY", SLACK_HOOK, True), ("DISCORD_WEBHOOK", "x", True),
    ("ALERTS", DISCORD_HOOK, True), ("CHAT", "https://discordapp.com/api/webhooks/1/abc", True),
    ("TEAMS", "https://contoso.webhook.office.com/webhookb2/abc@def/IncomingWebhook/123/456", True),
    ("GH_PAT", "x", True), ("GITLAB_PAT", "x", True), ("PAT", "x", True),
    ("GIT_HELPER", GH_TOKEN, True), ("REPO_ACCESS", "gho_" + "x" * 36, True),
    ("FINE_GRAINED", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", True),
    ("SLACK_BOT", "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", True),
    ("SLACK_USER", "xoxp-123456789012-123456789012-123456789012-abcdef", True),
    ("AWS_ACCESS_KEY_ID_X", "AKIAIOSFODNN7EXAMPLE", True), ("S3_ID", "AKIAIOSFODNN7EXAMPLE", True),
    ("GL", "glpat-xxxxxxxxxxxxxxxxxxxx", True), ("OPENAI", "sk-proj-abcdefghijklmnopqrstuvwxyz0123", True),
    ("ANTHROPIC", "sk-ant-api03-abcdefghijklmnopqrstuvwxyz", True),
    ("HF_HUB", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", True),
    ("PIP_EXTRA_INDEX", "https://pypi.example/simple?token=s3cr3t", True),
    ("BLOB", "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=abc%2Bdef", True),
    ("CMD", f"git clone https://x-access-token:{GH_TOKEN}@github.com/o/r", True),
    # not secrets: paths, words containing a token's letters, a plain URL
    ("PATH", "/usr/local/bin:/usr/bin", False), ("PYTHONPATH", "/opt/x", False), ("LD_LIBRARY_PATH", "/a", False),
    ("NCCL_NET_PLUGIN", "aws-ofi", False), ("TASK", "disk-benchmark-with-a-very-long-name", False),
    ("WANDB_BASE_URL", "https://api.wandb.ai", False), ("HOOKS_DIR", "/etc/hooks", False),
    ("SLACK_CHANNEL", "#ml-alerts", False), ("HF_HOME", "/data/hf", False), ("MODEL", "sk-learn", False),
]


@pytest.mark.parametrize(("key", "value", "secret"), CASES + FORMAT_CASES)
def test_secret_detection_table(key: str, value: str, secret: bool) -> None:
    assert lib.is_secret(key, value) is secret
    line = f"{key}={value}\n"
    red = lib.redact(line)
    if secret:
        assert red == f"{key}=***\n"
        assert lib.redact_values({key: value}) == {key: "***"}
    else:
        assert red == line and lib.redact_values({key: value}) == {key: value}


def test_tokens_and_webhooks_are_redacted_in_any_line() -> None:
    """A token or webhook outside an assignment (a comment, a command line) is replaced by *** where it stands."""
    text = f"# notify {SLACK_HOOK} on failure\n# run: huggingface-cli login --token hf_{'a' * 34}\nA=1\n"
    red = lib.redact(text)
    assert "XXXXXXXX" not in red and "hf_aaa" not in red and red.endswith("A=1\n")
    assert red.startswith("# notify https://*** on failure\n# run: huggingface-cli login --token ***\n")
    assert lib.redact_values({"X": GH_TOKEN, "Y": "plain"}) == {"X": "***", "Y": "plain"}


def test_name_rule_needs_no_value_and_is_case_insensitive() -> None:
    assert lib.is_secret("wandb_api_key") and lib.is_secret("Db_Pass") and not lib.is_secret("MASTER_ADDR")
    assert not lib.is_secret("HTTPS_PROXY") and lib.is_secret("HTTPS_PROXY", "http://u:p@h:1")


def test_redact_covers_commented_export_and_multiline_values() -> None:
    text = (f"export WANDB_API_KEY={SECRET}\n# HF_TOKEN={SECRET}\nPROXY='http://u:{SECRET}@h:3128'\n"
            f"DB_PASS=\"line one\n{SECRET} line two\"\nNOTE=\"two\nlines\"\nA=1\n")
    red = lib.redact(text)
    assert SECRET not in red
    assert red == "export WANDB_API_KEY=***\n# HF_TOKEN=***\nPROXY=***\nDB_PASS=***\nNOTE=\"two\nlines\"\nA=1\n"
    # a userinfo URL on a line that is no assignment is redacted too
    assert lib.redact("# see http://u:pw@h/\n") == "# see http://***@h/\n"


def test_digest_comparison_converges_and_never_shows_the_wanted_value(sim: Sim) -> None:
    sim.set_var(None, ddp_env_extra={"WANDB_API_KEY": SECRET, "HTTPS_PROXY": "http://u:pw@10.0.0.9:3128"})
    sim.write_planned_env_files()  # every node holds what ddpfix writes, secrets included
    ef = sim.node("node2")["env_file"]
    assert ef["values"]["WANDB_API_KEY"] == "***" and SECRET not in json.dumps(ef)
    plans = plan_cluster(sim.cluster(), {n: d["node"] for n, d in sim.docs.items()})
    assert plans["node2"].env["WANDB_API_KEY"] == SECRET
    assert list(env_differs(ef, plans["node2"].env)) == []
    assert not env_write_needed(ef, plans["node2"])
    assert not [f for f in sim.findings() if f.id.startswith("env.")]  # converges: no env_rules.INCONSISTENT
    # a node with another key: inconsistent, and the evidence shows *** on both sides
    sim.write_planned_env_files(node2={"WANDB_API_KEY": "other-key-000"})
    bad = [f for f in sim.findings() if f.id == env_rules.INCONSISTENT.id and f.host == "node2"]
    assert bad and "WANDB_API_KEY=*** (want ***)" in bad[0].evidence
    assert SECRET not in repr(sim.findings()) and "other-key-000" not in repr(sim.findings())
    assert env_write_needed(sim.node("node2")["env_file"], plans["node2"])  # the line after the block shadows it
    # the block's copy differs: a write is needed
    text = render_env(plans["node2"]).replace(SECRET, "stale")
    sim.set_env_file("node2", text)
    assert env_write_needed(sim.node("node2")["env_file"], plans["node2"])
    assert list(env_differs(sim.node("node2")["env_file"], {"WANDB_API_KEY": SECRET})) == [
        ("WANDB_API_KEY", "***", "***")]


def test_hostile_or_missing_digests_never_read_as_equal() -> None:
    want = {"WANDB_API_KEY": SECRET}
    for secrets in (None, [], {"salt": "", "values": {}}, {"salt": "ab", "values": {"WANDB_API_KEY": 3}},
                    {"salt": "ab", "values": {"WANDB_API_KEY": "0" * 64}}, {"salt": 1, "values": []}):
        ef: dict[str, Any] = {"values": {"WANDB_API_KEY": "***"}, "secrets": secrets}
        assert list(env_differs(ef, want)) == [("WANDB_API_KEY", "***", "***")]
    salt = "00ff"
    ok = {"values": {"WANDB_API_KEY": "***"}, "secrets": {"salt": salt, "values": {
        "WANDB_API_KEY": lib.secret_digest(salt, SECRET)}}}
    assert list(env_differs(ok, want)) == []
    # a node that returns the secret's value in clear (no ***) for a secret key is still compared, never echoed
    assert list(env_differs({"values": {"WANDB_API_KEY": SECRET}}, want)) == [("WANDB_API_KEY", SECRET, "***")]


def test_render_diff_redacts_any_module_diff() -> None:
    d = {"before": "A=1\n", "after": f"A=1\nDB_PASS={SECRET}\n", "before_header": "f", "after_header": "f"}
    out = render_diff(d)
    assert SECRET not in out and "+DB_PASS=***" in out
    assert SECRET not in render_diff({"prepared": f"HF_TOKEN={SECRET}"})


# ---------------------------------------------------------------- the env file module on a scratch directory


def _run_module(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: dict[str, Any],
                check: bool = False, name: str = "ddpfix_env_file") -> dict[str, Any]:
    """plugins/modules/NAME.py's main() (ddpfix_env_file's) in-process with `args`: its JSON result, and `_journal`:
    what it handed AnsibleModule's invocation logging (the node's journal)."""
    from ansible.module_utils import basic

    from ddpfix.ansible import collection

    mod = collection.module(name)
    from ansible.module_utils.common import parameters

    # ansible-core 2.21 returns `invocation` only when the controller asks (INJECT_INVOCATION): ask, as -v may
    inject = {"_ansible_inject_invocation": True} if "inject_invocation" in parameters.PASS_VARS else {}
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check, "_ansible_no_log": False, **inject}}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps(payload).encode())
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy", raising=False)  # 2.19; older ansible-core has none
    monkeypatch.setattr(basic, "_PARSED_MODULE_ARGS", None, raising=False)
    journal: list[str] = []
    orig = basic.AnsibleModule._log_invocation

    def log_invocation(self: Any) -> None:
        monkeypatch.setattr(self, "log", lambda msg, log_args=None: journal.append(f"{msg} {log_args}"))
        orig(self)

    monkeypatch.setattr(basic.AnsibleModule, "_log_invocation", log_invocation)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        mod.main()
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    out["_journal"] = journal
    return out


def _scratch_base() -> Path:
    """The checkout, or (a checkout under /tmp, /var/tmp, ...) the first writable place outside the directories the
    module refuses (ddpfix_envfile.FORBIDDEN_DIRS): the tests pass from a checkout anywhere."""
    forbidden = [Path(d) for d in lib.FORBIDDEN_DIRS]
    for base in (ROOT, Path.home(), Path("/var/lib"), Path("/srv"), Path("/opt")):
        real = base.resolve()
        if not any(real == f or f in real.parents for f in forbidden) and os.access(real, os.W_OK):
            return real
    pytest.skip("no writable directory outside " + ", ".join(lib.FORBIDDEN_DIRS))


@pytest.fixture
def scratch() -> Any:
    """A scratch directory outside /tmp (the module refuses env files under /tmp, /var/tmp, /run/user)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=".test-secrets-", dir=_scratch_base()))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _body(extra: str = "") -> str:
    return f"# node node1 (rank 0)\nMASTER_ADDR=10.0.0.1\nNODE_RANK=0\nWANDB_API_KEY={SECRET}\n{extra}"


def test_module_keeps_env_content_out_of_journal_and_result(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str],
                                                            scratch: Path) -> None:
    path = scratch / "etc" / "ddp.env"
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": _body()})
    assert res["changed"] and not res.get("failed"), res
    journal = "\n".join(res["_journal"])
    assert "Invoked with" in journal and "body=NOT_LOGGING_PARAMETER" in journal and SECRET not in journal
    shown = json.dumps(res)
    assert SECRET not in shown and "WANDB_API_KEY=***" in res["invocation"]["module_args"]["body"]
    assert "MASTER_ADDR=10.0.0.1" in res["diff"]["after"]  # other values stay visible, not blanked by masking
    assert SECRET in path.read_text()  # ... the secret is in its file, and only there
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a new env file is 0600
    # values (instead of body) are redacted in the returned arguments too
    res = _run_module(monkeypatch, capsys, {"path": str(path), "values": {"HF_TOKEN": SECRET, "A": "1"}},
                      check=True)
    assert SECRET not in json.dumps(res) and res["invocation"]["module_args"]["values"] == {"HF_TOKEN": "***",
                                                                                         "A": "1"}


def test_world_readable_file_with_a_secret_is_tightened_and_said_so(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str],
                                                                     scratch: Path) -> None:
    path = scratch / "ddp.env"
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": "MASTER_ADDR=10.0.0.1\n"})
    os.chmod(path, 0o644)
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": "MASTER_ADDR=10.0.0.2\n"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and "mode_tightened" not in res  # no secret: mode kept
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": _body()}, check=True)
    assert res["mode_tightened"] == "0644 -> 0640" and stat.S_IMODE(path.stat().st_mode) == 0o644  # check: no write
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": _body()})
    assert res["changed"] and res["mode_tightened"] == "0644 -> 0640"
    assert "others may no longer read it" in res["ddpfix_note"]  # remediate lists it among the notes
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(Path(res["backup_file"]).stat().st_mode) == 0o640  # the backup is not left readable
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": _body()})
    assert not res["changed"] and "mode_tightened" not in res  # idempotent
    os.chmod(path, 0o600)
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": _body("A=2\n")})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "mode_tightened" not in res  # a private file keeps its mode


def test_module_keeps_the_newest_backups_only(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                              scratch: Path) -> None:
    tmp_path = scratch
    path = tmp_path / "ddp.env"
    path.write_text("# BEGIN ddpfix managed block\n# END ddpfix managed block\n")
    old = [tmp_path / f"ddp.env.{100 + i}.2020-01-0{i + 1}@00:00:00~" for i in range(6)]
    for p in old:
        p.write_text("old\n")
    (tmp_path / "ddp.env.notes~").write_text("mine\n")  # not a backup's name: kept
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": "A=1\n", "backup_keep": 3})
    assert res["changed"] and Path(res["backup_file"]).exists()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ddp.env."))
    assert left == sorted([old[4].name, old[5].name, Path(res["backup_file"]).name, "ddp.env.notes~"])
    assert sorted(res["backups_removed"]) == sorted(str(p) for p in old[:4])
    res = _run_module(monkeypatch, capsys, {"path": str(path), "body": "A=2\n", "backup_keep": 0})
    assert res["failed"] and "backup_keep" in res["msg"]


def test_backup_prune_orders_by_date_and_ignores_links(tmp_path: Path) -> None:
    from ddpfix.ansible import collection

    bk = collection.module_utils("ddpfix_backup")
    f = tmp_path / "hosts"
    f.write_text("x")
    names = ["hosts.9.2024-05-01@10:00:00~", "hosts.10.2024-05-01@09:00:00~", "hosts.1.2025-01-01@00:00:00~"]
    for n in names:
        (tmp_path / n).write_text("b")
    (tmp_path / "hosts.2.2019-01-01@00:00:00~").symlink_to(f)
    assert [Path(p).name for p in bk.backups_of(str(f))] == [names[1], names[0], names[2]]
    assert [Path(p).name for p in bk.prune(str(f), 2)] == [names[1]]
    assert (tmp_path / "hosts.2.2019-01-01@00:00:00~").is_symlink() and f.exists()


# ---------------------------------------------------------------- outputs of the CLI


def _with_secret(sim: Sim) -> None:
    sim.set_var(None, ddp_env_extra={"WANDB_API_KEY": SECRET, "HTTPS_PROXY": f"http://bob:{SECRET}@10.0.0.9:3128"})


def _env_cli(sim: Sim, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    from click.testing import CliRunner

    import ddpfix.cli.env as env_cli
    from ddpfix.cli import cli

    monkeypatch.setattr(env_cli, "cluster_of", lambda app: sim.cluster())
    monkeypatch.setattr(env_cli.pipeline, "collect", lambda cluster, **_: (sim.context(), None))
    return CliRunner().invoke(cli, ["env", "-i", "x.yml", *args])


def test_env_command_outputs_redact_secrets(sim: Sim, monkeypatch: pytest.MonkeyPatch, scratch: Path) -> None:
    _with_secret(sim)
    for args in ([], ["--format", "json"], ["--node", "node2", "--stdout"]):
        r = _env_cli(sim, monkeypatch, *args)
        assert r.exit_code == 0, r.output
        assert SECRET not in r.output and "WANDB_API_KEY=***" in r.output and "HTTPS_PROXY=***" in r.output, args
        assert "MASTER_ADDR=192.168.77.11" in r.output
    r = _env_cli(sim, monkeypatch, "--node", "node2", "--stdout", "--show-secrets")
    assert r.exit_code == 0 and f"WANDB_API_KEY={SECRET}" in r.output  # asked for, for a launch script
    r = _env_cli(sim, monkeypatch, "--show-secrets")
    assert r.exit_code == 2 and "--show-secrets goes with --stdout" in r.output
    out = scratch / "envs"
    r = _env_cli(sim, monkeypatch, "--local-dir", str(out))
    assert r.exit_code == 0 and SECRET not in r.output
    f = out / "node2.env"
    assert SECRET in f.read_text() and stat.S_IMODE(f.stat().st_mode) == 0o600  # in its file, owner-only
    assert stat.S_IMODE(out.stat().st_mode) == 0o700


def test_audit_outputs_never_show_a_secret(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import ddpfix.audit
    import ddpfix.cli.audit as audit_cli
    from ddpfix.cli import cli

    _with_secret(sim)
    sim.write_planned_env_files(node2={"WANDB_API_KEY": "stale-key-1234"})
    monkeypatch.setattr(ddpfix.audit, "collect", lambda cluster, **_: (sim.context(), None))
    monkeypatch.setattr(audit_cli, "inventory_of", lambda app: ("x.yml",))
    for args in (["-v"], *(["--format", f] for f in ("json", "text", "table", "plain", "html", "junit"))):
        r = CliRunner().invoke(cli, ["audit", "-i", "x.yml", *args] if args[0] != "-v" else ["-v", "audit", "-i",
                                                                                           "x.yml"])
        assert env_rules.INCONSISTENT.id in r.output, (args, r.output)
        assert SECRET not in r.output and "stale-key-1234" not in r.output and "bob:" not in r.output, args
        assert args[-1] == "plain" or "WANDB_API_KEY=***" in r.output, args  # plain: no evidence


# ---------------------------------------------------------------- the controller's run directories


def test_state_and_run_directories_are_private_and_keep_no_secret(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpfix.ansible.rundirs import (
        as_data,
        new_run_dir,
        owner_only,
        private_umask,
        redact_extravars,
        release_run_dir,
        write_extravars,
    )

    state = tmp_path / "a" / "state"
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(state))
    old = os.umask(0o022)
    try:
        d = new_run_dir("audit")
        for p in (state, state / "runs", d):
            assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
        assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700  # created by ddpfix: private too
        with private_umask():
            (d / "fact_cache").mkdir()
            (d / "fact_cache" / "node1").write_text("{}")
        assert stat.S_IMODE((d / "fact_cache").stat().st_mode) == 0o700
        assert stat.S_IMODE((d / "fact_cache" / "node1").stat().st_mode) == 0o600
        assert os.umask(0o022) == 0o022  # restored after the run
        os.chmod(d / "fact_cache" / "node1", 0o644)  # as Ansible's jsonfile cache leaves its files
        owner_only(d)
        assert stat.S_IMODE((d / "fact_cache" / "node1").stat().st_mode) == 0o600
    finally:
        os.umask(old)
        release_run_dir(d)
    extra = {"ddpfix_plan": {"node1": {"env": {"WANDB_API_KEY": SECRET, "MASTER_ADDR": "10.0.0.1",
                                               "HTTPS_PROXY": f"http://u:{SECRET}@h:3128"},
                                       "body": f"A=1\nDB_PASS={SECRET}\n"}},
             "ddpfix_target": "node1,node2"}
    path = write_extravars(d, extra)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    redact_extravars(d)
    doc = json.loads(path.read_text())
    assert SECRET not in path.read_text()

    def plain(o: Any) -> Any:  # the file holds as_data's {"__ansible_unsafe": s} wrappers, once
        if isinstance(o, dict):
            return o["__ansible_unsafe"] if set(o) == {"__ansible_unsafe"} else {k: plain(v) for k, v in o.items()}
        return o

    assert doc == as_data(plain(doc))
    doc = plain(doc)
    assert doc["ddpfix_plan"]["node1"]["env"] == {"WANDB_API_KEY": "***", "MASTER_ADDR": "10.0.0.1",
                                                  "HTTPS_PROXY": "***"}
    assert doc["ddpfix_plan"]["node1"]["body"] == "A=1\nDB_PASS=***\n" and doc["ddpfix_target"] == "node1,node2"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_existing_foreign_state_ancestors_are_not_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpfix import paths

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o1777)
    paths.private_dir(shared / "ddpfix" / "runs")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777  # e.g. /tmp: never tightened
    assert stat.S_IMODE((shared / "ddpfix").stat().st_mode) == 0o700


def test_node_returned_digests_are_validated_like_any_node_value() -> None:
    from ddpfix.factguard.facts import guard_facts

    good = {"salt": "0" * 32, "values": {"WANDB_API_KEY": "a" * 64}, "managed": {}}
    problems, facts = guard_facts({"env_file": {"values": {}, "managed": {}, "outside_keys": [], "secrets": good}})
    assert not problems and facts["env_file"]["secrets"] == good
    bad = {"salt": "{{ 7*191 }}", "values": {"K": "a" * 64}}
    problems, facts = guard_facts({"env_file": {"values": {}, "managed": {}, "outside_keys": [], "secrets": bad}})
    assert problems and "secrets" not in facts["env_file"]
    bad = {"salt": "0" * 32, "values": {"K": "$(id)", "BAD KEY": "a" * 64, "OK_KEY": "b" * 64}}
    problems, facts = guard_facts({"env_file": {"values": {}, "managed": {}, "outside_keys": [], "secrets": bad}})
    assert len(problems) == 2 and facts["env_file"]["secrets"]["values"] == {"OK_KEY": "b" * 64}


# ---------------------------------------------------------------- ddpfix_node_files: a node's files in one call


def _files_args(scratch: Path, body: str, **kw: Any) -> dict[str, Any]:
    (scratch / "hosts").exists() or (scratch / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 node1\n")
    return {"lock_path": str(scratch / "ddpfix.lock"), "lock_holder": {"run_id": "r1", "pid": 1},
            "hosts": {"path": str(scratch / "hosts"), "entries": [{"address": "10.0.0.1", "names": ["node1"]}]},
            "env_path": str(scratch / "etc" / "ddp.env"), "body": body,
            "cluster_file": {"path": str(scratch / "etc" / "cluster.json"), "content": '{"a": 1}\n'}, **kw}


def test_node_files_one_call_writes_all_backs_up_unlocks_and_keeps_secrets_out(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], scratch: Path) -> None:
    args = _files_args(scratch, _body())
    res = _run_module(monkeypatch, capsys, args, check=True, name="ddpfix_node_files")
    journal = "\n".join(res["_journal"])  # (the first call's: _run_module's journal patches nest)
    assert "body=NOT_LOGGING_PARAMETER" in journal and SECRET not in journal and SECRET not in json.dumps(res)
    assert res["changed"] and [f["key"] for f in res["files"] if f["changed"]] == ["hosts", "env", "cluster_file"]
    assert not (scratch / "etc").exists() and "node1" in (scratch / "hosts").read_text().splitlines()[1]  # check mode
    assert not (scratch / "ddpfix.lock").exists() and res["held"] is False
    res = _run_module(monkeypatch, capsys, args, name="ddpfix_node_files")
    assert res["changed"] and not res.get("failed"), res
    assert (scratch / "etc" / "cluster.json").read_text() == '{"a": 1}\n'
    assert SECRET in (scratch / "etc" / "ddp.env").read_text() and "10.0.0.1\tnode1" in (scratch / "hosts").read_text()
    assert stat.S_IMODE((scratch / "etc" / "ddp.env").stat().st_mode) == 0o600
    assert res["files"][0]["backup_file"] and not (scratch / "ddpfix.lock").exists()  # the hosts file had one
    assert SECRET not in json.dumps(res)
    # named as the fix tasks are: `Fix <the ids of the role that writes the file> | what` (generated from the rules)
    assert [f["what"].split(" | ")[0] for f in res["files"]] == [
        f"Fix {tags.what_label(k)}" for k in ("hosts", "env", "cluster_file")]
    res = _run_module(monkeypatch, capsys, args, name="ddpfix_node_files")  # idempotent
    assert not res["changed"] and not any(f["changed"] for f in res["files"])
    # the play passes the cluster file's JSON without a line break (to_nice_json): the file still ends with one,
    # the same text the dry run previews (clusterfile.text), so nothing changes
    args["cluster_file"]["content"] = '{"a": 1}'
    res = _run_module(monkeypatch, capsys, args, name="ddpfix_node_files")
    assert not res["changed"] and (scratch / "etc" / "cluster.json").read_text() == '{"a": 1}\n'


def test_node_files_refuses_under_another_runs_lock_and_when_a_file_cannot_be_written(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], scratch: Path) -> None:
    import socket

    other = {"run_id": "other", "pid": os.getpid(), "controller": socket.gethostname()}
    lock = collection_lock()
    lock.write_lock(str(scratch / "ddpfix.lock"), dict(other, node_boot_id=lock.boot_id(), node_pid=os.getpid(),
                                                        node_pid_start=lock.proc_start(os.getpid()),
                                                        pidns=lock.pid_namespace(), boot_id=lock.boot_id()))
    res = _run_module(monkeypatch, capsys, _files_args(scratch, "A=1\n"), name="ddpfix_node_files")
    assert res.get("failed") and res.get("locked") and not (scratch / "etc").exists(), res
    (scratch / "ddpfix.lock").unlink()
    (scratch / "etc").write_text("a file where the directory should be\n")
    hosts_before = (scratch / "hosts").read_text()
    res = _run_module(monkeypatch, capsys, _files_args(scratch, "A=1\n", env_path=None), name="ddpfix_node_files")
    assert res.get("failed") and "cannot write" in res["msg"], res
    assert (scratch / "hosts").read_text() == hosts_before and not (scratch / "ddpfix.lock").exists()


def _dropins(tmp: Path, soft: str) -> list[dict[str, Any]]:
    """The limits drop-ins as the controller renders them for a node (writes.limits_files: the open-file limit's and
    the locked-memory limit's, a launcher unit each), their paths moved under `tmp`."""
    from ddpfix.remediate.plan import HostPlan
    from ddpfix.remediate.writes import UNIT_DIR, limits_files

    node = Node(name="n1", address="10.0.0.1", rank=0,
                role_vars={"ddp_launcher_units": ["trainer.service"], "ddpfix_limits_path": str(tmp / "memlock.conf"),
                           "ddpfix_limits_nofile_path": str(tmp / "limits.d" / "90-ddpfix-nofile.conf")})
    files = limits_files(HostPlan(limits=True, nofile={"soft": soft, "hard": "0", "unit_hard": "infinity"}), node)
    return [dict(f, path=f["path"].replace(UNIT_DIR, str(tmp / "systemd"))) for f in files]


def test_node_files_writes_the_limits_drop_ins_with_the_env_file_in_one_call_and_reloads_systemd_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], scratch: Path) -> None:
    """The limits drop-ins rendered on the controller go in the node's one ddpfix_node_files call with its env file:
    locked, checked, created with their directories (0755), backed up when they change, idempotent; systemd's
    daemon-reload runs once when a unit's drop-in changed, never in check mode, never where systemd does not run."""
    from ansible.module_utils import basic

    from ddpfix.ansible import collection

    mod = collection.module("ddpfix_node_files")
    running = scratch / "run-systemd"
    monkeypatch.setattr(mod, "SYSTEMD_RUNNING", str(running))
    calls: list[list[str]] = []
    run_command = basic.AnsibleModule.run_command

    def systemctl(self: Any, args: Any, **kw: Any) -> Any:  # systemctl recorded; lsattr (the backups) runs
        if "systemctl" not in str(args[0]):
            return run_command(self, args, **kw)
        calls.append(list(args))
        return 0, "", ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", systemctl)
    (scratch / "limits.d").mkdir()
    (scratch / "memlock.conf").write_text("# an old memlock drop-in\n")
    args = {**_files_args(scratch, "A=1\n", hosts=None, cluster_file=None), "files": _dropins(scratch, "65536")}
    unit = scratch / "systemd" / "trainer.service.d" / "90-ddpfix-nofile.conf"

    res = _run_module(monkeypatch, capsys, args, check=True, name="ddpfix_node_files")
    assert res["changed"] and not res["daemon_reloaded"] and not calls and not unit.parent.exists(), res
    assert [(f["key"], f["changed"]) for f in res["files"]] == [("env", True)] + [
        (k, True) for k in ("memlock", "memlock", "nofile", "nofile")]
    assert [f["what"] for f in res["files"][1:]] == [f["what"] for f in args["files"]]
    assert "+LimitNOFILE=65536:infinity" in render_diff(res["files"][4]["diff"])
    running.mkdir()
    res = _run_module(monkeypatch, capsys, args, name="ddpfix_node_files")
    assert res["changed"] and res["daemon_reloaded"] and [c[1:] for c in calls] == [["daemon-reload"]], res
    assert unit.read_text() == args["files"][3]["content"] and not (scratch / "ddpfix.lock").exists()
    assert stat.S_IMODE(unit.parent.stat().st_mode) == 0o755 and stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert res["files"][1]["backup_file"] and (scratch / "memlock.conf").read_text() == args["files"][0]["content"]
    res = _run_module(monkeypatch, capsys, args, name="ddpfix_node_files")  # idempotent: nothing written, no reload
    assert not res["changed"] and not res["daemon_reloaded"] and len(calls) == 1, res
    # a new value: only the open-file limit's drop-ins change (backed up); no systemd here: written, not reloaded
    running.rmdir()
    args["files"] = _dropins(scratch, "131072")
    res = _run_module(monkeypatch, capsys, args, name="ddpfix_node_files")
    assert [f["key"] for f in res["files"] if f["changed"]] == ["nofile", "nofile"] and not res["daemon_reloaded"]
    assert "LimitNOFILE=131072:infinity" in unit.read_text() and len(calls) == 1
    assert all(f["backup_file"] for f in res["files"] if f["changed"])
    # a drop-in that cannot be written (a file where its directory would be): nothing is written on the node, the
    # lock is released
    (scratch / "afile").write_text("not a directory\n")
    args["files"] = _dropins(scratch, "262144")
    args["files"][0]["path"] = str(scratch / "afile" / "memlock.conf")
    res = _run_module(monkeypatch, capsys, args, name="ddpfix_node_files")
    assert res.get("failed") and "not a directory" in res["msg"], res
    assert "131072" in unit.read_text() and not (scratch / "ddpfix.lock").exists()


def collection_lock() -> Any:
    from ddpfix.ansible import collection

    return collection.module_utils("ddpfix_lock")


def test_scrub_redacts_env_extra_pairs_of_a_handed_along_cluster() -> None:
    """The audit play's first task hands the derived cluster along (`dataclasses.asdict`: each node's env_extra is a
    list of [key, value] pairs): what ansible-runner writes to job_events/ must not hold the secret values (found by
    test_env_file_lab's secret trail after the pipeline merge)."""
    node = Node(name="n1", address="10.0.0.1", rank=0,
                env_extra=(("WANDB_API_KEY", "wandb-5c0ffee"), ("OMP_NUM_THREADS", "4"),
                           ("HTTPS_PROXY", "http://u:pw@10.0.0.9:3128")))
    res = {"cluster": {"nodes": [dataclasses.asdict(node)]}, "addresses": [["n1", "10.0.0.1"]]}
    out = json.dumps(scrub(json.loads(json.dumps(res))))
    assert "wandb-5c0ffee" not in out and "pw@" not in out, out
    assert '["OMP_NUM_THREADS", "4"]' in out and '["n1", "10.0.0.1"]' in out, out
