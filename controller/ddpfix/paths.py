"""Where ddpfix finds its Ansible content and keeps its state."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def ansible_root() -> Path:
    """Directory holding `playbooks/` and `roles/`.

    In a wheel they are shipped inside the package (`ddpfix/_ansible`); in a source
    checkout (editable install, tests) they sit at the repository root.
    """
    shipped = _PKG / "_ansible"
    if (shipped / "playbooks").is_dir():
        return shipped
    return _PKG.parent.parent


def playbook(name: str) -> Path:
    return ansible_root() / "playbooks" / name


def roles_dir() -> Path:
    return ansible_root() / "roles"


def state_dir() -> Path:
    """Per-user state (run directories). Honours DDPFIX_STATE_DIR and XDG_STATE_HOME."""
    env = os.environ.get("DDPFIX_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ddpfix"
