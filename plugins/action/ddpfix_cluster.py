"""Action plugin ddpfix.cluster.ddpfix_cluster: the cluster as ddpfix derives it from the inventory the play sees
(master, port, rank order, addresses, cluster network, env file path), validated by the `ddpfix` package's own
inventory code, on the controller, before any node is contacted. It also takes the ddpfix controller lock of that
cluster for the ansible-playbook that runs it (`ddpfix.lock.hold_for_playbook`), unless the ddpfix CLI that started
it holds the lock already. Documentation: plugins/modules/ddpfix_cluster.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.ddpfix.cluster.plugins.filter.ddpfix_probe_plan import (
    ddpfix_probe_needs_facts,
    pack_probe_inputs,
)
from ansible_collections.ddpfix.cluster.plugins.plugin_utils.ddpfix_controller import (
    ddpfix,
    inventory_tree,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # reads the inventory only
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _, args = self.validate_argument_spec(argument_spec=_ARGUMENT_SPEC)
        inventory = ddpfix("ddpfix.inventory.derive")
        hostvars = task_vars.get("hostvars") or {}
        try:
            data = inventory.inventory_data_from_hostvars(inventory_tree(hostvars, task_vars.get("groups") or {}),
                                                          hostvars)
            cluster = inventory.cluster_from_inventory_data(data)
        except ddpfix("ddpfix.errors").DdpfixError as exc:  # bad input: one line, its exit code, no node contacted
            result.update(failed=True, msg=str(exc), ddpfix_exit_code=int(exc.code))
            return result
        view = cluster.play_view()
        lock = ddpfix("ddpfix.lock")
        addresses = lock.cluster_addresses(view)
        try:
            warning = lock.hold_for_playbook(addresses, task_vars.get("ddpfix_run_holder")) if addresses else None
        except ddpfix("ddpfix.errors").DdpfixError as exc:  # another run holds the cluster: no node is contacted
            result.update(failed=True, msg=f"ddpfix: {exc}", ddpfix_exit_code=int(exc.code))
            return result
        if warning:
            Display().warning(warning)
        # decided once for the play (the facts role's ddpfix_facts_probe_from_facts), not templated per node from the
        # addresses of every node (O(N) each)
        view["probe_from_facts"] = ddpfix_probe_needs_facts(view["addresses"], view["cluster_cidr"])
        if args.get("facts") is not None:
            view["facts_plan"] = facts_plan(view, args["facts"], task_vars.get("ansible_play_hosts_all") or [])
        result.update(changed=False, inventory=data, cluster=dataclasses.asdict(cluster), **view)
        return result


#: The facts role's settings the facts task of every node shares (roles/ddpfix_facts/tasks/facts.yml's plan task
#: takes the same, with the same conversions), as Ansible's argument validation converts them.
_FACTS_SETTINGS = {
    "lock_path": "str", "lock_holder": "raw", "lock_stale_minutes": "int", "nofile_path": "str", "profile": "bool",
    "probe": "bool", "peers": "int", "port": "int", "timeout": "float", "wait": "float", "hold": "float",
    "forks": "int",
}
_ARGUMENT_SPEC = {"facts": {"type": "dict", "required": False, "default": None,
                            "options": {k: {"type": t, "required": True} for k, t in _FACTS_SETTINGS.items()}}}


def facts_plan(view: dict[str, Any], facts: dict[str, Any], play_hosts: Any) -> dict[str, Any]:
    """What the facts role's plan task returns as its `data` (the input of filter ddpfix_facts_args), from the
    cluster view and the role's settings: the cluster's part is the view's own (the filter reads it from the view)."""
    master = view["master"]
    hosts = [str(h) for h in play_hosts]
    return {**{k: facts[k] for k in _FACTS_SETTINGS}, "hosts": hosts,
            "master_address": (view["addresses"] or {}).get(master) or master,
            "probe_inputs": pack_probe_inputs(hosts, view["order"], view["addresses"])}
