"""The env file's managed block (roles/ddpfix_env/module_utils/ddpfix_envfile.py, pure, no host) and the
controller's use of it (plan.env_write_needed / env_not_ours, remediate.build_plan)."""

from __future__ import annotations

from pathlib import Path

import pytest
from unit_helpers import ROOT, Sim, envfile, nodeinfo

from ddpfix.plan import env_comment, env_not_ours, env_write_needed, plan_cluster, render_env
from ddpfix.remediate import build_plan

lib = envfile()
parse = nodeinfo().parse_env_file
VALUES = {"MASTER_ADDR": "192.168.77.11", "MASTER_PORT": "29500", "NNODES": "2", "NODE_RANK": "1",
          "NCCL_SOCKET_IFNAME": "=eth0"}
BLOCK = lib.render_block(VALUES, "node node2 (rank 1)")
USER = """# my cluster settings
NCCL_IB_HCA=mlx5_0,mlx5_1
export NCCL_DEBUG=INFO
WANDB_API_KEY='abc123secret'
HF_TOKEN=hf_xyz
"""
OLD = """# Managed by ddpfix: rewritten by `ddpfix env --apply`; local edits are replaced.
# node node2 (rank 1)
MASTER_ADDR=10.0.0.1
MASTER_PORT=29500
NNODES=2
NODE_RANK=1
WORLD_SIZE=2
RANK=1
NCCL_DEBUG=WARN
"""


def test_new_file_is_the_block_alone() -> None:
    text, superseded = lib.merge("", VALUES, "node node2 (rank 1)")
    assert text.splitlines() == BLOCK and superseded == []
    assert lib.ownership(text) == "block"
    assert parse(text) == VALUES


def test_foreign_file_refused_unless_adopted() -> None:
    assert lib.ownership(USER) == "foreign"
    with pytest.raises(lib.NotOurs):
        lib.merge(USER, VALUES)
    text, _ = lib.merge(USER, VALUES, "node node2 (rank 1)", adopt=True)
    assert text.startswith(USER)  # every user line kept verbatim, the block after them
    assert text.splitlines()[-len(BLOCK):] == BLOCK
    assert parse(text) == {**parse(USER), **VALUES}


def test_empty_file_is_not_foreign() -> None:
    assert lib.ownership("\n \n") == "empty"
    text, _ = lib.merge("\n", VALUES)
    assert lib.ownership(text) == "block"


def test_existing_block_replaced_in_place_user_lines_kept_and_idempotent() -> None:
    first, _ = lib.merge(USER, {"MASTER_ADDR": "10.9.9.9", "RANK": "1"}, adopt=True)
    first += "EXTRA_AFTER=1\n"  # the user added a line after the block
    second, _ = lib.merge(first, VALUES, "node node2 (rank 1)")
    lines = second.splitlines()
    assert lines[-1] == "EXTRA_AFTER=1" and lines[-1 - len(BLOCK):-1] == BLOCK
    assert "RANK=1" not in lines  # a key ddpfix no longer manages leaves with the block
    assert second.startswith(USER)
    assert lib.merge(second, VALUES, "node node2 (rank 1)") == (second, [])


def test_managed_key_outside_block_is_superseded_not_left_to_shadow() -> None:
    user = "MASTER_ADDR=203.0.113.10\nexport NODE_RANK=7\n# MASTER_PORT=1 (a comment stays)\nFOO=bar\n"
    text, superseded = lib.merge(user, VALUES, adopt=True)
    assert superseded == ["MASTER_ADDR", "NODE_RANK"]
    assert lib.SUPERSEDED + "MASTER_ADDR=203.0.113.10" in text.splitlines()
    assert lib.SUPERSEDED + "export NODE_RANK=7" in text.splitlines()
    assert "# MASTER_PORT=1 (a comment stays)" in text.splitlines()
    assert parse(text)["MASTER_ADDR"] == "192.168.77.11" and parse(text)["FOO"] == "bar"
    assert lib.outside_keys(text) == ["FOO"]
    # also when the user puts one after an existing block: bash would let it win
    again, sup = lib.merge(text + "NODE_RANK=9\n", VALUES)
    assert sup == ["NODE_RANK"] and parse(again)["NODE_RANK"] == "1"
    assert lib.merge(again, VALUES) == (again, [])


def test_old_whole_file_format_converted_keeping_user_keys() -> None:
    assert lib.ownership(OLD) == "header"
    text, superseded = lib.merge(OLD, VALUES, "node node2 (rank 1)")
    assert superseded == []
    assert text.splitlines() == ["NCCL_DEBUG=WARN", "", *BLOCK]
    assert lib.managed_text(OLD) == OLD


def test_truncated_block_does_not_swallow_the_file() -> None:
    text = USER + lib.BEGIN + "\nMASTER_ADDR=1.2.3.4\n"  # BEGIN without END: not a block, a foreign file
    assert lib.ownership(text) == "foreign"
    merged, sup = lib.merge(text, VALUES, adopt=True)
    assert merged.startswith(USER) and sup == ["MASTER_ADDR"]


def test_multiline_quoted_value_is_one_statement() -> None:
    text = 'PRIVATE_KEY="-----BEGIN-----\nc2VjcmV0\n-----END-----"\nMASTER_ADDR=1.2.3.4\n'
    st = lib.statements(text.splitlines())
    assert [(a, b, k) for a, b, k, _ in st] == [(0, 2, "PRIVATE_KEY"), (3, 3, "MASTER_ADDR")]
    assert lib.redact(text) == "PRIVATE_KEY=***\nMASTER_ADDR=1.2.3.4\n"
    merged, _ = lib.merge(text, {"MASTER_ADDR": "10.0.0.1"}, adopt=True)
    assert "c2VjcmV0" in merged  # kept on the node ...
    assert "c2VjcmV0" not in lib.redact(merged)  # ... never shown


@pytest.mark.parametrize("key", ["WANDB_API_KEY", "HF_TOKEN", "aws_secret_access_key", "DB_PASSWORD", "SMTP_PASSWD",
                                 "GOOGLE_APPLICATION_CREDENTIALS", "ssh_key"])
def test_secret_looking_keys_redacted(key: str) -> None:
    assert lib.is_secret(key)
    text = f"{key}=s3cr3t\nexport {key}='s3cr3t'\n#{key}=s3cr3t\n  # export {key}=\"s3cr3t\" # old\n"
    red = lib.redact(text)
    assert "s3cr3t" not in red and red.count("***") == 4
    assert lib.redact_values(parse(text)) == {key: "***"}


def test_non_secret_keys_shown() -> None:
    for key in ("NCCL_IB_HCA", "MASTER_ADDR", "NCCL_DEBUG", "WANDB_PROJECT"):
        assert not lib.is_secret(key)
    assert lib.redact(USER) == USER.replace("'abc123secret'", "***").replace("hf_xyz", "***")


def test_values_that_need_quoting_refused() -> None:
    assert lib.check_values(VALUES) is None
    assert "quoting" in lib.check_values({"A": "x y"})
    assert "quoting" in lib.check_values({"A": "x\nB=1"})
    assert "not a valid variable name" in lib.check_values({"A-B": "1"})


def test_forbidden_dirs() -> None:
    assert lib.forbidden_dir("/tmp/ddp.env") == "/tmp"
    assert lib.forbidden_dir("/run/user/0/x") == "/run/user"
    assert lib.forbidden_dir("/tmpfoo/x") is None and lib.forbidden_dir("/etc/ddpfix/ddp.env") is None


# ---------------------------------------------------------------- controller


def _plans(sim: Sim):
    return plan_cluster(sim.cluster(), {n: d["node"] for n, d in sim.docs.items()})


def test_render_env_is_the_block_the_module_writes(sim: Sim) -> None:
    p = _plans(sim)["node2"]
    assert render_env(p) == lib.merge("", p.env, env_comment(p))[0]


def test_write_needed_compares_the_managed_part_only(sim: Sim) -> None:
    p = _plans(sim)["node2"]
    planned = render_env(p)
    sim.set_env_file("node2", USER + "\n" + planned)
    ef = sim.node("node2")["env_file"]
    assert ef["values"]["WANDB_API_KEY"] == "***" and ef["owner"] == "block"
    assert not env_write_needed(ef, p)  # user lines (and secrets) do not make it differ
    sim.set_env_file("node2", planned.replace("NODE_RANK=1", "NODE_RANK=2"))
    assert env_write_needed(sim.node("node2")["env_file"], p)
    sim.set_env_file("node2", planned + "MASTER_ADDR=203.0.113.10\n")  # shadows the block for bash
    assert env_write_needed(sim.node("node2")["env_file"], p)
    sim.set_env_file("node2", OLD)
    assert env_write_needed(sim.node("node2")["env_file"], p)
    assert not env_write_needed({"exists": True, "owner": "block", "managed": dict(p.env), "outside_keys": []}, p)
    assert env_write_needed({"exists": False, "path": "/etc/ddpfix/ddp.env"}, p)


def test_foreign_file_refuses_env_writes_on_every_node(sim: Sim) -> None:
    sim.set_var(None, ddp_env_path="/etc/environment")
    for n in ("node1", "node2", "node3"):
        sim.node(n)["env_file"]["path"] = "/etc/environment"
    sim.set_env_file("node2", 'PATH="/usr/local/sbin:/usr/bin"\n')
    why = env_not_ours(sim.node("node2")["env_file"], adopt=False)
    assert why and "/etc/environment" in why and "ddp_env_adopt" in why
    assert env_not_ours(sim.node("node2")["env_file"], adopt=True) is None
    ctx = sim.context()
    plans, refusals = build_plan(ctx, sim.findings())
    assert not any(hp.env for hp in plans.values())
    assert len(refusals) == 1 and "node2" in refusals[0] and "not written by ddpfix" in refusals[0]
    sim.set_var(None, ddp_env_adopt=True)
    ctx = sim.context()
    plans, refusals = build_plan(ctx, sim.findings())
    assert refusals == [] and all(hp.env for hp in plans.values())
    assert plans["node2"].env_comment == "node node2 (rank 1)"


def test_docs_name_the_block_markers() -> None:
    text = (Path(ROOT) / "docs" / "launch.md").read_text()  # "The env file and a launch script", moved from the README
    assert lib.BEGIN in text and lib.END in text and "ddp_env_adopt" in text


def test_file_in_ddpfix_own_directory_adopted_without_the_variable() -> None:
    ef = {"path": "/etc/ddpfix/ddp.env", "target": None, "exists": True, "readable": True, "owner": "foreign"}
    assert env_not_ours(ef, adopt=False) is None
    # ... but not through a symlink that leads elsewhere
    assert "not written by ddpfix" in env_not_ours(ef | {"target": "/etc/environment"}, adopt=False)
    assert lib.may_adopt("/etc/ddpfix/ddp.env", "/etc/ddpfix/ddp.env", False)
    assert not lib.may_adopt("/etc/ddpfix-x/ddp.env", None, False) and not lib.may_adopt("/etc/environment", None, False)
    assert "exists but cannot be read" in env_not_ours(ef | {"readable": False}, adopt=True)
