"""The collection's Python plugins, loaded on the controller by path (one place).

The node-side modules and their module_utils live in the `ddpfix.cluster` collection (`plugins/`). Some of their
pure functions also run on the controller (the env file's managed block, the probe plan, the node facts collector
for `ddpfix check --local`); they are imported here from the files Ansible ships to nodes, under the names Ansible
itself gives them (`ansible_collections.ddpfix.cluster.plugins.<kind>.<name>`), so a module's own
`from ansible_collections.ddpfix.cluster.plugins.module_utils.X import ...` resolves to the same objects.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

from ddpfix import paths

PACKAGE = "ansible_collections.{}.{}.plugins".format(*paths.COLLECTION)
_MODULE_UTILS_IMPORT = re.compile(r"^from ansible_collections\.\w+\.\w+\.plugins\.module_utils\.(\w+) import", re.M)


def _load(kind: str, name: str) -> ModuleType:
    fullname = f"{PACKAGE}.{kind}.{name}"
    mod = sys.modules.get(fullname)
    if mod is not None:
        return mod
    path = paths.plugins_dir() / kind / f"{name}.py"
    if kind != "module_utils":
        for util in sorted((paths.plugins_dir() / "module_utils").glob("*.py")):
            _load("module_utils", util.stem)
    else:  # the module_utils it imports first (their names resolve from sys.modules, as Ansible's loader serves them)
        for dep in _MODULE_UTILS_IMPORT.findall(path.read_text()):
            if dep != name:
                _load("module_utils", dep)
    spec = importlib.util.spec_from_file_location(fullname, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[fullname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[fullname]
        raise
    return mod


def module_utils(name: str) -> ModuleType:
    """plugins/module_utils/NAME.py."""
    return _load("module_utils", name)


def module(name: str) -> ModuleType:
    """plugins/modules/NAME.py (its module_utils imports served from the collection's files)."""
    return _load("modules", name)


def filter_plugin(name: str) -> ModuleType:
    """plugins/filter/NAME.py."""
    return _load("filter", name)


def plugin_utils(name: str) -> ModuleType:
    """plugins/plugin_utils/NAME.py (what the controller-side plugins import)."""
    return _load("plugin_utils", name)


def action_plugin(name: str) -> ModuleType:
    """plugins/action/NAME.py (its module_utils imports served from the collection's files)."""
    return _load("action", name)
