"""Exit codes and the error type every layer raises; imports nothing of ddpfix."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes shared by every subcommand (documented in the README)."""

    OK = 0
    FINDINGS = 1  # findings at/above --fail-on, pending changes, or a refused partial write
    INVALID_INPUT = 2  # bad inventory, bad options: nothing was run
    RUN_FAILED = 3  # Ansible failed
    PREREQUISITE = 4  # the controller machine lacks something (ansible-playbook, root, a package)
    LOCKED = 5  # another ddpfix run holds the cluster's lock or a node's lock (the holder is named)
    INTERRUPTED = 6  # Ctrl-C/SIGTERM: running tasks finished, no new one started, changes so far listed


#: What each exit code means, as `ddpfix --help` lists them.
EXIT_CODE_MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "success: nothing at or above --fail-on, nothing (left) to change, every check passed",
    ExitCode.FINDINGS: "findings at or above --fail-on, changes pending (dry run), or a check that failed",
    ExitCode.INVALID_INPUT: "invalid input (inventory, options, variables): nothing was run or changed",
    ExitCode.RUN_FAILED: "the run failed (Ansible, a node, or ddpfix itself; -v shows more)",
    ExitCode.PREREQUISITE: "this machine lacks something (ansible-playbook, root, a package)",
    ExitCode.LOCKED: "another ddpfix run holds the cluster's or a node's lock (the holder is named)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C, SIGTERM): running tasks finished, the changes so far are listed",
}


class DdpfixError(Exception):
    """An error with a one-line message and the exit code it maps to."""

    def __init__(self, message: str, code: ExitCode = ExitCode.INVALID_INPUT) -> None:
        super().__init__(message)
        self.code = code
