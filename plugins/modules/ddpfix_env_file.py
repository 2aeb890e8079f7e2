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
    case, or PAT or WEBHOOK as a word; a value with URL userinfo C(scheme://user:password@), a webhook URL, a URL
    query credential or a provider's token format such as C(ghp_), C(xoxb-), C(AKIA), C(glpat-), C(sk-), C(hf_))
    appear as C(***) in the diff and in the returned arguments; I(values) and I(body) are not logged in the node's
    journal (C(NOT_LOGGING_PARAMETER)); the file's content is not returned otherwise.
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

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_files import env_change, env_write
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nolog import CONTENT_ARGS, ContentModule

#: The arguments that carry the env file's content (no_log in the journal, redacted in the returned invocation).
ENV_ARGS = CONTENT_ARGS
EnvFileModule = ContentModule


def main():
    module = EnvFileModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            # env content: no_log in the journal, redacted in the returned invocation (EnvFileModule)
            values=dict(type="dict"),
            body=dict(type="str"),
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
    if p["backup_keep"] < 1:
        module.fail_json(msg="backup_keep must be at least 1, got {}".format(p["backup_keep"]))
    change = env_change(module, p["path"], values=p["values"], body=p["body"], comment=p["comment"],
                        adopt=p["adopt"], mode=p["mode"])
    if change["changed"] and not module.check_mode:
        env_write(module, change, p["backup"], p["backup_keep"])
    module.exit_json(**change["result"])

if __name__ == "__main__":
    main()
