"""The env file's block body from the role's jinja2 template or ddp_env_template; the module's body parsing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from unit_helpers import Sim, envfile

from ddpfix.envtemplate import render_body, render_file, write_needed
from ddpfix.errors import DdpfixError
from ddpfix.plan import env_comment, plan_cluster, render_env
from ddpfix.rules import env as env_rules


def _plans(sim: Sim):
    return plan_cluster(sim.cluster(), {n: d["node"] for n, d in sim.docs.items()})


def test_role_template_renders_the_block_render_block_writes(sim: Sim) -> None:
    for p in _plans(sim).values():
        assert render_file(None, p) == render_env(p)
        lines, values = render_body(None, p)
        assert values == p.env and lines[0] == "# " + env_comment(p)


def test_custom_template_adds_keys_and_changes_what_is_needed(sim: Sim, tmp_path: Path) -> None:
    t = tmp_path / "my.env.j2"
    t.write_text("# {{ inventory_hostname }}\n{% for k, v in ddpfix_env_values.items() %}{{ k }}={{ v }}\n{% endfor %}"
                 "OMP_NUM_THREADS=4\n")
    p = _plans(sim)["node2"]
    text = render_file(str(t), p)
    assert "\n# node2\n" in text and "\nOMP_NUM_THREADS=4\n" in text and text.startswith(envfile().BEGIN)
    ef = {"exists": True, "owner": "block", "managed": dict(p.env), "outside_keys": []}
    assert not write_needed(ef, p, None) and write_needed(ef, p, str(t))
    assert not write_needed({**ef, "managed": {**p.env, "OMP_NUM_THREADS": "4"}}, p, str(t))


def test_audit_and_remediate_judge_the_env_file_against_the_template(sim: Sim, tmp_path: Path) -> None:
    """"The env file differs from the plan" is judged once (envtemplate.judge), honouring ddp_env_template: a file
    as the template writes it is neither env_rules.INCONSISTENT nor rewritten; one that lacks a key the template writes
    is both (before, the audit compared it with the role's keys and reported a key the template leaves out)."""
    from ddpfix.audit import AuditResult
    from ddpfix.pipeline import plan
    from ddpfix.rules.engine import run_checks

    t = tmp_path / "no-tp.env.j2"
    t.write_text("{% for k, v in ddpfix_env_values.items() if k != 'TP_SOCKET_IFNAME' %}{{ k }}={{ v }}\n{% endfor %}"
                 "OMP_NUM_THREADS=4\n")
    sim.set_var(None, ddp_env_template=str(t))
    plans = _plans(sim)
    for n, p in plans.items():
        sim.set_env_file(n, render_file(str(t), p))

    def judged() -> tuple[set[str], set[str]]:
        ctx = sim.context()
        findings = run_checks(ctx)
        fixes = plan(AuditResult(ctx.cluster, ctx, findings, None), only={env_rules.INCONSISTENT.id})  # type: ignore[arg-type]
        return {f.host or "" for f in findings if f.id == env_rules.INCONSISTENT.id}, {h for h, p in fixes.todo.items() if p.env}

    assert judged() == (set(), set())
    sim.set_env_file("node2", render_file(str(t), plans["node2"]).replace("OMP_NUM_THREADS=4\n", ""))
    assert judged() == ({"node2"}, {"node2"})


@pytest.mark.parametrize("body, why", [
    ("A=1\nB\n", "line 2 is not KEY=VALUE"),
    ("export B=2\n", "'export B' is not a valid variable name"),  # docker --env-file would refuse the key
    ("A=1\nA=2\n", "assigns A a second time"),
    ("A=hello world\n", "A='hello world' would need quoting"),
    ("1A=x\n", "not a valid variable name"),
])
def test_bad_template_output_is_refused_naming_the_variable(sim: Sim, tmp_path: Path, body: str, why: str) -> None:
    t = tmp_path / "bad.j2"
    t.write_text(body)
    with pytest.raises(DdpfixError, match="ddp_env_template") as exc:
        render_file(str(t), _plans(sim)["node1"])
    assert why in str(exc.value) and exc.value.code == 2
    assert why in envfile().parse_body(body)[2]


def test_missing_template_is_an_inventory_error(sim: Sim) -> None:
    sim.set_var(None, ddp_env_template="/nonexistent/ddp.env.j2")
    with pytest.raises(DdpfixError, match=re.escape("ddp_env_template '/nonexistent/ddp.env.j2': no readable file")):
        sim.cluster()


def test_body_block_merges_like_values() -> None:
    lib = envfile()
    lines, values, bad = lib.parse_body("\n# node a\nA=1\nB=x=y\n\n")
    assert bad is None and values == {"A": "1", "B": "x=y"}
    text, sup = lib.merge("A=0\nUSER_KEY=1\n", values, adopt=True, block=lib.body_block(lines))
    assert sup == ["A"] and "USER_KEY=1\n" in text and "# node a\nA=1\nB=x=y\n" in text


def test_env_cli_sbatch_script_and_option_errors() -> None:
    from click.testing import CliRunner

    from ddpfix.cli import cli

    r = CliRunner().invoke(cli, ["-i", "a,b,c,", "env", "--format", "sbatch", "--", "train.py", "--lr", "0.1"])
    assert r.exit_code == 0, r.output
    # a batch script: directives, then one task per node that evaluates this job's values on its node at run time
    assert r.output == (
        "#!/bin/bash\n# Written by `ddpfix env --format sbatch` for the inventory's 3 nodes: sbatch this file.\n"
        "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n#SBATCH --nodelist=a,b,c\nexport DDPFIX_NPROC_PER_NODE=1\n"
        "srun --kill-on-bad-exit=1 bash -c 'if [ -r /etc/ddpfix/ddp.env ]; then set -a; . /etc/ddpfix/ddp.env; set +a; "
        "fi; v=$(${DDPFIX:-ddpfix} env --slurm --export) && eval \"$v\" && exec torchrun --max-restarts=0 \"$@\"' "
        "torchrun train.py --lr 0.1\n")
    for args, why in ((["--stdout"], "--stdout prints one node's file: give --node NAME"),
                      (["--stdout", "--node", "zz"], "--node 'zz' is not a host of the inventory"),
                      (["--format", "sbatch", "--apply"], "--format sbatch prints a batch script only"),
                      (["--node", "a", "--apply"], "to write on some nodes use --limit")):
        r = CliRunner().invoke(cli, ["-i", "a,b,c,", "env", *args])
        assert r.exit_code == 2 and why in r.output, (args, r.output)
