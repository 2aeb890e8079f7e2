"""The end state `ddpfix verify` checks: the audit's judgements of what its facts see (hostname on loopback, the
/etc/hosts block, chrony, the firewall, the env file against the plan, the live probes), and through testinfra only
what the facts cannot see (the env file's presence and mode, read live)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpfix import paths
from ddpfix.ansible import args as ansibleargs
from ddpfix.ansible import config as ansiblecfg
from ddpfix.ansible.env import environ
from ddpfix.envtemplate import write_needed
from ddpfix.model.cluster import Cluster
from ddpfix.model.finding import Finding
from ddpfix.rules import firewall as fw_rules
from ddpfix.rules import registry
from ddpfix.rules.context import Context
from ddpfix.rules.firewall import WORLD_OPEN
from ddpfix.rules.hosts import BLOCK_DIFFERS, HOSTNAME_LOOPBACK
from ddpfix.rules.time import chrony_unsynchronised

#: The schema id of `ddpfix verify --format json` (controller/ddpfix/schemas/ddpfix.verify.v1.json).
SCHEMA = "ddpfix.verify/v1"


@dataclass
class Check:
    host: str
    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "check": self.name, "ok": self.ok, "detail": self.detail}


def document(cluster: Cluster, ok: bool, checks: Iterable[Check], torch: list[dict[str, Any]] | None,
             nccl_doc: dict[str, Any] | None) -> dict[str, Any]:
    """`ddpfix verify --format json` (schema `ddpfix.verify/v1`)."""
    return {"schema": SCHEMA, "command": "verify", "inventory": list(cluster.inventories), "ok": ok,
            "checks": [c.to_json() for c in checks], "torch": torch, "nccl": nccl_doc}


@contextlib.contextmanager
def _user_ansible_config(inventories: list[str]) -> Iterator[dict[str, Any]]:
    """testinfra's ansible backend with the user's Ansible configuration (the file ddpfix runs Ansible with).

    testinfra reads ANSIBLE_CONFIG (ssh_args, remote_user, remote_port, become, ssh_common_args) and the
    inventory's connection variables itself; `private_key_file` from the config is passed on explicitly
    (testinfra reads only the inventory variable). Yields the extra get_host() keyword arguments."""

    cfg = ansiblecfg.load(inventories)
    kwargs: dict[str, Any] = {}
    key = (ansibleargs.current().private_key or os.environ.get("ANSIBLE_PRIVATE_KEY_FILE")
           or cfg.parser.get("defaults", "private_key_file", raw=True, fallback=None))
    if key:
        p = Path(key).expanduser()
        kwargs["ssh_identity_file"] = str(p if p.is_absolute() or cfg.path is None else cfg.path.parent / p)
    with environ({"ANSIBLE_CONFIG": str(cfg.path)} if cfg.path is not None else {}):
        yield kwargs


def testinfra_checks(ctx: Context, findings: Iterable[Finding]) -> list[Check]:
    """End-state checks through testinfra (over the inventory's own SSH settings and the user's ansible.cfg)."""
    with _user_ansible_config(list(ctx.cluster.inventories)) as kwargs:
        return _testinfra_checks(ctx, findings, kwargs)


@contextlib.contextmanager
def _cli_connection(hostvars: Mapping[str, Any]) -> Iterator[None]:
    """-u/-b for testinfra's host as ansible-playbook applies them: below the host's own ansible_user/ansible_become
    (testinfra reads ANSIBLE_REMOTE_USER/ANSIBLE_BECOME above the inventory, so they are set only where the host has
    none)."""

    args = ansibleargs.current()
    env: dict[str, str] = {}
    if args.user and "ansible_user" not in hostvars:
        env["ANSIBLE_REMOTE_USER"] = args.user
    if args.become and "ansible_become" not in hostvars:
        env["ANSIBLE_BECOME"] = "True"
    with environ(env):
        yield


def _testinfra_host(name: str, inv: str, host_kwargs: dict[str, Any]) -> Any:
    """testinfra's host for `name` as its ansible backend builds it (ssh with the inventory's and ansible.cfg's
    settings, sudo for become), with SSH connection reuse: without a ControlPath testinfra's ControlMaster option
    does nothing and every command pays a full SSH handshake (two behind a bastion)."""
    # testinfra loads only for verify --endstate (heavy; the rest of verify runs without it)
    import testinfra
    from testinfra.utils.ansible_runner import AnsibleRunner

    runner = AnsibleRunner.get_runner(inv)
    with _cli_connection(runner.inventory["_meta"].get("hostvars", {}).get(name, {})):
        host = runner.get_host(name, **host_kwargs)
    if host is None:  # a connection type testinfra runs through Ansible itself
        return testinfra.get_host(f"ansible://{name}?ansible_inventory={inv}", **host_kwargs)
    backend = host.backend
    if getattr(backend, "controlpersist", 0) and getattr(backend, "controlpath", "") is None:
        # ssh's %C is 40 characters; testinfra %-formats the command line: %% is ssh's %
        backend.controlpath = f"{paths.control_dir(len('ti-') + 40)}/ti-%%C"
    return host


def _testinfra_checks(ctx: Context, findings: Iterable[Finding], host_kwargs: dict[str, Any]) -> list[Check]:
    """The end state. What the audit's facts and findings (of this verify run's audit) can see is read from them,
    judged once, by the audit's checks (hostname on loopback, the /etc/hosts block, chrony, the firewall, the env
    file against the plan); testinfra adds only what they cannot: the env file's presence and mode, read live."""
    inv = ctx.cluster.inventories[0]
    out: list[Check] = []
    blocks: dict[str, str | None] = {}
    by_host: dict[str, set[str]] = {}
    for f in findings:
        by_host.setdefault(f.host or "", set()).add(f.id)
    block_differs = BLOCK_DIFFERS.id in by_host.get("", set())
    blocking = registry.area_ids(fw_rules.__name__) - {WORLD_OPEN.id}  # the firewall findings that stop traffic
    for name, facts in ctx.audited():
        host = _testinfra_host(name, inv, host_kwargs)
        envf = host.file(ctx.cluster.env_path)
        if not envf.exists:
            out.append(Check(name, "env file present", False, f"{ctx.cluster.env_path} missing"))
        else:
            # ddpfix's part only (the managed block, none of its keys set again outside it), from the node's facts:
            # the file's content (the user's secrets) is not read back to the controller
            ef: Mapping[str, Any] = facts.get("env_file") or {}
            same = not write_needed(ef, ctx.plan[name], ctx.cluster.env_template)
            shadowed = sorted(set(ef.get("outside_keys") or ()) & set(ctx.plan[name].env))
            out.append(Check(name, "env file present and as planned", same,
                             f"mode {oct(envf.mode)}" + ("" if same else "; managed block differs from the plan")
                             + (f"; also set outside the block: {', '.join(shadowed)}" if shadowed else "")))
        out.append(hostname_check(name, facts, by_host.get(name, set())))
        if "hosts_file" not in ctx.unread(name) and "hosts_block_sha256" in facts:
            blocks[name] = facts.get("hosts_block_sha256")
        out.append(chrony_check(name, facts, ctx.thresholds.max_offset_s))
        fw_ids = sorted(by_host.get(name, set()) & blocking)
        detail = ", ".join(fw_ids) or f"{ctx.cidr} allowed"
        out.append(Check(name, "firewall admits the cluster CIDR", not fw_ids, detail))
        pr = ctx.hosts[name].probe or {}
        bad = [c for c in pr.get("connects") or [] if not c.get("ok")]
        out.append(
            Check(
                name,
                "probes (master port, ring peers) connect",
                not bad,
                "; ".join(f"{c['name']} {c['address']}:{c['port']}: {c['error']}" for c in bad)
                or f"{len(pr.get('connects') or [])} connects ok",
            )
        )
    for name, b in blocks.items():
        # Identical everywhere; absent everywhere is fine too (the cluster resolves names without ddpfix's block):
        # the audit's BLOCK_DIFFERS, from each node's block digest
        detail = ("present" if b else "no managed block") + (": differs between nodes" if block_differs else "")
        out.append(Check(name, "managed /etc/hosts block identical on all nodes", not block_differs, detail))
    return out


def hostname_check(name: str, facts: Mapping[str, Any], ids: set[str]) -> Check:
    """The node's hostname does not resolve to a loopback address: the audit's HOSTNAME_LOOPBACK (`ids`: the
    node's finding ids), shown with what the node resolved its hostname to (its facts' `resolve_self`)."""
    hn = str(facts.get("hostname") or "")
    got = (facts.get("resolve_self") or {}).get(hn) if hn else None
    addrs = [str(a) for a in got] if isinstance(got, list) else []
    ok = bool(addrs) and HOSTNAME_LOOPBACK.id not in ids
    return Check(name, "hostname not on loopback", ok, f"{hn} -> {', '.join(addrs) or 'nothing'}")


def chrony_check(name: str, facts: Mapping[str, Any], max_offset_s: float) -> Check:
    """chronyd running and synchronised, judged as the audit judges it (`chrony_unsynchronised`) on the facts that
    the audit of this verify run collected."""
    t = facts.get("time") or {}
    tr = t.get("chrony_tracking")
    if "chronyd" not in (t.get("daemons") or []):
        return Check(
            name,
            "chrony running and synchronised",
            False,
            f"no chronyd; time daemons: {', '.join(t.get('daemons') or []) or 'none'}",
        )
    problem = chrony_unsynchronised(tr, max_offset_s)
    detail = (
        f"{problem[0]}: {problem[1]}"
        if problem
        else f"chronyd synchronised to {tr.get('ref_name') if tr else '?'}, offset "
        f"{float((tr or {}).get('system_offset') or 0.0):+.6f}s"
    )
    return Check(name, "chrony running and synchronised", problem is None, detail)
