"""The firewall evaluator (controller side): does traffic from the cluster to a TCP port get accepted?

The node's collector (``plugins/module_utils/ddpfix_firewall.py``) only reads the rule sets; the decisions are made
here, one module per layer (`firewalld`, `iptables`, `nftables`), the shared types in `verdict`, and the rule set as
a whole (parsed once, asked many questions) in `ruleset`.
"""

from ddpfix.firewall.ruleset import (
    SCHEMA,
    TEST_NET_SOURCES,
    Ruleset,
    Rulesets,
    State,
    evaluate,
    ports_blocked,
    sample_ports,
    world_open,
)
from ddpfix.firewall.verdict import Action, BudgetExceeded, LayerResult, Packet, Verdict, budget

__all__ = ["SCHEMA", "TEST_NET_SOURCES", "Action", "BudgetExceeded", "LayerResult", "Packet", "Ruleset", "Rulesets",
           "State", "Verdict", "budget", "evaluate", "ports_blocked", "sample_ports", "world_open"]
