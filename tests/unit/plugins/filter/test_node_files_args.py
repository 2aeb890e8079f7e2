"""The write call's arguments (plugins/filter/ddpfix_node_files_args.py): what remediate's cluster-wide play writes on
a node, from what the play decided once (failed nodes, --tags / --skip-tags, cluster-wide values) and the node's plan."""

from __future__ import annotations

from typing import Any

from unit_helpers import load_role_module

fa = load_role_module("filter/ddpfix_node_files_args.py", "ddpfix_node_files_args")

DROPINS = [{"key": "nofile", "path": "/etc/security/limits.d/90-ddpfix.conf"},
           {"key": "memlock", "path": "/etc/security/limits.d/91-ddpfix.conf"}]


def _run(**over: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "failed": [], "tags": [], "skip_tags": [], "hosts_tagged": False, "env_tagged": False,
        "nofile_tagged": False, "memlock_tagged": False, "hosts": [{"ip": "10.0.0.1", "names": ["n1"]}],
        "env_path": "/etc/ddpfix/ddp.env", "adopt": False, "cluster_text": "{}\n", "lock_path": "/run/ddpfix.lock",
        "lock_holder": {"run_id": "r1"}, "lock_stale_minutes": 20}
    run.update(over)
    return run


def _plan(**over: Any) -> dict[str, Any]:
    plan: dict[str, Any] = {"hosts": True, "hosts_path": "/etc/hosts", "env": ["netif"], "env_body": "A=1\n",
                            "cluster_path": "/etc/ddpfix/cluster.json", "files": DROPINS}
    plan.update(over)
    return plan


def test_everything_planned_is_written_without_tags() -> None:
    assert fa.FilterModule().filters()["ddpfix_node_files_args"] is fa.ddpfix_node_files_args
    assert fa.ddpfix_node_files_args(_run(), _plan()) == {
        "lock_path": "/run/ddpfix.lock", "lock_holder": {"run_id": "r1"}, "lock_stale_minutes": 20, "adopt": False,
        "files": DROPINS, "hosts": {"path": "/etc/hosts", "entries": _run()["hosts"]},
        "env_path": "/etc/ddpfix/ddp.env", "body": "A=1\n",
        "cluster_file": {"path": "/etc/ddpfix/cluster.json", "mode": "0644", "content": "{}\n"}}


def test_a_failed_node_keeps_the_cluster_wide_files_off_every_node_but_not_the_dropins() -> None:
    args = fa.ddpfix_node_files_args(_run(failed=["n2"]), _plan())
    assert args is not None and args["files"] == DROPINS
    assert not {"hosts", "env_path", "body", "cluster_file"} & set(args)
    assert fa.ddpfix_node_files_args(_run(failed=["n2"]), _plan(files=[])) is None  # nothing to write: skipped


def test_tags_and_skip_tags_select_the_groups() -> None:
    env_only = fa.ddpfix_node_files_args(_run(tags=["env"], env_tagged=True), _plan())
    assert env_only is not None and env_only["files"] == [] and "hosts" not in env_only and "body" in env_only
    hosts_only = fa.ddpfix_node_files_args(_run(tags=["hosts"], hosts_tagged=True), _plan())
    assert hosts_only is not None and "hosts" in hosts_only and "env_path" not in hosts_only
    nofile = fa.ddpfix_node_files_args(_run(tags=["nofile"], nofile_tagged=True), _plan())
    assert nofile is not None and [f["key"] for f in nofile["files"]] == ["nofile"]
    skipped = fa.ddpfix_node_files_args(_run(skip_tags=["env", "memlock"]), _plan())
    assert skipped is not None and "env_path" not in skipped and "hosts" in skipped
    assert [f["key"] for f in skipped["files"]] == ["nofile"]
    assert fa.ddpfix_node_files_args(_run(tags=["time"]), _plan()) is None  # another group only: nothing here


def test_no_cluster_text_no_cluster_file_and_nothing_planned_nothing_written() -> None:
    args = fa.ddpfix_node_files_args(_run(cluster_text=""), _plan())
    assert args is not None and "cluster_file" not in args and "env_path" in args
    assert fa.ddpfix_node_files_args(_run(), _plan(hosts=False, env=[], files=[])) is None
    assert "hosts" not in (fa.ddpfix_node_files_args(_run(hosts=[]), _plan()) or {})
