"""The env file's block body from its jinja2 template: the role's `templates/ddp.env.j2` or `ddp_env_template`.

The role renders the same template on the controller (`lookup('template', ...)`, trim_blocks) and the module
parses and checks its lines; this renders it here for `ddpfix env` (print, --stdout, --local-dir) and for deciding
whether a node's block differs, with the same variables and the same line checks, so both agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpfix import paths
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.plan import EnvJudgement, NodePlan, env_comment, envfile_lib, judge_env


def default_template() -> Path:
    return paths.roles_dir() / "ddpfix_env" / "templates" / "ddp.env.j2"


def template_path(custom: str | None) -> str:
    return str(custom or default_template())


def render_body(template: str | None, plan: NodePlan) -> tuple[list[str], dict[str, str]]:
    """(body lines, their KEY=VALUE values) for `plan`; bad template output -> exit 2 naming ddp_env_template."""
    # CLI start: jinja2 loads only to render a template (the audit renders one only for ddp_env_template): the
    # rule modules import this one before every run, and jinja2 took 14 ms of that start
    import jinja2

    path = Path(template_path(template))
    what = f"ddp_env_template {path}" if template else f"the env template {path}"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(path.parent)), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
    try:
        text = env.get_template(path.name).render(ddpfix_env_values=dict(plan.env),
                                                  ddpfix_env_comment=env_comment(plan),
                                                  ddpfix_env_key_comments=dict(plan.comments),
                                                  inventory_hostname=plan.name)
    except jinja2.TemplateError as exc:
        raise DdpfixError(f"{what}: cannot render for {plan.name}: {exc}", ExitCode.INVALID_INPUT) from exc
    lines, values, bad = envfile_lib().parse_body(text)
    if bad:
        raise DdpfixError(f"{what} on {plan.name}: {bad}", ExitCode.INVALID_INPUT)
    return lines, values


def render_file(template: str | None, plan: NodePlan) -> str:
    """One node's env file as ddpfix writes it where none exists (the managed block alone)."""
    lines, _ = render_body(template, plan)
    return "\n".join(envfile_lib().body_block(lines)) + "\n"


def judge(env_file: Mapping[str, Any], plan: NodePlan, template: str | None) -> EnvJudgement:
    """`judge_env` against the keys the template writes (the plan's, for the role's template): the one judgement of
    "the env file differs from the plan", honouring ddp_env_template, for the audit, remediate and verify."""
    if template:
        plan = dataclasses.replace(plan, env=render_body(template, plan)[1])
    return judge_env(env_file, plan)


def write_needed(env_file: Mapping[str, Any], plan: NodePlan, template: str | None) -> bool:
    return judge(env_file, plan, template).write
