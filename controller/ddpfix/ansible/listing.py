"""The inventory as Ansible reads it (`ansible-inventory --list`, in-process when it can): the hosts and their
variables, the user's -e applied over them."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpfix.ansible import args as ansibleargs
from ddpfix.ansible.env import STRICT_INVENTORY, ansible_env, environ
from ddpfix.ansible.results import short_line
from ddpfix.ansible.rundirs import discard_run_dir, new_run_dir, private_umask
from ddpfix.errors import DdpfixError, ExitCode


def check_inventory_paths(inventories: Sequence[str]) -> None:
    """Every inventory source exists (an ad-hoc host list is a file by now)."""
    for inv in inventories:
        if not Path(inv).exists():
            raise DdpfixError(f"inventory not found: {inv}", ExitCode.INVALID_INPUT)


def list_inventory(inventories: Sequence[str]) -> dict[str, Any]:
    """What `ansible-inventory --list` prints (groups and merged host vars), read in this process with Ansible's
    own InventoryCLI (the user's ansible.cfg, inventory plugins, group_vars/host_vars), without a second process.
    Falls back to `ansible-inventory` through ansible-runner when Ansible's configuration was already loaded in this
    process from another config file (its settings are read once per process)."""
    check_inventory_paths(inventories)
    run_dir = new_run_dir("inventory")
    env = {**ansible_env(run_dir, 1, inventories), **STRICT_INVENTORY}
    try:
        data = _inventory_in_process(inventories, env)
        if data is None:
            data = _inventory_subprocess(inventories, env, run_dir)
    finally:
        discard_run_dir(run_dir)
    # -e: the highest precedence, over every host's variables, as in ansible-playbook's hostvars
    return ansibleargs.apply_to_inventory(data, ansibleargs.current().extra_vars)


def _inventory_in_process(inventories: Sequence[str], env: Mapping[str, str]) -> dict[str, Any] | None:
    loaded = sys.modules.get("ansible.constants")
    if loaded is not None and str(getattr(loaded, "CONFIG_FILE", None) or "") != str(env.get("ANSIBLE_CONFIG") or ""):
        return None  # Ansible's settings were read already, from another file: ask a fresh process
    if loaded is not None and not all(getattr(loaded, k, False) is True
                                      for k in ("INVENTORY_UNPARSED_IS_FAILED", "INVENTORY_ANY_UNPARSED_IS_FAILED")):
        return None  # ... or without the strict inventory settings (something imported Ansible before this read)
    with environ(env):
        # ansible-core reads its settings (the env set above) when imported, and loads slowly: only here
        from ansible import constants as C
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import init_plugin_loader
        from ansible.vars.manager import VariableManager

        quiet = io.StringIO()  # Ansible's warnings (a source no plugin parsed) stay out of ddpfix's output
        try:
            with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "AnsibleCollectionFinder has already been configured" (2nd read)
                init_plugin_loader([])
                loader = DataLoader()
                inventory = InventoryManager(loader=loader, sources=[str(Path(i).resolve()) for i in inventories])
                vm = VariableManager(loader=loader, inventory=inventory)
                data = _inventory_list(inventory, vm, C.INTERNAL_STATIC_VARS)
            return dict(json.loads(json.dumps(data, default=_json_plain)))
        except AnsibleError as exc:
            raise DdpfixError(f"cannot read inventory {', '.join(inventories)}: {short_line(exc)}") from None


def _json_plain(value: Any) -> Any:
    """`json.dumps`'s fallback for the values of an inventory read in this process, as `ansible-inventory --list`
    prints them: plain data whatever ansible-core 2.17-2.19 wrapped them in. Its str/int/float/dict/list subclasses
    (AnsibleUnsafeText, 2.19's tagged values) are written as what they are by json itself; here dates become ISO
    text, sets and tuples lists, bytes text, and anything else its text (a vaulted value: its plain text, as
    ansible-inventory prints it). Nothing is templated: a value is read as it is, "{{ ... }}" stays that text."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def _inventory_list(inventory: Any, vm: Any, internal: Any) -> dict[str, Any]:
    """`ansible-inventory --list` (InventoryCLI.json_inventory without --export): groups with their direct hosts
    and children, and every host's merged variables minus Ansible's internal ones."""
    seen: set[str] = set()
    hosts = inventory.get_hosts("all")
    available = frozenset(h.name for h in hosts)
    out: dict[str, Any] = {}

    def group(g: Any) -> None:
        entry: dict[str, Any] = {}
        if g.name != "all":
            entry["hosts"] = [h.name for h in g.hosts if h.name in available]
        entry["children"] = [c.name for c in g.child_groups]
        for c in g.child_groups:
            if c.name not in seen:
                seen.add(c.name)
                group(c)
        entry = {k: v for k, v in entry.items() if v}
        if entry:
            out[g.name] = entry

    group(inventory.groups["all"])
    hostvars = {}
    for h in hosts:
        hv = vm.get_vars(host=h, include_hostvars=False, stage="all")
        hv = {k: v for k, v in hv.items() if k not in internal}
        if hv:
            hostvars[h.name] = hv
    out["_meta"] = {"hostvars": hostvars}
    return out


def _inventory_subprocess(inventories: Sequence[str], env: Mapping[str, str], run_dir: Path) -> dict[str, Any]:
    import ansible_runner  # slow import (CLI start): only when Ansible lists the inventory

    with private_umask():
        out, err = ansible_runner.get_inventory(
            action="list",
            inventories=[str(Path(i).resolve()) for i in inventories],
            response_format="json",
            quiet=True,
            private_data_dir=str(run_dir),
            envvars=dict(env),
        )
    if not out:
        raise DdpfixError(f"cannot read inventory {', '.join(inventories)}: {short_line(err or 'no output')}")
    return dict(out if isinstance(out, dict) else json.loads(out))
