#!/usr/bin/python
"""Persist only ddpfix's firewall rule, validated by the firewall's own parser before it replaces anything."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_fw_persist
short_description: Add ddpfix's rule to the node's persisted firewall configuration (and nothing else)
description:
  - >-
    C(nftables) - for the first existing I(nft_layouts) config (Debian C(/etc/nftables.conf), RHEL
    C(/etc/sysconfig/nftables.conf)), writes its include file holding only ddpfix's C(insert rule) lines and one
    managed C(include) block at the very end of the config, after its tables (moved there if it was elsewhere).
    The chains are those of I(nft_chains) (the controller's plan) that the config creates, or without it those that
    drop on the input hook, that do not hold ddpfix's rule ahead of the drop already once
    the config (without ddpfix's block) is loaded the way boot loads it - C(nft -f CONFIG) in a fresh, empty
    ruleset (a private network namespace, C(unshare --net)); a planned chain the config does not create is reported
    in I(runtime_only). The new config must load the same way, with ddpfix's
    rule ahead of every drop of those chains, before either file is replaced; the check runs on every call (also
    when nothing changes, and in check mode).
  - >-
    The include file must be loaded by ddpfix's block only: when an C(include) of the config (or of a file it
    includes) also matches it (a glob such as C(/etc/nftables.d/*.nft)), the module fails, since the file would load
    twice and possibly before the tables. An include file of ddpfix's at another path (the block's old target,
    or the old defaults C(/etc/nftables.d/ddpfix.nft) and C(/etc/nftables/ddpfix.nft)) is removed: a glob ahead of
    the tables would load it first and fail the whole boot load (nft loads a file as one transaction).
  - >-
    C(iptables) - in each existing I(iptables_paths) file, inserts ddpfix's C(-A INPUT) line at the top of the
    C(*filter) section (a text edit: live chains of Docker, fail2ban etc. are never dumped into it). The new text
    must pass C(iptables-restore --test) of the variant that was changed (the whole file; against the live tables,
    since ipsets a rules file refers to are loaded before it at boot).
  - Old files are backed up and stay when validation fails (the module then fails with the tool's error). Files are
    written atomically; symlinks are followed to the real file. Check and diff mode (validation runs in check mode
    too, from a temporary directory).
  - I(egress) - the egress accepts the controller planned (M(ddpfix.cluster.ddpfix_fw_rule)'s I(egress)) are
    persisted the same way - an C(insert rule) line per nft chain in the include file (proven ahead of the drop of
    that chain once loaded as boot loads it), a C(-A OUTPUT) line at the top of the C(*filter) section of the save
    file. With I(ingress) false, the input rule is persisted only where a file of ddpfix's already holds it.
  - The C(insert rule) lines ddpfix's include file already holds for I(cidr) stay (where the config as boot loads
    it still has their chain), also when this call's I(nft_chains) or I(egress) do not name that chain (an earlier
    run's live accept there is why the plan does not name it again); an egress line of a planned chain is replaced.
  - When nothing can be persisted, returns I(runtime_only) saying why.
options:
  backend: {description: Which layer., type: str, required: true, choices: [iptables, nftables]}
  cidr: {description: Cluster network., type: str, required: true}
  comment: {description: Tag of the rule., type: str, default: ddpfix-cluster}
  egress:
    description: "The planned egress accepts: C({backend: nftables|iptables|iptables-legacy, family, table, chain,
      ports})."
    type: list
    elements: dict
    default: []
  ingress: {description: Whether the input rule is persisted too., type: bool, default: true}
  nft_chains:
    description: "nftables - the input base chains the controller planned (M(ddpfix.cluster.ddpfix_fw_rule)'s
      I(nft_chains)); empty - chosen on the node."
    type: list
    elements: dict
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

import glob
import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_backup import backup as backup_file
from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fw import (
    block_include,
    egress_change,
    glob_matches,
    iptables_egress_line,
    iptables_line,
    iptables_persisted,
    is_ddpfix_snippet,
    nft_blocking_input_chains,
    nft_chain_keys,
    nft_chains_checked,
    nft_has_egress,
    nft_include_path,
    nft_includes,
    nft_input_chains,
    nft_rule_ahead,
    nft_snippet,
    nft_snippet_egress,
    nft_snippet_ingress,
    rule_argument_spec,
    with_include,
    without_include,
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


#: Where ddpfix put its nftables include file before it moved out of the directories that configs glob-include.
OLD_NFT_INCLUDES = ("/etc/nftables.d/ddpfix.nft", "/etc/nftables/ddpfix.nft")

#: Runs inside `unshare --net --mount`: the files ddpfix removes are shadowed by an empty file (a glob still finds
#: them), the config loads into the new namespace's empty ruleset, and the result is listed as JSON.
BOOT_CHECK = r"""
nft=$1; mount=$2; main=$3; empty=$4; shift 4
for f in "$@"; do "$mount" --bind "$empty" "$f" || { echo "ddpfix: mount --bind over $f failed" >&2; exit 90; }; done
"$nft" -f "$main" >/dev/null || exit $?
exec "$nft" -j list ruleset
"""


def _include_tree(main_text, skip):
    """(file, pattern, absolute pattern) of every include in the config and, recursively, in what it includes."""
    found, seen, todo = [], set(skip), [("the config", main_text, 0)]
    while todo:
        name, text, depth = todo.pop(0)
        for pat in nft_includes(text):
            full = nft_include_path(pat)
            found.append((name, pat, full))
            if depth >= 8:
                continue
            for f in sorted(glob.glob(full)):
                if f in seen or not os.path.isfile(f):
                    continue
                seen.add(f)
                try:
                    todo.append((f, _read(f), depth + 1))
                except (OSError, UnicodeDecodeError):
                    continue
    return found


def _boot_load(module, config, main_text, blanks, snippet=None, include=""):
    """Load `main_text` (plus ddpfix's `snippet`, included by the block) as boot does, in a fresh empty ruleset:
    (rc, ruleset, error text with the temporary paths named as the real ones)."""
    unshare = module.get_bin_path("unshare")
    mount = module.get_bin_path("mount")
    if not unshare or not mount:
        return 1, None, "unshare/mount (util-linux) not found: cannot load the config in an empty ruleset"
    nft = module.get_bin_path("nft", required=True)
    tmpd = tempfile.mkdtemp(prefix="ddpfix-nft-boot.")
    try:
        tmain, tsnip, empty = (os.path.join(tmpd, n) for n in ("main.nft", "ddpfix.nft", "empty.nft"))
        for path, text in ((tsnip, snippet or ""), (empty, "")):
            with open(path, "w") as f:
                f.write(text)
        with open(tmain, "w") as f:
            f.write(with_include(main_text, tsnip) if snippet is not None else main_text)
        argv = [unshare, "--net", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", BOOT_CHECK,
                "ddpfix-boot-check", nft, mount, tmain, empty, *blanks]
        rc, out, err = module.run_command(argv, cwd="/")
        err = (err or ("" if rc == 0 else out)).replace(tmain, config).replace(tsnip, include)
    finally:
        shutil.rmtree(tmpd, ignore_errors=True)
    if rc != 0:
        return rc, None, err
    try:
        return 0, json.loads(out or "{}"), ""
    except ValueError:
        return 1, None, "nft -j list ruleset: no JSON"


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
    old_main = _read(config)
    base_main = without_include(old_main)
    # include files of ddpfix's own at other paths go (a glob ahead of the tables would load them first)
    legacy = []
    for path in dict.fromkeys([block_include(old_main), *OLD_NFT_INCLUDES]):
        if path and path != include and os.path.isfile(path) and is_ddpfix_snippet(_read(path)):
            legacy.append(path)
    for name, pat, full in _include_tree(base_main, [include, *legacy]):
        if glob_matches(full, include):
            module.fail_json(msg=f"ddpfix's nftables include file {include} is also matched by include \"{pat}\" "
                                 f"in {name} ({config}): it would load twice, maybe before the tables it refers to; "
                                 "set ddpfix_firewall_nft_layouts' include to a path no include matches "
                                 "(nothing was written)", **result)
    rc, ruleset, err = _boot_load(module, config, base_main, legacy)
    if rc != 0:
        _fail_tool(module, f"nft -f {config} does not load in an empty ruleset (as at boot) even without ddpfix's "
                           "rule", err, result)
    # chains whose config already lets the cluster in with ddpfix's rule (a dump of the running rule set) need none
    old_snip = _read(include) if os.path.exists(include) else ""
    chosen = p["nft_chains_checked"]
    boot = nft_input_chains(ruleset)
    if not p["ingress"]:  # only egress: no input chain of this run's own
        chosen = []
    elif chosen:  # the controller's plan: those of its chains the config creates (others are made at runtime)
        absent = [" ".join(c) for c in chosen if c not in boot]
        chosen = [c for c in chosen if c in boot]
        if absent:
            result["runtime_only"] = (f"chain {', '.join(absent)} is not in {config} as boot loads it (another service "
                                      "creates it at runtime): ddpfix's accept there is lost at the next boot")
    else:  # the role without the controller: chosen here, from the config as boot loads it
        chosen = nft_blocking_input_chains(ruleset)
    # the input chains ddpfix's file already lets the cluster in through stay (their live accept is why this run's
    # plan does not name them again), where the config as boot loads it still has them
    chosen = [*chosen, *(c for c in nft_snippet_ingress(old_snip, p["cidr"]) if c in boot and c not in chosen)]
    chains = [c for c in chosen if not nft_rule_ahead(ruleset, c, p["comment"])]
    # ddpfix's persisted egress accepts this run does not plan again (the live one lets the connects out) stay,
    # where the config as boot loads it still has their chain
    planned = {e[1:4] for e in p["egress_checked"]}
    kept = [e for e in nft_snippet_egress(old_snip, p["cidr"]) if e[1:4] not in planned
            and e[1:4] in nft_chain_keys(ruleset)]
    egress = [e for e in [*p["egress_checked"], *kept] if e[0] == "nftables"
              and not nft_has_egress(ruleset, e[1:4], p["cidr"], p["comment"], e[4])]
    missing = [" ".join(e[1:4]) for e in egress if not any(
        it.get("chain", {}).get("name") == e[3] and it["chain"].get("table") == e[2]
        and it["chain"].get("family") == e[1] for it in ruleset.get("nftables", []) if isinstance(it, dict))]
    if missing:
        module.fail_json(msg=f"nft -f {config} (loaded as at boot) has no chain {', '.join(missing)}: the egress "
                             "accept for it cannot be persisted there (nothing was written)", **result)
    snippet = nft_snippet(chains, p["cidr"], p["comment"], egress) if chains or egress else ""
    new_main = with_include(base_main, include) if snippet else base_main
    if snippet:
        rc, loaded, err = _boot_load(module, config, base_main, legacy, snippet, include)
        if rc != 0:
            _fail_tool(module, f"nft -f {config} with ddpfix's include {include} does not load in an empty ruleset "
                               "(as at boot)", err, result)
        behind = [" ".join(c) for c in chains if not nft_rule_ahead(loaded, c, p["comment"])] + [
            " ".join(e[1:4]) for e in egress if not nft_has_egress(loaded, e[1:4], p["cidr"], p["comment"], e[4])]
        if behind:
            _fail_tool(module, f"nft -f {config} with ddpfix's include {include} loads, but ddpfix's rule is not "
                               "ahead of the drop in " + ", ".join(behind), "(the config reorders or flushes it)",
                       result)
    diffs = []
    if old_snip != snippet:
        diffs.append((include, old_snip, snippet))
    if old_main != new_main:
        diffs.append((config, old_main, new_main))
    diffs += [(path, _read(path), "") for path in legacy]
    if not diffs:
        return
    result["files"] = [d[0] for d in diffs]
    result["diff"] = [{"before": b, "after": a, "before_header": f, "after_header": f} for f, b, a in diffs]
    result["changed"] = True
    if module.check_mode:
        return
    # ddpfix's file first, then the config that includes it, then the old files nothing includes any more
    if old_snip != snippet:
        if old_snip:
            result["backup_files"].append(_backup(module, p, include))
        if snippet:
            d = os.path.dirname(include)
            if not os.path.isdir(d):
                os.makedirs(d, 0o755)
            _write(module, include, snippet, 0o644)
    if old_main != new_main:
        result["backup_files"].append(_backup(module, p, config))
        _write(module, config, new_main, os.stat(config).st_mode & 0o7777)
    # ddpfix's own generated files, shown in the diff; no backup next to them, where a config's glob could load it
    for path in ([include] if old_snip and not snippet else []) + legacy:
        try:
            os.unlink(path)
        except OSError as exc:
            module.fail_json(msg=f"cannot remove ddpfix's old include file {path} ({exc.strerror}): an include of "
                                 f"{config} may still load it at boot; remove it by hand", **result)


def _backup(module, p, path):
    """A backup of `path` (FILE.<pid>.<date>~), keeping only the newest `backup_keep` of that file."""
    return backup_file(module, path, max(1, p["backup_keep"]))[0]


def ipt_input_line(p):
    return iptables_line(p["cidr"], p["comment"])


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
        new, why = (iptables_persisted(old, p["cidr"], p["comment"]) if p["ingress"] or ipt_input_line(p) in old
                    else (None, ""))
        for backend, _f, _t, _c, ports in p["egress_checked"]:
            if not why and backend != "nftables":
                more, why = iptables_persisted(new or old, p["cidr"], p["comment"],
                                               line=iptables_egress_line(p["cidr"], ports, p["comment"]))
                new = more or new
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
            nft_layouts=dict(type="list", elements="dict", default=[]),
            iptables_paths=dict(type="list", elements="path", default=[]),
            iptables_restore=dict(type="str", default="iptables-restore"),
            backup_keep=dict(type="int", default=5),
            egress=dict(type="list", elements="dict", default=[]),
            ingress=dict(type="bool", default=True),
            nft_chains=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    result = dict(changed=False, files=[], diff=[], runtime_only="", backup_files=[])
    try:
        p["egress_checked"] = [egress_change(c, p["cidr"]) for c in p["egress"]]
    except ValueError as exc:
        module.fail_json(msg=f"egress: {exc}", **result)
    try:
        p["nft_chains_checked"] = nft_chains_checked(p["nft_chains"])
    except ValueError as exc:
        module.fail_json(msg=f"nft_chains: {exc}", **result)
    if p["backend"] == "nftables":
        nftables(module, p, result)
    else:
        iptables(module, p, result)
    if result["runtime_only"]:
        result["ddpfix_note"] = "runtime only: " + result["runtime_only"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
