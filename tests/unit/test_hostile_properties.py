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

from ddpfix import render, report
from ddpfix.audit import audit_report
from ddpfix.checks import run_checks
from ddpfix.factguard import validate_facts

ATOMS = ["{{ 7*191 }}", "{{", "}}", "{%", "%}", "{#", "$(id)", "`id`", ";", "|", "&&", "\n", "\r\n", "\x00", "\x1b[2J",
         "\x1b]0;x\x07", "'", '"', "\\", " ", "\t", "..", "/", "%s", "\udcff", "\u2028", "=", "#", "mlx5_0", "eth0",
         "192.168.77.11", "::1"]
MARK = "ZZ1337"
hostile = st.one_of(
    st.lists(st.one_of(st.sampled_from(ATOMS), st.text(max_size=6)), max_size=10).map("".join),
    st.builds(lambda a, b: f"{a}\n{MARK}{b}", st.text(max_size=20), st.text(max_size=20)),
    st.text(min_size=300, max_size=600),
    st.text(max_size=40),
)
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
