"""Remediation's dry-run renderer: the changes computed on the controller from the audit's facts (`preview`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpfix import clusterfile
from ddpfix.ansible.collection import module_utils
from ddpfix.envtemplate import render_body
from ddpfix.plan import envfile_lib
from ddpfix.remediate.changes import Change, render_diff
from ddpfix.remediate.plan import FILE_RULES, HostPlan
from ddpfix.remediate.preflight import facts_preflight
from ddpfix.remediate.writes import NOFILE_TASK, UNIT_NOFILE_TASK, nofile_texts
from ddpfix.rules.context import Context
from ddpfix.rules.host import NOFILE_LOW


def preview(ctx: Context, plans: dict[str, HostPlan]) -> tuple[list[Change], dict[str, str], dict[str, HostPlan]]:
    """The dry run's changes computed here, from what the audit read, where that is enough: a node whose fixes are
    its env file (and the cluster file next to it) and the open-file limit's drop-ins, or one of them, whose facts
    carry the files' text (the env file redacted) and what of them cannot be written. The env file's new text comes
    from the same merge the node's module runs (module_utils ddpfix_envfile), the drop-ins' from the renderer whose
    text --apply hands the node (`nofile_files`). Returns (changes, failures as failures_of words them, the plans left
    for the check-mode play)."""
    checked, failed = facts_preflight(ctx, plans, nofile=True)
    if failed:  # the play's pre-flight words it, on every node, as --apply would meet it
        return [], {}, plans
    changes: list[Change] = []
    rest: dict[str, HostPlan] = {}
    for host, hp in plans.items():
        mine = _env_preview(ctx, host) if host in checked and hp.env else []
        if host in checked and hp.nofile and mine is not None:
            more = _nofile_preview(ctx, host, hp)
            mine = None if more is None else mine + more
        if host not in checked or mine is None:
            rest[host] = hp  # another fix, or facts from an older ddpfix or too large a file: the node is asked
            continue
        changes += mine
    return changes, failed, rest


def _env_preview(ctx: Context, host: str) -> list[Change] | None:
    """The env file's and the cluster file's changes on `host`, or None when its facts cannot tell them."""
    c = ctx.cluster
    lib, what = envfile_lib(), module_utils("ddpfix_files").WHAT
    ef: dict[str, Any] = dict((ctx.facts.get(host) or {}).get("env_file") or {})
    cf: dict[str, Any] = dict(ef.get("cluster_file") or {})
    if ("text" not in ef or "exists" not in cf
            or (ef.get("exists") and ef.get("text") is None) or (cf["exists"] and cf.get("text") is None)):
        return None
    path = c.env_path
    target = str(ef.get("target") or path)
    before = str(ef.get("text") or "")
    lines, values = render_body(c.env_template, ctx.plan[host])
    try:
        after, _ = lib.merge(before, values, "", adopt=lib.may_adopt(path, target, c.env_adopt),
                             block=lib.body_block(lines))
    except lib.NotOurs:
        return None  # the module words the refusal
    out = [Change(host, what["env"].format(path=path), render_diff(
        {"before": before, "after": after, "before_header": target if ef.get("exists") else "/dev/null",
         "after_header": target}), FILE_RULES["env"])]
    cluster_path = clusterfile.path_for(c.env_path)
    cluster_text = clusterfile.text(clusterfile.build(ctx))
    if not cf["exists"] or cf.get("text") != cluster_text:
        out.append(Change(host, what["cluster_file"].format(path=cluster_path), render_diff(
            {"before": str(cf.get("text") or ""), "after": cluster_text,
             "before_header": cluster_path if cf["exists"] else "/dev/null", "after_header": cluster_path}),
            FILE_RULES["cluster_file"]))
    return out


def _nofile_preview(ctx: Context, host: str, hp: HostPlan) -> list[Change] | None:
    """The open-file limit's drop-ins that change on `host`, or None when its facts cannot tell them."""
    dropins = ((ctx.facts.get(host) or {}).get("limits") or {}).get("nofile_dropins")
    if not isinstance(dropins, Mapping):
        return None
    files = nofile_files(hp.nofile, dropins)
    if files is None or any(f["exists"] and f.get("text") is None for _, f, _ in files):
        return None
    rules = (NOFILE_LOW.id,)
    return [Change(host, task, render_diff({"before": str(f.get("text") or ""), "after": text,
                                            "before_header": f["path"] if f["exists"] else "/dev/null",
                                            "after_header": f["path"]}), rules)
            for task, f, text in files if not f["exists"] or f.get("text") != text]


def nofile_files(nofile: Mapping[str, str],
                 dropins: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]] | None:
    """What the open-file limit's fix writes on a node, rendered as --apply writes it (`writes.nofile_texts`, the one
    renderer): (what it is, the file as the audit read it (`limits.nofile_dropins`), its new text) for the pam_limits
    drop-in and each launcher unit's. None for values the drop-ins cannot take (the plan refuses them)."""
    try:
        pam_text, unit_text = nofile_texts(nofile)
    except ValueError:
        return None
    pam = dropins["pam"]
    return [(NOFILE_TASK.format(path=pam["path"]), pam, pam_text)] + [
        (UNIT_NOFILE_TASK.format(unit=u), f, unit_text) for u, f in sorted(dropins["units"].items())]
