"""Property tests of the trust boundary (hypothesis): random and hostile strings in what nodes return.

A node-fact field is chosen from the table of every string field (test_factguard.CASES: the recorded clean cluster
with RDMA, MAC and env-file facts) and given a random value built from template syntax, line breaks, NUL, terminal
escapes, shell metacharacters, lone surrogates (what undecodable bytes become) and very long text. Through
validation, analysis, the plan and every renderer: nothing raises, nothing of the value reaches what ddpfix writes
or hands a play, no output carries a raw control character, and a line break in a value never starts a line.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_factguard import CASES, _set, _sim_with_fabric, _written
from unit_helpers import MARK, Sim, hostile

from ddpfix import render, report
from ddpfix.audit import audit_report
from ddpfix.factguard.facts import validate_facts
from ddpfix.rules.engine import run_checks

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # \t and \n are the renderers' own layout


def _outputs(doc: dict[str, Any]) -> dict[str, str]:
    return {"json": report.to_json(doc), "text": render.render_text(doc, width=120), "plain": render.render_plain(doc),
            "junit": render.render_junit(doc), "prometheus": render.render_prometheus(doc),
            "html": render.render_html(doc)}


CLEAN_WRITTEN = {tree: _written(_sim_with_fabric(tree)) for tree in ("ib_hdr", "roce")}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), value=hostile)
def test_hostile_node_values_never_escape(case: tuple[str, str, list[Any]], value: str) -> None:
    tree, path, keys = case
    sim = _sim_with_fabric(tree)
    _set(sim.node("node2"), keys, value)
    for fld, shown, why in validate_facts(sim.node("node2")):
        assert isinstance(fld, str) and isinstance(shown, str) and isinstance(why, str)
    written = _written(sim)
    for atom in ("{{", "{%", "{#", "$(", "\x00", "\x1b", MARK):
        if atom not in CLEAN_WRITTEN[tree]:
            assert atom not in written, (path, value)
    if len(value) >= 8 and value not in CLEAN_WRITTEN[tree]:
        assert value not in written, (path, value)
    ctx = sim.context()
    doc, _ = audit_report(ctx, run_checks(ctx))
    for kind, text in _outputs(doc).items():
        assert not _CONTROL.search(text), (kind, path, value, _CONTROL.search(text))
        assert not any(line.lstrip().startswith(MARK) for line in text.splitlines()), (kind, path, value)


# ---------------------------------------------------------------- inventory variables

#: every variable of the inventory contract (README "Inventory contract"), set on node2 as the inventory author would
INVENTORY_VARS = ("ddp_master", "ddp_master_port", "ddp_cluster_cidr", "ddp_cluster_cidr_ack_broad", "ddp_node_rank",
                  "ddp_nproc_per_node", "ddp_env_path", "ddp_env_adopt", "ddp_env_process_vars", "ddp_env_template",
                  "ddp_firewall", "ddp_ntp_servers", "ddp_ntp_local_master", "ddp_skip_findings", "ddp_memlock",
                  "ddp_socket_ifname", "ddp_python", "ddp_nccl_ib_hca", "ddp_nccl_ib_gid_index", "ddp_backup_keep",
                  "ddp_hosts_domains")


def _role_vars() -> list[str]:
    from ddpfix.inventory.contract import role_var_specs

    return sorted(role_var_specs())


def _one_line_naming(exc: Exception, *names: str) -> None:
    text = str(exc)
    assert "\n" not in text and "\r" not in text, text
    assert any(n in text for n in names), (names, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(var=st.sampled_from(INVENTORY_VARS + tuple(_role_vars()) + ("ddp_env_extra:key", "ddp_env_extra:value")),
       value=hostile)
def test_hostile_inventory_values_are_refused_in_one_line_or_kept_literal(var: str, value: str) -> None:
    """Only the documented refusal may come out (DdpfixError, exit 2, one line naming the variable); a value that is
    accepted never breaks a line of an env file or the hosts block, and never carries template syntax into them."""
    from ddpfix.errors import DdpfixError, ExitCode
    from ddpfix.plan import hosts_block, render_env

    sim = Sim()
    if var == "ddp_env_extra:key":
        sim.set_var("node2", ddp_env_extra={value: "1"})
        names: tuple[str, ...] = ("ddp_env_extra",)
    elif var == "ddp_env_extra:value":
        sim.set_var("node2", ddp_env_extra={"MY_SETTING": value})
        names = ("ddp_env_extra", "MY_SETTING")
    else:
        sim.set_var("node2", **{var: value})
        names = (var,)
    try:
        ctx = sim.context()
    except DdpfixError as exc:
        assert exc.code == ExitCode.INVALID_INPUT, (var, value, exc)
        _one_line_naming(exc, *names)
        return
    written = "\n".join([hosts_block(ctx.plan), *(render_env(p) for p in ctx.plan.values())])
    assert not any(line.lstrip().startswith(MARK) for line in written.splitlines()), (var, value)
    assert "{{" not in written and "{%" not in written and "\x00" not in written, (var, value)
