"""Where ddpfix finds its Ansible content and keeps its state."""

from __future__ import annotations

import hashlib
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


COLLECTION = ("ddpfix", "cluster")


def plugins_dir() -> Path:
    """The collection's `plugins/` (modules, module_utils, action and filter plugins)."""
    return ansible_root() / "plugins"


def collections_dir() -> Path:
    """A collections path in which `ddpfix.cluster` is this installation's content (checkout or wheel).

    The content root (`ansible_root()`) is the collection; Ansible finds it through a symlink
    `<state>/collections/<hash of the root>/ansible_collections/ddpfix/cluster`, made (or corrected) here."""
    target = ansible_root()
    base = collections_base()
    link = base.joinpath("ansible_collections", *COLLECTION)
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        link.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = link.with_name(f".{link.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    return base


def collections_base() -> Path:
    """Where `collections_dir` is (nothing is made here): one directory per content root, so two installations
    (checkouts, venvs) of one user never repoint each other's link."""
    return state_dir() / "collections" / hashlib.sha256(str(ansible_root()).encode()).hexdigest()[:16]


def state_dir() -> Path:
    """Per-user state (run directories). Honours DDPFIX_STATE_DIR and XDG_STATE_HOME."""
    env = os.environ.get("DDPFIX_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ddpfix"


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can enter (0700): missing directories up to it are created 0700 (the
    state directory itself, when ddpfix creates it), and `path` itself is set to 0700. An existing ancestor (a
    DDPFIX_STATE_DIR someone else made, /tmp) is never changed."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)
    if path.stat().st_uid == os.geteuid():
        os.chmod(path, 0o700)
    return path
