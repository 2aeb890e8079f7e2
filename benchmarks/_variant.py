#!/usr/bin/env python3
"""Run the ddpfix CLI with Ansible/ansible-runner settings overridden, for the settings experiments.

    BENCH_ENV='{"ANSIBLE_PIPELINING": "False"}' python _variant.py -i INV audit --format json

Nothing in the repository is changed; this process patches, in memory only:
  BENCH_ENV           JSON object merged over `ddpfix.ansible.env.ansible_env()` (a null value removes the key)
  BENCH_RUNNER_KWARGS JSON object merged into the `ansible_runner.run(...)` keyword arguments
  BENCH_NO_EVENT_FILES=1  the event handler returns False: ansible-runner writes no job_events/*.json
  BENCH_ANSIBLE_ROOT  a copy of the content root (the collection: playbooks/, roles/, plugins/, meta/,
                      galaxy.yml), modified, used instead of the installed one (the mitogen variants)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    import ansible_runner

    from ddpfix import paths
    from ddpfix.ansible import env as ansible_envs
    from ddpfix.ansible import listing as ansible_listing
    from ddpfix.ansible import run as ansible_run

    env_over = json.loads(os.environ.get("BENCH_ENV") or "{}")
    kw_over = json.loads(os.environ.get("BENCH_RUNNER_KWARGS") or "{}")
    no_files = os.environ.get("BENCH_NO_EVENT_FILES") == "1"
    root = os.environ.get("BENCH_ANSIBLE_ROOT")

    if env_over:
        orig_env = ansible_envs.ansible_env

        def ansible_env(*args, **kwargs):  # type: ignore[no-untyped-def]
            env = orig_env(*args, **kwargs)
            for k, v in env_over.items():
                if v is None:
                    env.pop(k, None)
                else:
                    env[k] = str(v)
            return env

        for mod in (ansible_run, ansible_listing):  # the modules that read it
            mod.ansible_env = ansible_env  # type: ignore[assignment]
    if kw_over or no_files:
        orig_run = ansible_runner.run

        def run(**kw):  # type: ignore[no-untyped-def]
            kw.update(kw_over)
            if no_files and kw.get("event_handler"):
                h = kw["event_handler"]
                kw["event_handler"] = lambda e: (h(e), False)[1]
            return orig_run(**kw)

        ansible_runner.run = run  # type: ignore[assignment]
    if root:
        paths.ansible_root = lambda: Path(root)  # type: ignore[assignment]

    from ddpfix.cli import main as cli_main

    sys.argv[0] = "ddpfix"
    cli_main()


if __name__ == "__main__":
    main()
