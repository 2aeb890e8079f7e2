#!/usr/bin/env python3
"""The audit's fixed controller costs outside the playbook, in one fresh process (benchmarks/run.py runs it
several times and keeps the medians):

    python _fixed.py INVENTORY   ->   {"cli_import_s": ..., "ansible_inventory_s": ...}

cli_import_s: importing the ddpfix CLI (what every command pays before it parses its arguments);
ansible_inventory_s: Ansible's imports and initialisation plus reading the inventory in process
(`ddpfix.runner.list_inventory`, what the CLI does to validate the inventory before any node is contacted; the
ansible-playbook process then pays its own Ansible initialisation again).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    t0 = time.perf_counter()
    import ddpfix.cli  # noqa: F401

    t1 = time.perf_counter()
    from ddpfix import runner

    runner.list_inventory([sys.argv[1]])
    t2 = time.perf_counter()
    print(json.dumps({"cli_import_s": round(t1 - t0, 3), "ansible_inventory_s": round(t2 - t1, 3)}))


if __name__ == "__main__":
    main()
