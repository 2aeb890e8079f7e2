#!/usr/bin/python
"""Keep a managed block in /etc/hosts and make its names appear nowhere else (e.g. on 127.0.1.1)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_hosts_file
short_description: Managed /etc/hosts block for a training cluster
description:
  - Ensures a block between C(# BEGIN ddpfix managed block) and C(# END ddpfix managed block) with exactly I(entries).
  - Removes every name the block manages from all other lines (the Debian C(127.0.1.1 HOSTNAME) line, stale entries),
    dropping lines left without names. C(localhost) lines are otherwise left alone, and so is every line that names
    none of the block's names (the controller passes only the names the inventory vouches for).
  - >-
    Never manages the reserved names (C(localhost), C(localhost.localdomain), C(localhost4*), C(localhost6*), C(ip6-*)):
    an entry naming one, or with a name that is not an RFC 1123 host name or an address that is not an IP address,
    fails the task before anything is written. Lines carrying reserved names keep them.
  - Backs the file up before changing it and writes atomically; when the file is a bind mount (containers), where a
    rename fails with EBUSY, it falls back to rewriting the file in place.
  - Supports check mode and diff mode.
options:
  path: {description: The hosts file., type: path, default: /etc/hosts}
  entries: {description: "List of {address, names}.", type: list, elements: dict, required: true}
  backup: {description: Keep a timestamped backup of the original., type: bool, default: true}
  backup_keep: {description: How many backups of the file to keep (older ones are removed)., type: int, default: 5}
"""

EXAMPLES = r"""
- ddpfix_hosts_file:
    entries: [{address: 192.168.77.11, names: [node1]}, {address: 192.168.77.12, names: [node2]}]
"""

RETURN = r"""
backup_file: {description: Path of the backup, returned: changed and backup, type: str}
removed: {description: Lines changed or removed outside the block, returned: always, type: list}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_block import BEGIN, END
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_files import HOSTS_NOTE as NOTE
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_files import (
    entry_problem,
    hosts_change,
    hosts_write,
    is_reserved,
    render,
)

# the block's pure functions live in module_utils ddpfix_files (shared with ddpfix_node_files); named here too
__all__ = ["BEGIN", "END", "NOTE", "entry_problem", "is_reserved", "main", "render"]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/hosts"),
            entries=dict(type="list", elements="dict", required=True),
            backup=dict(type="bool", default=True),
            backup_keep=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    change = hosts_change(module, p["path"], p["entries"])
    if change["changed"] and not module.check_mode:
        hosts_write(module, change, p["backup"], p["backup_keep"])
    module.exit_json(**change["result"])


if __name__ == "__main__":
    main()
