"""Remediation: turn an audit into a per-host plan of fixes, run it (check+diff or apply), re-audit.

One module per concern; every name is importable from here as before:

- `plan`: which fixes each host gets (`build_plan`, `HostPlan`, the finding ids that turn each part on);
- `preflight`: what is refused before any node is touched, and the write pre-flight read from the audit's facts;
- `run`: the play's extra vars, the play itself, its failures and what it left unfixed;
- `preview`: the dry run's changes computed here from the audit's facts;
- `changes`: a run's changes (`Change`) and their rendered diffs.
"""

from __future__ import annotations

from ddpfix.remediate.changes import Change, changes_of, render_diff
from ddpfix.remediate.plan import (
    ARP_IDS,
    EGRESS_IDS,
    ENV_IDS,
    FILE_RULES,
    FIREWALL_IDS,
    HOSTS_IDS,
    LIMITS_IDS,
    NOFILE_IDS,
    PROBE_IDS,
    TIME_IDS,
    HostPlan,
    build_plan,
    firewall_backend,
    firewalld_files,
    firewalld_fix,
    host_setting_fixes,
    master_unknown,
    nft_ingress,
    pin_target,
)
from ddpfix.remediate.preflight import PREFLIGHT_STEP, facts_preflight, preflight, remediate_checked
from ddpfix.remediate.preview import nofile_files, preview
from ddpfix.remediate.run import (
    cluster_files_refusal,
    failures_of,
    not_effective,
    remaining_fixable,
    remediate_extravars,
    run_remediation,
)
from ddpfix.remediate.writes import NOFILE_TASK, UNIT_NOFILE_TASK

__all__ = [
    "ARP_IDS", "EGRESS_IDS", "ENV_IDS", "FILE_RULES", "FIREWALL_IDS", "HOSTS_IDS", "LIMITS_IDS", "NOFILE_IDS",
    "NOFILE_TASK", "PREFLIGHT_STEP", "PROBE_IDS", "TIME_IDS", "UNIT_NOFILE_TASK", "Change", "HostPlan", "build_plan",
    "changes_of", "cluster_files_refusal", "facts_preflight", "failures_of", "firewall_backend", "firewalld_files",
    "firewalld_fix", "host_setting_fixes", "master_unknown", "nft_ingress", "nofile_files", "not_effective",
    "pin_target", "preflight", "preview", "remaining_fixable", "remediate_checked", "remediate_extravars",
    "render_diff", "run_remediation",
]
