"""How remediate fixes findings (see ``ddpfix.model.finding.Remedy``): the role whose fix tasks carry the rule ids
as tags, and the remediate plan field that turns it on. Shared by the rule areas whose rules one role fixes."""

from __future__ import annotations

from ddpfix.model.finding import Remedy

FIREWALL = Remedy("ddpfix_firewall", "firewall")
VIA_FIREWALL = Remedy("ddpfix_firewall", "firewall", how="firewall", on_target=True)
HOSTS = Remedy("ddpfix_hosts", "hosts")
HOSTS_BLOCK = Remedy("ddpfix_hosts", "hosts", how="hosts block")
CHRONY = Remedy("ddpfix_chrony", "time")
ENV = Remedy("ddpfix_env", "env")
ENV_FILE = Remedy("ddpfix_env", "env", how="env file")
PIN_IFNAME = Remedy("ddpfix_ifname", "pin_ifname", how="--pin-ifnames")
