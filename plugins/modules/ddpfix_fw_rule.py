#!/usr/bin/python
"""Runtime only: let the cluster CIDR in through iptables INPUT or the native nftables input chains that refuse it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_fw_rule
short_description: Accept traffic from the cluster CIDR in the live iptables or nftables rule set (runtime only)
description:
  - C(iptables) - inserts C(-s CIDR -m comment --comment COMMENT -j ACCEPT) at the top of the filter table's
    INPUT chain of the given iptables variant (C(legacy), C(nft) or the distribution's default C(iptables)), unless
    ddpfix's accept from CIDR is there already (tagged C(ddpfix-cluster) or with any run's tag).
  - C(nftables) - for every chain of I(nft_chains) (the input base chains the controller's plan chose with the
    audit's evaluator), inserts C(ip saddr CIDR accept comment "COMMENT") at the top, unless ddpfix's accept from
    CIDR is already in that chain (whichever run added it); a planned chain missing from the live rule set fails the
    task (the facts are stale). Without I(nft_chains) (the role run without the controller), every native base chain
    on the C(input) hook of an C(ip)/C(inet) table with a drop or reject rule or a drop policy (firewalld's and
    iptables-nft's tables excepted).
  - I(comment) is the tag of the rules this call adds, the run's tag (C(ddpfix-cluster:RUN)) when the role's guarded
    change calls it, so that its revert removes only them.
  - >-
    C(ufw) - with I(plan_only) only (community.general.ufw adds the rule): reads ufw's own rules file
    I(ufw_rules), whose C(### tuple ###) lines are what C(ufw status) lists, and reports C(pending) unless one rule
    allows every protocol and port from a network containing the CIDR (a rule for port 22 only does not count).
  - I(egress) - the accepts the controller planned for the node's own connects to its peers
    (the egress finding) - for each, C(ip daddr CIDR tcp dport { PORTS } accept comment "COMMENT") at the top of
    that nft chain, or
    C(-d CIDR -p tcp -m multiport --dports PORTS -m comment --comment COMMENT -j ACCEPT) at the top of OUTPUT of that
    iptables backend, unless ddpfix's accept to CIDR is there already. With I(ingress) false only these are added.
  - Never removes or edits a rule and writes no file (the role's ddpfix_fw_persist does that). Check and diff mode.
options:
  backend: {description: Which layer., type: str, required: true, choices: [iptables, nftables, ufw]}
  cidr: {description: Cluster network (IPv4)., type: str, required: true}
  comment: {description: "Tag of the rules it adds (C(ddpfix-cluster), or a run's tag).", type: str,
            default: ddpfix-cluster}
  iptables_variant:
    description: >-
      iptables flavour whose rules block (auto - the default iptables, or the other variant when only that one's
      INPUT chain drops).
    type: str
    default: auto
    choices: [auto, legacy, nft]
  plan_only: {description: Change nothing and report C(pending) (changed stays false)., type: bool, default: false}
  egress:
    description: "The planned egress accepts: C({backend: nftables|iptables|iptables-legacy, family, table, chain,
      ports}) (ports C(29500,32768-60999))."
    type: list
    elements: dict
    default: []
  ingress: {description: Whether to let the cluster in (false - only the I(egress) accepts)., type: bool,
            default: true}
  nft_chains:
    description: "nftables - the input base chains that take the accept, as the controller planned them
      (C({family: ip|inet, table, chain}), at most 8); empty - chosen on the node (see above)."
    type: list
    elements: dict
    default: []
  ufw_rules: {description: "ufw: its IPv4 user rules file.", type: path, default: /etc/ufw/user.rules}
"""

EXAMPLES = r"""
- ddpfix_fw_rule:
    backend: nftables
    cidr: 192.168.77.0/24
"""

RETURN = r"""
chains:
  description: "nftables: every chain that holds (or would hold) ddpfix's rule, as 'family table chain'."
  returned: always
  type: list
iptables: {description: The iptables command used., returned: always, type: str}
pending: {description: Whether the rule is missing (what changed would be)., returned: always, type: bool}
"""

import ipaddress
import json

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_fw import (
    egress_change,
    iptables_bins,
    iptables_blocks,
    iptables_egress_rule,
    iptables_has_egress,
    iptables_has_rule,
    iptables_nft_tables,
    iptables_rule,
    is_ddpfix_comment,
    nft_blocking_input_chains,
    nft_chains_checked,
    nft_egress_args,
    nft_has_egress,
    nft_has_rule,
    nft_input_chains,
    nft_iptables_owned,
    nft_rule_args,
    rule_argument_spec,
    ufw_allows,
)


def _nft_save(module, tool):
    """The tables `TOOL-nft-save` claims (None when it is not installed: iptables-nft wrote no table)."""
    exe = module.get_bin_path(f"{tool}-nft-save")
    if not exe:
        return None
    rc, out, err = module.run_command([exe])
    if rc != 0:
        module.fail_json(msg=f"{tool}-nft-save failed: {err.strip()} (cannot tell iptables-nft's tables from native "
                         "ones; nothing was changed)")
    return iptables_nft_tables(out)


def _egress_cmds(module, egress, cidr, comment, result):
    """The commands that add the planned egress accepts missing from the live rule set."""
    cmds, nft_live, ipt_live = [], None, {}
    for backend, fam, table, chain, ports in egress:
        if backend == "nftables":
            nft = module.get_bin_path("nft", required=True)
            if nft_live is None:
                rc, out, err = module.run_command([nft, "-j", "list", "ruleset"])
                if rc != 0:
                    module.fail_json(msg=f"nft -j list ruleset failed: {err.strip()}")
                nft_live = json.loads(out or "{}")
            result["chains"].append(f"{fam} {table} {chain}")
            if not nft_has_egress(nft_live, (fam, table, chain), cidr, ports=ports):
                cmds.append([nft, "insert", "rule", fam, table, chain, *nft_egress_args(cidr, ports, comment)])
            continue
        ipt, ipt_save, _ = iptables_bins("legacy" if backend == "iptables-legacy" else "auto")
        exe, save = module.get_bin_path(ipt, required=True), module.get_bin_path(ipt_save, required=True)
        if ipt not in ipt_live:
            rc, out, err = module.run_command([save, "-t", "filter"])
            if rc != 0:
                module.fail_json(msg=f"{ipt_save} -t filter failed: {err.strip()}")
            ipt_live[ipt] = out
        if not iptables_has_egress(ipt_live[ipt], cidr, ports):
            cmds.append([exe, "-I", "OUTPUT", "1", *iptables_egress_rule(cidr, ports, comment)])
    return cmds


def main():
    spec = rule_argument_spec(
        iptables_variant=dict(type="str", default="auto", choices=["auto", "legacy", "nft"]),
        plan_only=dict(type="bool", default=False),
        egress=dict(type="list", elements="dict", default=[]),
        ingress=dict(type="bool", default=True),
        nft_chains=dict(type="list", elements="dict", default=[]),
        ufw_rules=dict(type="path", default="/etc/ufw/user.rules"),
    )
    spec["backend"]["choices"] = ["iptables", "nftables", "ufw"]
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    cidr, comment = p["cidr"], p["comment"]
    if cidr.endswith("/0") or "/" not in cidr:
        module.fail_json(msg=f"refusing to open to {cidr!r}: give the cluster network")
    try:
        ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        module.fail_json(msg=f"cidr: {exc}")
    if not is_ddpfix_comment(comment):
        module.fail_json(msg=f"comment must be ddpfix-cluster or a run's tag (ddpfix-cluster:RUN), got {comment!r}")
    if p["backend"] == "ufw":
        if not p["plan_only"]:
            module.fail_json(msg="backend ufw: plan_only only (the role adds ufw's rule with community.general.ufw)")
        try:
            with open(p["ufw_rules"]) as f:
                rules = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            module.fail_json(msg=f"cannot read ufw's rules file {p['ufw_rules']}: {exc}")
        try:
            allowed = ufw_allows(rules, cidr)
        except ValueError as exc:
            module.fail_json(msg=f"cidr {cidr!r}: {exc}")
        module.exit_json(changed=False, chains=[], iptables="iptables", pending=not allowed)
    try:
        egress = [egress_change(c, cidr) for c in p["egress"]]
    except ValueError as exc:
        module.fail_json(msg=f"egress: {exc}")
    try:
        planned = nft_chains_checked(p["nft_chains"])
    except ValueError as exc:
        module.fail_json(msg=f"nft_chains: {exc}")
    ipt, ipt_save, _ = iptables_bins(p["iptables_variant"])
    result = dict(changed=False, chains=[], iptables=ipt)
    cmds = _egress_cmds(module, egress, cidr, comment, result)
    if p["ingress"] and p["backend"] == "iptables":
        exe = module.get_bin_path(ipt, required=True)
        save = module.get_bin_path(ipt_save, required=True)
        rc, out, err = module.run_command([save, "-t", "filter"])
        if rc != 0:
            module.fail_json(msg=f"{ipt_save} -t filter failed: {err.strip()}")
        if p["iptables_variant"] == "auto" and not iptables_blocks(out):
            # legacy and nft iptables both in use: the rule goes to the variant whose INPUT chain blocks
            for alt in ("legacy", "nft"):
                a_ipt, a_save, _ = iptables_bins(alt)
                a_exe, a_save_path = module.get_bin_path(a_ipt), module.get_bin_path(a_save)
                if not (a_exe and a_save_path):
                    continue
                rc, a_out, _ = module.run_command([a_save_path, "-t", "filter"])
                if rc == 0 and iptables_blocks(a_out):
                    ipt, exe, out = a_ipt, a_exe, a_out
                    result["iptables"] = ipt
                    break
        if not iptables_has_rule(out, cidr):
            cmds.append([exe, "-I", "INPUT", "1", *iptables_rule(cidr, comment)])
    elif p["ingress"]:
        nft = module.get_bin_path("nft", required=True)
        rc, out, err = module.run_command([nft, "-j", "list", "ruleset"])
        if rc != 0:
            module.fail_json(msg=f"nft -j list ruleset failed: {err.strip()}")
        ruleset = json.loads(out or "{}")
        if planned:  # the controller's plan (the audit's evaluator chose them)
            gone = [" ".join(c) for c in planned if c not in nft_input_chains(ruleset)]
            if gone:
                module.fail_json(msg=f"the planned chain {', '.join(gone)} is not an input base chain of the live rule "
                                     "set: the firewall changed since the audit (audit again; nothing was changed)")
            chains = planned
        else:  # the role without the controller: chosen here
            chains = nft_blocking_input_chains(ruleset, nft_iptables_owned(ruleset, _nft_save(module, "iptables"),
                                                                           _nft_save(module, "ip6tables")))
        result["chains"] += [" ".join(c) for c in chains]
        for f, t, c in chains:
            if not nft_has_rule(ruleset, (f, t, c), cidr):
                cmds.append([nft, "insert", "rule", f, t, c, *nft_rule_args(cidr, comment)])
    result["pending"] = bool(cmds)
    if p["plan_only"]:
        module.exit_json(**result)
    result["changed"] = bool(cmds)
    shown = [" ".join(c[:1] + [a if " " not in a else f"'{a}'" for a in c[1:]]) for c in cmds]
    result["diff"] = {"before": "", "after": "".join(s + "\n" for s in shown),
                      "before_header": "live rule set", "after_header": "runtime commands"}
    if cmds and not module.check_mode:
        for c in cmds:
            rc, _, err = module.run_command(c)
            if rc != 0:
                module.fail_json(msg="{} failed: {}".format(" ".join(c), err.strip()), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
