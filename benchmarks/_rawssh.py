#!/usr/bin/env python3
"""The raw parallel-SSH floor: one `ssh` per node, all at once, each running the reads the audit's module does
(interfaces, routes, /etc/hosts, firewall rule sets, chrony, hostname, sockets). Exits 0 when every ssh did.

    _rawssh.py SSH_CONFIG NODE...
"""

from __future__ import annotations

import subprocess
import sys

READS = ("hostname; cat /etc/machine-id; ip -j -d addr show; ip -j route show; cat /etc/hosts; "
         "cat /proc/net/tcp /proc/net/tcp6; iptables-save 2>&1; nft -j list ruleset 2>&1; "
         "chronyc -c -n tracking 2>&1; cat /proc/sys/net/ipv4/ip_local_port_range /proc/sys/net/core/somaxconn")


def main() -> int:
    cfg, nodes = sys.argv[1], sys.argv[2:]
    procs = [subprocess.Popen(["ssh", "-F", cfg, "-o", "ControlMaster=no", "-o", "BatchMode=yes", n, READS],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for n in nodes]
    bad = 0
    for p in procs:
        out, _ = p.communicate(timeout=120)
        bad += p.returncode != 0 or not out
    print(f"raw-ssh: {len(nodes) - bad}/{len(nodes)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
