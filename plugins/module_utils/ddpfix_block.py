"""The markers of ddpfix's managed blocks, one definition for every file ddpfix edits in place (the env file,
/etc/hosts, iptables/nftables persistence files): ddpfix owns the lines between them, and only those."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

BEGIN = "# BEGIN ddpfix managed block"
END = "# END ddpfix managed block"
