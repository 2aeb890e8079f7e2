#!/usr/bin/env python3
"""Run the ddpfix CLI with Ansible/ansible-runner settings overridden, for the settings experiments.

    BENCH_ENV='{"ANSIBLE_PIPELINING": "False"}' python _variant.py -i INV audit --format json

Nothing in the repository is changed; this process patches, in memory only:
  BENCH_ENV           JSON object merged over `ddpfix.runner.ansible_env()` (a null value removes the key)
  BENCH_RUNNER_KWARGS JSON object merged into the `ansible_runner.run(...)` keyword arguments
  BENCH_NO_EVENT_FILES=1  the event handler returns False: ansible-runner writes no job_events/*.json
  BENCH_ANSIBLE_ROOT  a copy of the content root (the collection: playbooks/, roles/, plugins/, meta/,
                      galaxy.yml), modified, used instead of the installed one (the mitogen variants)
  BENCH_SKIP_NOOP_REAUDIT=1  `remediate --apply` reuses its first audit instead of re-auditing when the play
                      changed nothing and no host failed (prototype of a proposed change)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    import ansible_runner

    from ddpfix import paths, runner

    env_over = json.loads(os.environ.get("BENCH_ENV") or "{}")
    kw_over = json.loads(os.environ.get("BENCH_RUNNER_KWARGS") or "{}")
    no_files = os.environ.get("BENCH_NO_EVENT_FILES") == "1"
    root = os.environ.get("BENCH_ANSIBLE_ROOT")

    if env_over:
        orig_env = runner.ansible_env

        def ansible_env(*args, **kwargs):  # type: ignore[no-untyped-def]
            env = orig_env(*args, **kwargs)
            for k, v in env_over.items():
                if v is None:
                    env.pop(k, None)
                else:
                    env[k] = str(v)
            return env

        runner.ansible_env = ansible_env  # type: ignore[assignment]
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

    if os.environ.get("BENCH_SKIP_NOOP_REAUDIT") == "1":
        import ddpfix.cli.remediate as rem

        seen: dict[str, object] = {}
        orig_audit, orig_rem = rem.run_audit, rem.run_remediation

        def run_remediation(*a, **kw):  # type: ignore[no-untyped-def]
            run, changes = orig_rem(*a, **kw)
            seen["noop"] = run.changed() == 0 and not any(h.failed or h.unreachable for h in run.hosts.values())
            return run, changes

        def run_audit(*a, **kw):  # type: ignore[no-untyped-def]
            if "before" in seen and seen.get("noop"):
                return seen["before"]  # nothing changed: the first audit is still the state of the cluster
            seen["before"] = orig_audit(*a, **kw)
            return seen["before"]

        rem.run_audit, rem.run_remediation = run_audit, run_remediation  # type: ignore[assignment]

    from ddpfix.cli import main as cli_main

    sys.argv[0] = "ddpfix"
    cli_main()


if __name__ == "__main__":
    main()
