"""Jinja filter: the cluster view `ddpfix` derives from the inventory (master, port, rank order, cluster network,
env file path), for the facts play when the CLI does not pass it. Calls the `ddpfix` package's own inventory code."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.ddpfix.cluster.plugins.plugin_utils.ddpfix_controller import (
    ddpfix,
    inventory_tree,
)


def ddpfix_cluster_vars(groups: Any, hostvars: Any) -> dict[str, Any]:
    """`{master, master_port, cluster_cidr, env_path, order}` of the inventory (`order`: the nodes in rank order)."""
    inventory = ddpfix("ddpfix.inventory")
    try:
        c = inventory.cluster_from_hostvars(inventory_tree(hostvars, groups), hostvars)
    except ddpfix("ddpfix.app").DdpfixError as exc:
        raise AnsibleFilterError(str(exc)) from None
    return {"master": c.master, "master_port": c.master_port, "cluster_cidr": c.cluster_cidr or "",
            "env_path": c.env_path, "order": c.names}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddpfix_cluster_vars": ddpfix_cluster_vars}
