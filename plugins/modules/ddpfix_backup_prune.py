#!/usr/bin/python
"""Keep only the newest backups (FILE.<pid>.<date>~) of files that Ansible's own modules backed up."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_backup_prune
short_description: Keep only the newest backups of a file ddpfix wrote
description:
  - Removes all but the newest I(keep) backups C(FILE.<pid>.<date>~) (the name C(backup=true) of Ansible's modules
    gives, next to the file) of each of I(paths). Other files, symlinks and directories are never touched.
  - Used after C(ansible.builtin.copy)/C(template)/C(blockinfile) tasks with C(backup=true); ddpfix's own file
    modules prune their backups themselves.
  - Supports check mode (reports what it would remove).
options:
  paths: {description: The files whose backups are pruned., type: list, elements: path, required: true}
  keep: {description: How many backups of each file to keep (at least 1)., type: int, default: 5}
"""

EXAMPLES = r"""
- ddpfix.cluster.ddpfix_backup_prune:
    paths: [/etc/ddpfix/cluster.json]
    keep: 5
"""

RETURN = r"""
removed: {description: The backups removed (or that would be removed in check mode)., returned: always, type: list}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_backup import backups_of, prune


def main():
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="path", required=True),
            keep=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    keep = module.params["keep"]
    if keep < 1:
        module.fail_json(msg=f"keep must be at least 1, got {keep}")
    removed = []
    for path in module.params["paths"]:
        if module.check_mode:
            olds = backups_of(path)
            removed.extend(olds[: max(0, len(olds) - keep)])
        else:
            removed.extend(prune(path, keep))
    module.exit_json(changed=bool(removed), removed=removed)


if __name__ == "__main__":
    main()
