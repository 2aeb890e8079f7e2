"""The files remediation writes, each as a change computed first and written second: the env file's managed block
(``ddpfix_env_file``), the /etc/hosts block (``ddpfix_hosts_file``) and a whole file such as the cluster file;
``ddpfix_node_files`` computes all of a node's changes, checks them, then writes them in one call.

``*_change(module, ...)`` reads the node and returns a dict: ``changed``, ``result`` (what the module returns for the
file, with its ``diff``), and what ``*_write(module, change, ...)`` needs to write it. Failures call
``module.fail_json``. Every write is a temporary file in the target's own directory, then a rename (a symlink stays a
symlink; on EBUSY, a bind-mounted file, Ansible's ``atomic_move`` falls back to an in-place write), after a backup
(``FILE.<pid>.<date>~``, the newest ``backup_keep`` kept).
"""

from __future__ import absolute_import, division, print_function

import contextlib
import errno
import ipaddress
import os
import re
import tempfile

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_backup import backup as backup_file
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_block import BEGIN, END
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import BEGIN as ENV_BEGIN
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import (
    NotOurs,
    body_block,
    check_values,
    forbidden_dir,
    is_secret,
    may_adopt,
    merge,
    ownership,
    parse_body,
    redact,
    statements,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_writable import (
    FS_APPEND_FL,
    FS_IMMUTABLE_FL,
    attr_flags,
)

__metaclass__ = type

#: The finding ids each file's change fixes, as the fix tasks' names show them: generated from the controller's rule
#: registry (`python -m ddpfix.readme README.md`, the ids of the role that writes the file; a test fails when stale).
WHAT_IDS = {
    "hosts": "hosts.hostname-loopback, hosts.peer-unresolvable and 3 more",
    "env": "netif.missing, netif.name-mismatch and 6 more",
    "cluster_file": "netif.missing, netif.name-mismatch and 6 more",
}
#: What each file is, as remediate's report names its change (as the tasks that wrote them one by one were named; the
#: controller's dry run names the changes it computes from the facts the same way).
WHAT = {key: f"Fix {WHAT_IDS[key]} | {what}" for key, what in {
    "hosts": "Managed /etc/hosts block on every node, node names off loopback lines",
    "env": "Managed block in {path}",
    "cluster_file": "Cluster file for `ddpfix check --local` ({path})",
}.items()}


def _read(module, target):
    try:
        with open(target) as f:
            return f.read()
    except OSError as exc:
        module.fail_json(msg=f"cannot read {target}: {exc}")


def _write(module, target, text, mode, uid, gid, prefix):
    """`text` into a temporary file next to `target` (mode, owner), renamed over it."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, dir=os.path.dirname(target) or ".")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        with contextlib.suppress(OSError):
            os.chown(tmp, uid, gid)
    except OSError as exc:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        module.fail_json(msg=f"cannot write {target}: {exc}")
    return tmp


# ---------------------------------------------------------------- the env file's managed block


def immutable_msg(path):
    flags = attr_flags(path, follow=True)  # the env file's symlink is followed: its target is written
    if flags & (FS_IMMUTABLE_FL | FS_APPEND_FL):
        what = "immutable (chattr +i)" if flags & FS_IMMUTABLE_FL else "append-only (chattr +a)"
        return ("{} is {}: ddpfix will not change it; run `chattr -{} {}` on the node if it may change, "
                "then rerun".format(path, what, "i" if flags & FS_IMMUTABLE_FL else "a", path))
    return None


def refuse_immutable(module, target, exists, result):
    """Fail (in check mode too) when the file or its directory is immutable or append-only."""
    for where in ([target] if exists else []) + [os.path.dirname(target)]:
        msg = immutable_msg(where) if os.path.exists(where) else None
        if msg:
            result.pop("diff", None)
            module.fail_json(msg=msg, **result)


def resolve(module, path):
    """The real file to write for `path` (following a symlink), after the safety checks."""
    if not os.path.isabs(path):
        module.fail_json(msg=f"ddp_env_path must be an absolute path, got {path!r}")
    bad = forbidden_dir(os.path.normpath(path))
    if bad:
        module.fail_json(msg=f"ddp_env_path {path} is under {bad}: choose a persistent, private place such as "
                             "/etc/ddpfix/ddp.env")
    target = os.path.realpath(path)
    if os.path.islink(path):
        if not os.path.exists(target):
            module.fail_json(msg=f"ddp_env_path {path} is a symlink to {target}, which does not exist: create the "
                                 "target or remove the link")
        bad = forbidden_dir(target)
        if bad:
            module.fail_json(msg=f"ddp_env_path {path} is a symlink into {bad} ({target}): not followed")
    if os.path.isdir(target):
        module.fail_json(msg=f"ddp_env_path {path} is a directory")
    if os.path.exists(target) and not os.path.isfile(target):
        module.fail_json(msg=f"ddp_env_path {path} is not a regular file")
    return target


def missing_dirs(path):
    """Directories above `path` that do not exist yet, outermost first."""
    out = []
    d = os.path.dirname(path)
    while d and d != "/" and not os.path.lexists(d):
        out.insert(0, d)
        d = os.path.dirname(d)
    if d and os.path.lexists(d) and not os.path.isdir(d):
        raise OSError(errno.ENOTDIR, "not a directory", d)
    return out


def holds_secret(text):
    """Whether an env file's `text` assigns a secret-looking value (commented lines too)."""
    lines = text.splitlines()
    for first, last, key, _commented in statements(lines):
        if key:
            value = "\n".join(lines[first:last + 1]).split("=", 1)[1]
            if is_secret(key, value):
                return True
    return False


def env_change(module, path, values=None, body=None, comment="", adopt=False, mode="0600"):
    """The env file `path` with ddpfix's block set to `values` (or the rendered `body`), not written yet."""
    block = None
    if body is not None:
        lines, values, bad = parse_body(body)
        block = body_block(lines)
    else:
        values = {str(k): str(v) for k, v in values.items()}
        bad = check_values(values)
    if bad:
        module.fail_json(msg=bad)
    target = resolve(module, path)
    exists = os.path.exists(target)
    before = _read(module, target) if exists else ""
    owner = ownership(before) if exists else "new"
    try:
        after, superseded = merge(before, values, comment, adopt=may_adopt(path, target, adopt), block=block)
    except NotOurs:
        module.fail_json(msg="ddp_env_path {} exists and was not written by ddpfix (no '{}'): ddpfix does not "
                             "overwrite it; set ddp_env_adopt: true to add ddpfix's block to it (its other lines are "
                             "kept), or choose another ddp_env_path".format(path if path == target else
                                                                        f"{path} (-> {target})", ENV_BEGIN))
    try:
        new_dirs = [] if exists else missing_dirs(target)
    except OSError as exc:
        module.fail_json(msg=f"cannot create the directory of {path}: {exc.filename} is not a directory")
    st = os.stat(target) if exists else None
    fmode = (st.st_mode & 0o7777) if st else int(mode, 8)
    tightened = None
    if st and fmode & 0o004 and holds_secret(after):
        # others could read the secret: the file keeps its owner and group access, others lose theirs
        tightened = f"{fmode:04o} -> {fmode & ~0o007:04o}"
        fmode &= ~0o007
    changed = not exists or before != after or tightened is not None
    result = dict(changed=changed, path=path, target=target, owner=owner, superseded=superseded,
                  created_dirs=new_dirs,
                  diff={"before": redact(before), "after": redact(after),
                        "before_header": target if exists else "/dev/null", "after_header": target})
    if tightened:
        result["mode_tightened"] = tightened
        result["ddpfix_note"] = (f"{target}: mode {tightened} (it holds a secret-looking value; others may no longer "
                                 "read it)")
        module.warn(f"{target} holds a secret-looking value and was readable by others: mode {tightened}")
    if changed:
        refuse_immutable(module, target, exists, result)
    return dict(changed=changed, result=result, target=target, exists=exists, after=after, mode=fmode,
                owner=(st.st_uid, st.st_gid) if st else (0, 0), new_dirs=new_dirs, tightened=tightened)


def env_write(module, change, backup=True, keep=5):
    """Write an `env_change` (changed, not in check mode): directories, backup, then the atomic rename."""
    result, target, fmode = change["result"], change["target"], change["mode"]
    for d in change["new_dirs"]:
        try:
            os.mkdir(d, 0o755)
            os.chmod(d, 0o755)  # the umask would narrow it
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                module.fail_json(msg=f"cannot create {d}: {exc}")
    if change["exists"] and backup:
        result["backup_file"], result["backups_removed"] = backup_file(module, target, keep, fmode)
    uid, gid = change["owner"]
    tmp = _write(module, target, change["after"], fmode, uid, gid, ".ddpfix-env.")
    if change["tightened"]:  # before the move, which gives the new file the old one's mode: no moment others read it
        try:
            os.chmod(target, fmode)
        except OSError as exc:
            os.unlink(tmp)
            module.fail_json(msg=f"cannot change the mode of {target} ({change['tightened']}): {exc}")
    module.atomic_move(tmp, target, unsafe_writes=True)
    if not change["exists"]:  # atomic_move gives a new file the umask's mode
        os.chmod(target, fmode)
        with contextlib.suppress(OSError):
            os.chown(target, uid, gid)


# ---------------------------------------------------------------- the /etc/hosts block

HOSTS_NOTE = "# Managed by ddpfix: every cluster node's hostname -> its cluster address. Do not edit."
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
    block = [BEGIN, HOSTS_NOTE] + ["{}\t{}".format(e["address"], " ".join(e["names"])) for e in entries] + [END]
    return "\n".join([*out, "", *block]) + "\n", removed


def hosts_change(module, link, entries):
    """The hosts file `link` with the block holding `entries`, not written yet. A symlinked hosts file (managed
    elsewhere, e.g. /etc/hosts -> /etc/hosts.d/cluster) is edited at its target; a dangling link is refused."""
    path = os.path.realpath(link)
    if os.path.islink(link) and not os.path.exists(path):
        module.fail_json(msg=f"refused: {link} is a symlink to {path}, which does not exist; nothing changed")
    before = _read(module, path)
    entries = [{"address": str(e["address"]), "names": [str(n) for n in e["names"]]} for e in entries]
    for e in entries:
        problem = entry_problem(e)
        if problem:
            module.fail_json(msg=f"refused: {problem}; {path} not changed")
    after, removed = render(before, entries)
    result = dict(changed=before != after, removed=removed, target=path if path != link else None,
                  diff={"before": before, "after": after, "before_header": path, "after_header": path})
    return dict(changed=result["changed"], result=result, target=path, after=after)


def hosts_write(module, change, backup=True, keep=5):
    result, path = change["result"], change["target"]
    if backup:
        result["backup_file"], result["backups_removed"] = backup_file(module, path, max(1, keep))
    st = os.stat(path)
    tmp = _write(module, path, change["after"], st.st_mode & 0o7777, st.st_uid, st.st_gid, ".ddpfix-hosts.")
    module.atomic_move(tmp, path, unsafe_writes=True)


# ---------------------------------------------------------------- a whole file (the cluster file)


def whole_change(module, path, content, mode="0644"):
    """The file `path` holding exactly `content` (a new file gets `mode`; an existing one keeps its mode and owner)."""
    if not os.path.isabs(path):
        module.fail_json(msg=f"{path!r} is not an absolute path")
    target = os.path.realpath(path)
    if os.path.isdir(target) or (os.path.exists(target) and not os.path.isfile(target)):
        module.fail_json(msg=f"{path} is not a regular file")
    exists = os.path.exists(target)
    before = _read(module, target) if exists else ""
    st = os.stat(target) if exists else None
    changed = not exists or before != content
    result = dict(changed=changed, path=path, target=target,
                  diff={"before": before, "after": content,
                        "before_header": target if exists else "/dev/null", "after_header": target})
    if changed:
        refuse_immutable(module, target, exists, result)
    return dict(changed=changed, result=result, target=target, exists=exists, after=content,
                mode=(st.st_mode & 0o7777) if st else int(mode, 8), owner=(st.st_uid, st.st_gid) if st else (0, 0))


def whole_write(module, change, backup=True, keep=5):
    result, target = change["result"], change["target"]
    d = os.path.dirname(target)
    if not os.path.isdir(d):
        module.fail_json(msg=f"cannot write {target}: its directory {d} does not exist")
    if change["exists"] and backup:
        result["backup_file"], result["backups_removed"] = backup_file(module, target, keep)
    uid, gid = change["owner"]
    tmp = _write(module, target, change["after"], change["mode"], uid, gid, ".ddpfix-file.")
    module.atomic_move(tmp, target, unsafe_writes=True)
    if not change["exists"]:
        os.chmod(target, change["mode"])
