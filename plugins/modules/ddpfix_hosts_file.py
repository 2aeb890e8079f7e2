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
    dropping lines left without names. C(localhost) lines are otherwise left alone.
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

import contextlib
import ipaddress
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_backup import backup as backup_file
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_block import BEGIN, END

NOTE = "# Managed by ddpfix: every cluster node's hostname -> its cluster address. Do not edit."


RESERVED = ("localhost", "localhost.localdomain", "localhost4", "localhost4.localdomain4", "localhost6",
            "localhost6.localdomain6")
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def is_reserved(name):
    n = name.lower()
    return n in RESERVED or n.startswith("ip6-")


def entry_problem(entry):
    """Why an entry must not be written (None: it may)."""
    try:
        ipaddress.ip_address(str(entry["address"]))
    except ValueError:
        return "address {!r} is not an IP address".format(entry["address"])
    if not entry["names"]:
        return "entry for {} has no names".format(entry["address"])
    for n in entry["names"]:
        labels = n.split(".")
        if len(n) > 253 or not all(_LABEL.match(lbl) for lbl in labels) or all(lbl.isdigit() for lbl in labels):
            return f"name {n!r} is not an RFC 1123 host name"
        if is_reserved(n):
            return f"name {n!r} is reserved (loopback/IPv6 well-known names are never managed)"
    return None


def render(text, entries):
    """Return (new_text, removed_lines)."""
    managed = set()
    for e in entries:
        managed.update(e["names"])
    out, removed, in_block = [], [], False
    lines = text.splitlines()
    for idx, line in enumerate(lines):
        s = line.strip()
        if s == BEGIN:
            # a BEGIN without a later END (truncated block) must not swallow the rest of the file
            in_block = any(x.strip() == END for x in lines[idx + 1:])
            continue
        if s == END:
            in_block = False
            continue
        if in_block:
            continue
        body, sep, comment = line.partition("#")
        parts = body.split()
        if len(parts) >= 2 and any(n in managed for n in parts[1:]):
            keep = [n for n in parts[1:] if n not in managed]
            removed.append(line)
            if keep:
                out.append("\t".join([parts[0], *keep]) + ((" #" + comment) if sep else ""))
            continue
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    block = [BEGIN, NOTE] + ["{}\t{}".format(e["address"], " ".join(e["names"])) for e in entries] + [END]
    return "\n".join([*out, "", *block]) + "\n", removed


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
    link = module.params["path"]
    # a symlinked hosts file (managed elsewhere, e.g. /etc/hosts -> /etc/hosts.d/cluster) is edited at its
    # target, and the link stays a link; a dangling link is refused
    path = os.path.realpath(link)
    if os.path.islink(link) and not os.path.exists(path):
        module.fail_json(msg=f"refused: {link} is a symlink to {path}, which does not exist; nothing changed")
    try:
        with open(path) as f:
            before = f.read()
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc}")
    entries = [{"address": str(e["address"]), "names": [str(n) for n in e["names"]]} for e in module.params["entries"]]
    for e in entries:
        problem = entry_problem(e)
        if problem:
            module.fail_json(msg=f"refused: {problem}; {path} not changed")
    after, removed = render(before, entries)
    result = dict(changed=before != after, removed=removed, target=path if path != link else None,
                  diff={"before": before, "after": after, "before_header": path, "after_header": path})
    if result["changed"] and not module.check_mode:
        if module.params["backup"]:
            result["backup_file"], result["backups_removed"] = backup_file(module, path,
                                                                          max(1, module.params["backup_keep"]))
        st = os.stat(path)
        fd, tmp = tempfile.mkstemp(prefix=".ddpfix-hosts.", dir=os.path.dirname(path) or ".")
        with os.fdopen(fd, "w") as f:
            f.write(after)
        os.chmod(tmp, st.st_mode & 0o7777)
        with contextlib.suppress(OSError):
            os.chown(tmp, st.st_uid, st.st_gid)
        # atomic rename; on EBUSY (bind-mounted file) Ansible falls back to an in-place write
        module.atomic_move(tmp, path, unsafe_writes=True)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
