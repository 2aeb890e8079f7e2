#!/usr/bin/env python3
"""The audit's fixed controller cost in the CLI process outside the playbook, in one fresh process
(benchmarks/run.py runs it several times and keeps the medians):

    python _fixed.py   ->   {"cli_import_s": ...}

cli_import_s: importing the ddpfix CLI and its `audit` subcommand (what `ddpfix audit` pays before it parses its
arguments). The CLI does not read the inventory: ansible-playbook reads it, once, and the audit play's first task
(on the controller) hands the cluster to the CLI.
"""

from __future__ import annotations

import json
import time


def main() -> None:
    t0 = time.perf_counter()
    import ddpfix.cli
    import ddpfix.cli.audit  # noqa: F401

    t1 = time.perf_counter()
    print(json.dumps({"cli_import_s": round(t1 - t0, 3)}))


if __name__ == "__main__":
    main()
