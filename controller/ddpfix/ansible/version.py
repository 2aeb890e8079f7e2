"""`ddpfix --version`, as `ansible --version` writes its own: ddpfix's version, then what it runs with (ansible-core,
Python, the config file, the collection ddpfix.cluster and the collections path Ansible gets)."""

from __future__ import annotations

import os
import sys

from ddpfix import __version__, paths
from ddpfix.ansible import config as ansiblecfg


def version_lines() -> list[str]:
    """The lines; nothing is created (the state directory's collection link is made by a run)."""
    import ansible  # --version only: ansible-core's own package
    import ansible.release  # --version only

    cfg = ansiblecfg.load(())
    user = cfg.value(ansiblecfg.SETTINGS["ANSIBLE_COLLECTIONS_PATH"], os.environ)
    theirs = user if user is not None else ansiblecfg.DEFAULT_COLLECTIONS_PATH
    search = f"{paths.collections_base()}{os.pathsep}{theirs}"
    return [
        f"ddpfix {__version__}",
        f"  ansible-core = {ansible.release.__version__} ({os.path.dirname(ansible.__file__)})",
        f"  python = {sys.version.split()[0]} ({sys.executable})",
        f"  config file = {cfg.path if cfg.path is not None else 'None'}",
        f"  ddpfix.cluster = {paths.ansible_root()}",
        f"  collections path = {search}",
    ]
