#!/usr/bin/python
"""Persist only ddpfix's firewall rule, validated by the firewall's own parser before it replaces anything."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_fw_persist
short_description: Add ddpfix's rule to the node's persisted firewall configuration (and nothing else)
description:
  - C(nftables) - for the first existing I(nft_layouts) config (Debian C(/etc/nftables.conf), RHEL
    C(/etc/sysconfig/nftables.conf)), writes its include file holding only ddpfix's C(insert rule) lines for
    I(chains), and one managed C(include) block at the end of the config. The whole config (with the include) must
    pass C(nft -c -f) before either file is replaced.
  - >-
    C(iptables) - in each existing I(iptables_paths) file, inserts ddpfix's C(-A INPUT) line at the top of the
    C(*filter) section (a text edit: live chains of Docker, fail2ban etc. are never dumped into it). The new text
    must pass C(iptables-restore --test) of the variant that was changed.
  - Old files are backed up and stay when validation fails (the module then fails with the tool's error). Files are
    written atomically; symlinks are followed to the real file. Check and diff mode (validation runs in check mode
    too, from a temporary directory).
  - When nothing can be persisted, returns I(runtime_only) saying why.
options:
  backend: {description: Which layer., type: str, required: true, choices: [iptables, nftables]}
  cidr: {description: Cluster network., type: str, required: true}
  comment: {description: Tag of the rule., type: str, default: ddpfix-cluster}
  chains:
    description: "nftables: chains that get the rule, 'family table chain'."
    type: list
    elements: str
    default: []
  nft_layouts: {description: "nftables: list of {config, include}.", type: list, elements: dict, default: []}
  iptables_paths:
    description: "iptables: rules files (each edited only if present)."
    type: list
    elements: path
    default: []
  iptables_restore: {description: "iptables-restore command of the variant.", type: str, default: iptables-restore}
  backup_keep: {description: How many backups of each file to keep (older ones are removed)., type: int, default: 5}
"""

RETURN = r"""
files: {description: Files written (or that would be written)., returned: always, type: list}
runtime_only: {description: Why the rule is not persisted (empty when it is)., returned: always, type: str}
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_backup import backup as backup_file
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fw import (
    iptables_persisted,
    nft_snippet,
    rule_argument_spec,
    with_include,
)


def _read(path):
    with open(path) as f:
        return f.read()


def _write(module, path, text, mode):
    """Atomic replace of the real file behind `path` (symlinks followed)."""
    real = os.path.realpath(path)
    d = os.path.dirname(real)
    fd, tmp = tempfile.mkstemp(prefix=".ddpfix.", dir=d)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    module.atomic_move(tmp, real)


def _fail_tool(module, what, err, result):
    module.fail_json(msg="{}: {} (the old file stays, nothing was written)".format(what, " ".join(err.split())[:600]),
                     **result)


def nftables(module, p, result):
    layout = None
    for lay in p["nft_layouts"]:
        if os.path.exists(lay.get("config", "")):
            layout = lay
            break
    if layout is None:
        configs = ", ".join(lay.get("config", "?") for lay in p["nft_layouts"])
        result["runtime_only"] = f"no nftables config file ({configs}): ddpfix's rule is lost at the next boot"
        return
    config, include = layout["config"], layout["include"]
    chains = [c.split() for c in p["chains"]]
    if not chains:
        return
    snippet = nft_snippet(chains, p["cidr"], p["comment"])
    old_main = _read(config)
    new_main = with_include(old_main, include)
    old_snip = _read(include) if os.path.exists(include) else ""
    if old_main == new_main and old_snip == snippet:
        return
    nft = module.get_bin_path("nft", required=True)
    tmpd = tempfile.mkdtemp(prefix="ddpfix-nft-check.")
    try:
        tsnip = os.path.join(tmpd, os.path.basename(include))
        tmain = os.path.join(tmpd, "main.nft")
        with open(tsnip, "w") as f:
            f.write(snippet)
        with open(tmain, "w") as f:
            f.write(with_include(old_main, tsnip))
        rc, out, err = module.run_command([nft, "-c", "-f", tmain])
    finally:
        shutil.rmtree(tmpd, ignore_errors=True)
    result["files"] = [include, config]
    result["diff"] = [
        {"before": old_snip, "after": snippet, "before_header": include, "after_header": include},
        {"before": old_main, "after": new_main, "before_header": config, "after_header": config},
    ]
    if rc != 0:
        _fail_tool(module, f"nft -c -f {config} with ddpfix's include {include} fails", err or out, result)
    result["changed"] = True
    if module.check_mode:
        return
    if old_snip != snippet:
        if old_snip:
            result["backup_files"].append(_backup(module, p, include))
        d = os.path.dirname(include)
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
        _write(module, include, snippet, 0o644)
    if old_main != new_main:
        result["backup_files"].append(_backup(module, p, config))
        _write(module, config, new_main, os.stat(config).st_mode & 0o7777)


def _backup(module, p, path):
    """A backup of `path` (FILE.<pid>.<date>~), keeping only the newest `backup_keep` of that file."""
    return backup_file(module, path, max(1, p["backup_keep"]))[0]


def iptables(module, p, result):
    existing = [x for x in p["iptables_paths"] if os.path.exists(x)]
    if not existing:
        paths = ", ".join(p["iptables_paths"])
        result["runtime_only"] = f"no iptables rules file ({paths}): ddpfix's rule is lost at the next boot"
        return
    restore = module.get_bin_path(p["iptables_restore"], required=True)
    todo, skipped = [], []
    for path in existing:
        old = _read(path)
        new, why = iptables_persisted(old, p["cidr"], p["comment"])
        if why:
            skipped.append(f"{path} {why}")
            continue
        if new is None:
            continue
        fd, tmp = tempfile.mkstemp(prefix="ddpfix-iptables-check.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(new)
            rc, out, err = module.run_command([restore, "--test", tmp])
        finally:
            os.unlink(tmp)
        result["files"].append(path)
        result["diff"].append({"before": old, "after": new, "before_header": path, "after_header": path})
        if rc != 0:
            _fail_tool(module, "{} --test of {} with ddpfix's line fails".format(p["iptables_restore"], path),
                       err or out, result)
        todo.append((path, new))
    if skipped and len(skipped) == len(existing):
        result["runtime_only"] = "; ".join(skipped) + ": ddpfix's rule is lost at the next boot"
    result["changed"] = bool(todo)
    if module.check_mode:
        return
    for path, new in todo:
        result["backup_files"].append(_backup(module, p, path))
        _write(module, path, new, os.stat(path).st_mode & 0o7777)


def main():
    module = AnsibleModule(
        argument_spec=rule_argument_spec(
            chains=dict(type="list", elements="str", default=[]),
            nft_layouts=dict(type="list", elements="dict", default=[]),
            iptables_paths=dict(type="list", elements="path", default=[]),
            iptables_restore=dict(type="str", default="iptables-restore"),
            backup_keep=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    result = dict(changed=False, files=[], diff=[], runtime_only="", backup_files=[])
    if p["backend"] == "nftables":
        nftables(module, p, result)
    else:
        iptables(module, p, result)
    if result["runtime_only"]:
        result["ddpfix_note"] = "runtime only: " + result["runtime_only"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
