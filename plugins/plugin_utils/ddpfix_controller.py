"""Controller-side plugins (actions ddpfix_analyze and ddpfix_cluster) import the `ddpfix` Python package:
installed in the Python that runs ansible-playbook (the CLI's wheel, an execution environment), or, in a checkout
of this repository without an install, the package next to the collection (`<collection root>/controller`)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

#: The collection root: plugins/plugin_utils/<this file> -> ../..
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MISSING = ("the ddpfix Python package is not installed in the Python that runs Ansible ({python}): "
           "pip install ddpfix there (an AWX/AAP execution environment needs it too)")


def ddpfix(name: str = "ddpfix") -> Any:
    """`import ddpfix.<name>`, falling back to the checkout's controller/ directory."""
    try:
        return importlib.import_module(name)
    except ImportError:
        controller = os.path.join(COLLECTION_ROOT, "controller")
        if not os.path.isdir(os.path.join(controller, "ddpfix")) or controller in sys.path:
            raise ImportError(MISSING.format(python=sys.executable)) from None
        sys.path.append(controller)
        return importlib.import_module(name)


def inventory_tree(hostvars: Any, groups: Any) -> Any:
    """The group tree as `ansible-inventory --list` writes it (`{group: {hosts, children}}`) when the inventory is
    reachable through `hostvars` (so the host order is the CLI's), else the play's flat `groups`."""
    inventory = getattr(hostvars, "_inventory", None)
    if inventory is None or not hasattr(inventory, "groups"):
        return groups
    return {g.name: {"hosts": [h.name for h in g.hosts], "children": [c.name for c in g.child_groups]}
            for g in inventory.groups.values()}
