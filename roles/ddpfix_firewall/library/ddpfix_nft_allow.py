#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Let the cluster CIDR through every native nftables input chain, ahead of its drop/reject rules."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_nft_allow
short_description: Accept traffic from the cluster CIDR in native nftables input chains
description:
  - For every base chain on the C(input) hook of an C(ip) or C(inet) table (firewalld's and iptables-nft's own tables
    excepted), inserts C(ip saddr CIDR accept) at the top of the chain, tagged with a comment, unless a rule with
    that comment is already there. Never removes or edits a rule.
  - With I(persist_path) existing (Debian's C(/etc/nftables.conf)), rewrites it from the live ruleset after a backup
    (C(flush ruleset) + C(nft -s list ruleset)), so the rule survives a reboot.
  - Supports check mode and diff mode.
options:
  cidr: {description: Cluster network (IPv4)., type: str, required: true}
  comment: {description: Tag of the rule., type: str, default: ddpfix-cluster}
  persist_path: {description: Rules file to rewrite when it exists., type: path, default: /etc/nftables.conf}
"""

EXAMPLES = r"""
- ddpfix_nft_allow:
    cidr: 192.168.77.0/24
"""

RETURN = r"""
chains: {description: Chains changed (family table chain), returned: always, type: list}
"""

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

SKIP_TABLES = {("inet", "firewalld"), ("ip", "firewalld"), ("ip6", "firewalld")}
IPTABLES_NFT_CHAINS = {"INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"}


def base_input_chains(ruleset):
    items = ruleset.get("nftables", [])
    chains, tagged = [], set()
    for it in items:
        c = it.get("chain")
        if c and c.get("hook") == "input" and c.get("family") in ("ip", "inet"):
            if (c["family"], c["table"]) in SKIP_TABLES or c["name"] in IPTABLES_NFT_CHAINS:
                continue
            chains.append((c["family"], c["table"], c["name"]))
    return chains, items


def has_tag(items, chain, comment):
    fam, table, name = chain
    for it in items:
        r = it.get("rule")
        if r and (r.get("family"), r.get("table"), r.get("chain")) == chain and r.get("comment") == comment:
            return True
    return False


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cidr=dict(type="str", required=True),
            comment=dict(type="str", default="ddpfix-cluster"),
            persist_path=dict(type="path", default="/etc/nftables.conf"),
        ),
        supports_check_mode=True,
    )
    cidr, comment = module.params["cidr"], module.params["comment"]
    if cidr.endswith("/0") or "/" not in cidr:
        module.fail_json(msg="refusing to open to %r: give the cluster network" % cidr)
    rc, out, err = module.run_command(["nft", "-j", "list", "ruleset"])
    if rc != 0:
        module.fail_json(msg="nft -j list ruleset failed: %s" % err.strip())
    chains, items = base_input_chains(json.loads(out or "{}"))
    todo = [c for c in chains if not has_tag(items, c, comment)]
    result = dict(changed=bool(todo), chains=[" ".join(c) for c in todo])
    lines = ["insert rule %s %s %s ip saddr %s accept comment \"%s\"" % (f, t, c, cidr, comment) for f, t, c in todo]
    result["diff"] = {"before": "", "after": "\n".join("nft " + ln for ln in lines) + ("\n" if lines else ""),
                      "after_header": "nft ruleset"}
    if todo and not module.check_mode:
        for f, t, c in todo:
            rc, _, err = module.run_command(["nft", "insert", "rule", f, t, c, "ip", "saddr", cidr, "accept",
                                             "comment", '"%s"' % comment])
            if rc != 0:
                module.fail_json(msg="nft insert rule %s %s %s failed: %s" % (f, t, c, err.strip()), **result)
        path = module.params["persist_path"]
        if path and os.path.exists(path):
            rc, live, err = module.run_command(["nft", "-s", "list", "ruleset"])
            if rc != 0:
                module.fail_json(msg="nft -s list ruleset failed: %s" % err.strip(), **result)
            result["backup_file"] = module.backup_local(path)
            fd, tmp = tempfile.mkstemp(prefix=".ddpfix-nft.", dir=os.path.dirname(path))
            with os.fdopen(fd, "w") as f:
                f.write("#!/usr/sbin/nft -f\n# Persisted by ddpfix from the live ruleset.\nflush ruleset\n\n" + live)
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
            module.atomic_move(tmp, path, unsafe_writes=True)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
