#!/usr/bin/python
"""Keep ddpfix's managed block in the env file; the rest of the file stays the user's."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_env_file
short_description: ddpfix's managed block of KEY=value lines in a node's env file
description:
  - >-
    Ensures a block between C(# BEGIN ddpfix managed block) and C(# END ddpfix managed block) holding exactly
    I(values). Lines outside the block are kept verbatim; an assignment outside the block of a key the block sets is
    commented out (C(# ddpfix: superseded: ...)) because bash, systemd C(EnvironmentFile=) and C(docker --env-file)
    all let the last assignment win.
  - A file written by an older ddpfix (first line C(# Managed by ddpfix:)) is converted to the block.
    Any other existing file is refused unless I(adopt) is true or the file (and a symlink's target) lies in
    C(/etc/ddpfix/), ddpfix's own directory; an adopted file keeps all its lines.
  - A symlink is followed; the target is written atomically in its own directory and the link stays. A dangling
    link, a target that is a directory or lies under C(/tmp), C(/var/tmp), C(/dev), C(/proc), C(/sys) or
    C(/run/user) is refused. An immutable or append-only file (C(chattr +i)/C(+a)) is refused with a message naming
    C(chattr -i), in check mode too.
  - The parent directory is created (mode 0755) only when missing; an existing directory is never changed.
    A new file gets I(mode) and root ownership; an existing file keeps its mode and owner.
  - Values of keys that look secret (KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL) appear as C(***) in the
    diff; the file's content is not returned otherwise.
  - Supports check mode and diff mode.
options:
  path: {description: The env file., type: path, required: true}
  values: {description: "The block's KEY: value pairs, in order (or give I(body)).", type: dict}
  body:
    description:
      - The block's text between the markers, e.g. a rendered template (C(lookup('template', ...))). Each line is
        blank, a C(#) comment or C(KEY=VALUE); its assignments are the block's keys (for the duplicate handling)
        and get the same value checks as I(values). Mutually exclusive with I(values).
    type: str
  comment: {description: A comment line for the block (e.g. the node and its rank)., type: str, default: ''}
  key_comments: {description: "KEY: why - a C(# KEY: why) line is written above that key.", type: dict, default: {}}
  adopt: {description: Add the block to an existing file that ddpfix did not write., type: bool, default: false}
  mode: {description: Mode of a new file., type: str, default: '0644'}
  backup: {description: Keep a timestamped backup of the file before changing it., type: bool, default: true}
"""

EXAMPLES = r"""
- ddpfix_env_file:
    path: /etc/ddpfix/ddp.env
    values: {MASTER_ADDR: 192.168.77.11, MASTER_PORT: "29500", NNODES: "2", NODE_RANK: "0"}
    comment: node node1 (rank 0)

- ddpfix_env_file:
    path: /etc/ddpfix/ddp.env
    body: "{{ lookup('template', 'ddp.env.j2') }}"
"""

RETURN = r"""
target: {description: The file written (the symlink's target when I(path) is a link)., returned: always, type: str}
owner:
  description: "Before the change: block, header (older ddpfix), foreign (adopted) or new."
  returned: always
  type: str
superseded: {description: Keys whose assignments outside the block were commented out., returned: always, type: list}
created_dirs: {description: Directories created for the file., returned: always, type: list}
backup_file: {description: Path of the backup, returned: changed and backup, type: str}
"""

import array
import contextlib
import errno
import fcntl
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import (
    BEGIN,
    NotOurs,
    body_block,
    check_values,
    forbidden_dir,
    may_adopt,
    merge,
    ownership,
    parse_body,
    redact,
)

FS_IOC_GETFLAGS = 0x80086601
FS_IMMUTABLE_FL = 0x10
FS_APPEND_FL = 0x20


def attr_flags(path):
    """The inode flags (lsattr) of `path`, 0 when they cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return 0
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
        return buf[0]
    except OSError:
        return 0
    finally:
        os.close(fd)


def immutable_msg(path):
    flags = attr_flags(path)
    if flags & (FS_IMMUTABLE_FL | FS_APPEND_FL):
        what = "immutable (chattr +i)" if flags & FS_IMMUTABLE_FL else "append-only (chattr +a)"
        return ("{} is {}: ddpfix will not change it; run `chattr -{} {}` on the node if it may change, "
                "then rerun".format(path, what, "i" if flags & FS_IMMUTABLE_FL else "a", path))
    return None


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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            values=dict(type="dict"),
            body=dict(type="str"),
            comment=dict(type="str", default=""),
            key_comments=dict(type="dict", default={}),
            adopt=dict(type="bool", default=False),
            mode=dict(type="str", default="0644"),
            backup=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
        mutually_exclusive=[("values", "body")],
        required_one_of=[("values", "body")],
    )
    p = module.params
    path = p["path"]
    block = None
    if p["body"] is not None:
        lines, values, bad = parse_body(p["body"])
        block = body_block(lines)
    else:
        values = {str(k): str(v) for k, v in p["values"].items()}
        bad = check_values(values)
    if bad:
        module.fail_json(msg=bad)
    target = resolve(module, path)
    exists = os.path.exists(target)
    before = ""
    if exists:
        try:
            with open(target) as f:
                before = f.read()
        except OSError as exc:
            module.fail_json(msg=f"cannot read {target}: {exc}")
    owner = ownership(before) if exists else "new"
    try:
        after, superseded = merge(before, values, p["comment"], adopt=may_adopt(path, target, p["adopt"]),
                                   block=block)
    except NotOurs:
        module.fail_json(msg="ddp_env_path {} exists and was not written by ddpfix (no '{}'): ddpfix does not "
                             "overwrite it; set ddp_env_adopt: true to add ddpfix's block to it (its other lines are "
                             "kept), or choose another ddp_env_path".format(path if path == target else
                                                                        f"{path} (-> {target})", BEGIN))
    try:
        new_dirs = [] if exists else missing_dirs(target)
    except OSError as exc:
        module.fail_json(msg=f"cannot create the directory of {path}: {exc.filename} is not a directory")
    changed = not exists or before != after
    result = dict(changed=changed, path=path, target=target, owner=owner, superseded=superseded,
                  created_dirs=new_dirs,
                  diff={"before": redact(before), "after": redact(after),
                        "before_header": target if exists else "/dev/null", "after_header": target})
    if not changed:
        module.exit_json(**result)
    for where in ([target] if exists else []) + [os.path.dirname(target)]:
        msg = immutable_msg(where) if os.path.exists(where) else None
        if msg:
            result.pop("diff")
            module.fail_json(msg=msg, **result)
    if module.check_mode:
        module.exit_json(**result)
    for d in new_dirs:
        try:
            os.mkdir(d, 0o755)
            os.chmod(d, 0o755)  # the umask would narrow it
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                module.fail_json(msg=f"cannot create {d}: {exc}")
    if exists and p["backup"]:
        result["backup_file"] = module.backup_local(target)
    st = os.stat(target) if exists else None
    mode = (st.st_mode & 0o7777) if st else int(p["mode"], 8)
    uid, gid = (st.st_uid, st.st_gid) if st else (0, 0)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ddpfix-env.", dir=os.path.dirname(target))
        with os.fdopen(fd, "w") as f:
            f.write(after)
        os.chmod(tmp, mode)
        with contextlib.suppress(OSError):
            os.chown(tmp, uid, gid)
    except OSError as exc:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        module.fail_json(msg=f"cannot write {target}: {exc}")
    # atomic rename in the target's own directory (a symlink stays a symlink); on EBUSY (bind-mounted file)
    # Ansible falls back to an in-place write
    module.atomic_move(tmp, target, unsafe_writes=True)
    if not exists:  # atomic_move gives a new file the umask's mode
        os.chmod(target, mode)
        with contextlib.suppress(OSError):
            os.chown(target, uid, gid)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
