"""The env file's block body from its jinja2 template: the role's `templates/ddp.env.j2` or `ddp_env_template`.

This renders it on the controller, once per template and process (jinja2 compiles it once), for `ddpfix env` (print,
--stdout, --local-dir), for deciding whether a node's block differs, for remediate's dry run and for the body
remediate's play hands the node's module (the plan's `env_body`), which parses and checks its lines: one renderer, so
all agree. The role ddpfix_env, run on its own, renders the same template (`lookup('template', ...)`, trim_blocks).
"""

from __future__ import annotations

import dataclasses
import functools
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


@functools.lru_cache(maxsize=8)
def _environment(directory: str) -> Any:
    """One jinja2 environment per template directory and process: it compiles each template once (its own cache,
    reloaded when the file changes), not once per node."""
    # CLI start: jinja2 loads only to render a template (the audit renders one only for ddp_env_template): the
    # rule modules import this one before every run, and jinja2 took 14 ms of that start
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(directory), trim_blocks=True, keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined, autoescape=False)


def render_text(template: str | None, plan: NodePlan) -> str:
    """The template's text for `plan` (what remediate's play hands ddpfix_node_files as the block's body); bad
    template -> exit 2 naming ddp_env_template."""
    import jinja2  # CLI start: for its TemplateError only, loaded by _environment anyway (see there)

    path = Path(template_path(template))
    what = f"ddp_env_template {path}" if template else f"the env template {path}"
    try:
        text: str = _environment(str(path.parent)).get_template(path.name).render(
            ddpfix_env_values=dict(plan.env), ddpfix_env_comment=env_comment(plan),
            ddpfix_env_key_comments=dict(plan.comments), inventory_hostname=plan.name)
    except jinja2.TemplateError as exc:
        raise DdpfixError(f"{what}: cannot render for {plan.name}: {exc}", ExitCode.INVALID_INPUT) from exc
    return text


def render_body(template: str | None, plan: NodePlan) -> tuple[list[str], dict[str, str]]:
    """(body lines, their KEY=VALUE values) for `plan`; bad template output -> exit 2 naming ddp_env_template."""
    text = render_text(template, plan)
    lines, values, bad = envfile_lib().parse_body(text)
    if bad:
        what = f"ddp_env_template {template}" if template else f"the env template {template_path(template)}"
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
