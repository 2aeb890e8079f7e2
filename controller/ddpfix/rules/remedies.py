"""How remediate fixes findings (see ``ddpfix.model.finding.Remedy``): the role whose fix tasks carry the rule ids
as tags, and the remediate plan field that turns it on. Shared by the rule areas whose rules one role fixes."""

from __future__ import annotations

from ddpfix.model.finding import Remedy

FIREWALL = Remedy("ddpfix_firewall", "firewall", tags=("", "firewall"))
VIA_FIREWALL = Remedy("ddpfix_firewall", "firewall", how="firewall", on_target=True, tags=("", "firewall"))
HOSTS = Remedy("ddpfix_hosts", "hosts", tags=("hosts",))
HOSTS_BLOCK = Remedy("ddpfix_hosts", "hosts", how="hosts block", tags=("hosts",))
CHRONY = Remedy("ddpfix_chrony", "time", tags=("", "time"))
#: chrony's installation too (only a node without a time daemon needs it)
CHRONY_INSTALL = Remedy("ddpfix_chrony", "time", tags=("", "time", "chrony_install"))
ENV = Remedy("ddpfix_env", "env", tags=("env",))
ENV_FILE = Remedy("ddpfix_env", "env", how="env file", tags=("env",))
PIN_IFNAME = Remedy("ddpfix_ifname", "pin_ifname", how="--pin-ifnames", tags=("ifname",))
