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

from ansible_collections.ddpfix.cluster.plugins.filter.ddpfix_probe_plan import ddpfix_probe_needs_facts
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
        self.validate_argument_spec(argument_spec={})
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
        result.update(changed=False, inventory=data, cluster=dataclasses.asdict(cluster), **view)
        return result
