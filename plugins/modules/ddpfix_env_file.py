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
    A new file gets I(mode) (0600) and root ownership; an existing file keeps its mode and owner, except that a
    file others may read (mode C(o+r)) that holds a secret-looking value after the change loses its bits for
    others (e.g. 0644 -> 0640), and the result says so in C(mode_tightened) and a warning.
  - Secret-looking values (a key naming KEY, TOKEN, SECRET, PASS, PWD, AUTH, CREDENTIAL, DSN, COOKIE or SESSION, any
    case, or a value with URL userinfo C(scheme://user:password@)) appear as C(***) in the diff and in the returned
    arguments; I(values) and I(body) are not logged in the node's journal (C(NOT_LOGGING_PARAMETER)); the file's
    content is not returned otherwise.
  - The backup (C(FILE.<pid>.<date>~) next to the file) gets the file's new mode; only the newest I(backup_keep)
    backups of the file are kept.
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
  mode: {description: Mode of a new file., type: str, default: '0600'}
  backup: {description: Keep a timestamped backup of the file before changing it., type: bool, default: true}
  backup_keep: {description: How many backups of the file to keep (older ones are removed)., type: int, default: 5}
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
backups_removed: {description: Older backups removed (beyond I(backup_keep))., returned: changed and backup, type: list}
mode_tightened:
  description: "C(OLD -> NEW) when a file others could read got a secret and lost the bits for others; else absent."
  returned: when tightened
  type: str
"""

import contextlib
import errno
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_backup import backup as backup_file
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import (
    BEGIN,
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
    redact_values,
    statements,
)
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_writable import (
    FS_APPEND_FL,
    FS_IMMUTABLE_FL,
    attr_flags,
)


def immutable_msg(path):
    flags = attr_flags(path, follow=True)  # the env file's symlink is followed: its target is written
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


def holds_secret(text):
    """Whether an env file's `text` assigns a secret-looking value (commented lines too)."""
    lines = text.splitlines()
    for first, last, key, _commented in statements(lines):
        if key:
            value = "\n".join(lines[first:last + 1]).split("=", 1)[1]
            if is_secret(key, value):
                return True
    return False


#: The arguments that carry the env file's content.
ENV_ARGS = ("values", "body")


class EnvFileModule(AnsibleModule):
    """AnsibleModule that keeps the env content out of every log, through AnsibleModule's public interface only.
    I(values) and I(body) are declared C(no_log): the invocation entry in the node's journal shows
    C(NOT_LOGGING_PARAMETER) for them. Their text is then taken out of C(no_log_values) again, so that it does not
    blank every occurrence of that text in the result (the whole block in the diff, every short value such as C(1) of
    I(values)); instead, the arguments returned to the controller (C(invocation)) show them redacted like the diff."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.no_log_values.clear()  # values and body are the only no_log arguments: shown redacted (_shown) instead

    def _shown(self, kwargs):
        if "invocation" not in kwargs:
            shown = dict(self.params)
            if shown.get("body") is not None:
                shown["body"] = redact(str(shown["body"]))
            if shown.get("values") is not None:
                shown["values"] = redact_values({str(k): str(v) for k, v in shown["values"].items()})
            kwargs["invocation"] = {"module_args": shown}
        return kwargs

    def exit_json(self, **kwargs):
        super().exit_json(**self._shown(kwargs))

    def fail_json(self, msg, **kwargs):
        super().fail_json(msg, **self._shown(kwargs))


def main():
    module = EnvFileModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            # env content: no_log in the journal, redacted in the returned invocation (EnvFileModule)
            values=dict(type="dict", no_log=True),
            body=dict(type="str", no_log=True),
            comment=dict(type="str", default=""),
            key_comments=dict(type="dict", default={}),
            adopt=dict(type="bool", default=False),
            mode=dict(type="str", default="0600"),
            backup=dict(type="bool", default=True),
            backup_keep=dict(type="int", default=5),
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
    if p["backup_keep"] < 1:
        module.fail_json(msg="backup_keep must be at least 1, got {}".format(p["backup_keep"]))
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
    st = os.stat(target) if exists else None
    mode = (st.st_mode & 0o7777) if st else int(p["mode"], 8)
    tightened = None
    if st and mode & 0o004 and holds_secret(after):
        # others could read the secret: the file keeps its owner and group access, others lose theirs
        tightened = f"{mode:04o} -> {mode & ~0o007:04o}"
        mode &= ~0o007
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
        result["backup_file"], result["backups_removed"] = backup_file(module, target, p["backup_keep"], mode)
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
    if tightened:  # before the move, which gives the new file the old one's mode: no moment others may read it
        try:
            os.chmod(target, mode)
        except OSError as exc:
            os.unlink(tmp)
            module.fail_json(msg=f"cannot change the mode of {target} ({tightened}): {exc}")
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
