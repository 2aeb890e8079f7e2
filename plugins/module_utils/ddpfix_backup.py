"""Backups of the files ddpfix writes: Ansible's ``FILE.<pid>.<date>~`` next to the file, the newest few kept.

Stdlib-only and pure but for the directory it prunes; used by the modules that write files (env file, /etc/hosts,
firewall persistence) and by ``ddpfix_backup_prune`` for the files Ansible's own copy/template modules back up.
"""

from __future__ import absolute_import, division, print_function

import os
import re

__metaclass__ = type

#: How many backups of one file are kept by default (inventory: ddp_backup_keep).
DEFAULT_KEEP = 5
#: The name AnsibleModule.backup_local gives: '%s.%s.%s' % (path, pid, time.strftime("%Y-%m-%d@%H:%M:%S~")).
_STAMP = r"\.[0-9]+\.([0-9]{4}-[0-9]{2}-[0-9]{2}@[0-9]{2}:[0-9]{2}:[0-9]{2})~$"


def backups_of(path):
    """[(stamp, backup path)] of `path`'s backups, oldest first (by the date in the name, then mtime)."""
    d, base = os.path.split(path)
    pat = re.compile(re.escape(base) + _STAMP)
    out = []
    try:
        names = os.listdir(d or ".")
    except OSError:
        return []
    for n in names:
        m = pat.match(n)
        if not m:
            continue
        full = os.path.join(d, n)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if not os.path.isfile(full) or os.path.islink(full):
            continue
        out.append(((m.group(1), st.st_mtime, n), full))
    return [p for _k, p in sorted(out)]


def prune(path, keep):
    """Remove all but the newest `keep` backups of `path`; the removed paths (errors are skipped)."""
    keep = max(1, int(keep))
    olds = backups_of(path)
    removed = []
    for p in olds[: max(0, len(olds) - keep)]:
        try:
            os.unlink(p)
            removed.append(p)
        except OSError:
            pass
    return removed


def backup(module, path, keep, mode=None):
    """AnsibleModule.backup_local(path), `mode` set on the backup when given (a tightened file's backup gets the
    tightened mode, so an old world-readable copy of a secret does not stay behind), then the pruning; the backup's
    path ('' if none) and the removed backups."""
    b = module.backup_local(path)
    if b and mode is not None:
        os.chmod(b, mode)
    return b, (prune(path, keep) if b else [])
