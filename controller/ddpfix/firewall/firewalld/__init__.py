"""firewalld: its model read from the facts (`model`), the evaluator that decides what it does with a packet
(`evaluate`, used by the audit), and the fix that changes it where its owner keeps it, proven with the same evaluator
(`fix`, used by the remediation's plan). Every name is importable from here."""

from __future__ import annotations

from ddpfix.firewall.firewalld.evaluate import (
    direct_target,
    egress_zone,
    evaluate,
    evaluate_egress,
    host_policies,
    port_marks,
)
from ddpfix.firewall.firewalld.fix import RICH_FROM, RICH_TO, Change, FixPlan, ingress_zones, plan_fix
from ddpfix.firewall.firewalld.model import (
    DirectRule,
    Element,
    Firewalld,
    Pairs,
    Policy,
    RichRule,
    Service,
    Zone,
    parse_rich,
    service_ports,
)

__all__ = [
    "RICH_FROM", "RICH_TO", "Change", "DirectRule", "Element", "Firewalld", "FixPlan", "Pairs", "Policy", "RichRule",
    "Service", "Zone", "direct_target", "egress_zone", "evaluate", "evaluate_egress", "host_policies", "ingress_zones",
    "parse_rich", "plan_fix", "port_marks", "service_ports",
]
