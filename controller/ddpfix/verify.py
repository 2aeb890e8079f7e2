"""Verification of the end state: testinfra checks on every node, the active probes, and optionally a real
torch.distributed all-reduce launched with torchrun from the env files."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpfix import ansiblecfg, paths
from ddpfix.checks import Context, _is_loopback
from ddpfix.findings import Finding
from ddpfix.inventory import GROUP, Cluster
from ddpfix.envtemplate import write_needed
from ddpfix.progress import Progress
from ddpfix.runner import run_playbook

BLOCK_RE = re.compile(r"# BEGIN ddpfix managed block\n(.*?)# END ddpfix managed block", re.S)


@dataclass
class Check:
    host: str
    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "check": self.name, "ok": self.ok, "detail": self.detail}


@contextlib.contextmanager
def _user_ansible_config(inventories: list[str]) -> Iterator[dict[str, Any]]:
    """testinfra's ansible backend with the user's Ansible configuration (the file ddpfix runs Ansible with).

    testinfra reads ANSIBLE_CONFIG (ssh_args, remote_user, remote_port, become, ssh_common_args) and the
    inventory's connection variables itself; `private_key_file` from the config is passed on explicitly
    (testinfra reads only the inventory variable). Yields the extra get_host() keyword arguments."""
    cfg = ansiblecfg.load(inventories)
    kwargs: dict[str, Any] = {}
    key = os.environ.get("ANSIBLE_PRIVATE_KEY_FILE") or cfg.parser.get("defaults", "private_key_file", raw=True,
                                                                       fallback=None)
    if key:
        p = Path(key).expanduser()
        kwargs["ssh_identity_file"] = str(p if p.is_absolute() or cfg.path is None else cfg.path.parent / p)
    saved = os.environ.get("ANSIBLE_CONFIG")
    if cfg.path is not None:
        os.environ["ANSIBLE_CONFIG"] = str(cfg.path)
    try:
        yield kwargs
    finally:
        if saved is None:
            os.environ.pop("ANSIBLE_CONFIG", None)
        else:
            os.environ["ANSIBLE_CONFIG"] = saved


def testinfra_checks(ctx: Context, findings: Iterable[Finding]) -> list[Check]:
    """End-state checks through testinfra (over the inventory's own SSH settings and the user's ansible.cfg)."""
    with _user_ansible_config(list(ctx.cluster.inventories)) as kwargs:
        return _testinfra_checks(ctx, findings, kwargs)


def _testinfra_host(name: str, inv: str, host_kwargs: dict[str, Any]) -> Any:
    """testinfra's host for `name` as its ansible backend builds it (ssh with the inventory's and ansible.cfg's
    settings, sudo for become), with SSH connection reuse: without a ControlPath testinfra's ControlMaster option
    does nothing and every command pays a full SSH handshake (two behind a bastion)."""
    import testinfra
    from testinfra.utils.ansible_runner import AnsibleRunner

    host = AnsibleRunner.get_runner(inv).get_host(name, **host_kwargs)
    if host is None:  # a connection type testinfra runs through Ansible itself
        return testinfra.get_host(f"ansible://{name}?ansible_inventory={inv}", **host_kwargs)
    backend = host.backend
    if getattr(backend, "controlpersist", 0) and getattr(backend, "controlpath", "") is None:
        cp = paths.state_dir() / "cp"
        cp.mkdir(parents=True, exist_ok=True, mode=0o700)
        backend.controlpath = f"{cp}/ti-%%C"  # testinfra %-formats the command line: %% is ssh's %
    return host


def _testinfra_checks(ctx: Context, findings: Iterable[Finding], host_kwargs: dict[str, Any]) -> list[Check]:
    inv = ctx.cluster.inventories[0]
    out: list[Check] = []
    blocks: dict[str, str] = {}
    by_host: dict[str, set[str]] = {}
    for f in findings:
        by_host.setdefault(f.host or "", set()).add(f.id)
    for name, facts in ctx.audited():
        host = _testinfra_host(name, inv, host_kwargs)
        envf = host.file(ctx.cluster.env_path)
        if not envf.exists:
            out.append(Check(name, "env file present", False, f"{ctx.cluster.env_path} missing"))
        else:
            # ddpfix's part only (the managed block, none of its keys set again outside it), from the node's facts:
            # the file's content (the user's secrets) is not read back to the controller
            ef = facts.get("env_file") or {}
            same = not write_needed(ef, ctx.plan[name], ctx.cluster.env_template)
            shadowed = sorted(set(ef.get("outside_keys") or ()) & set(ctx.plan[name].env))
            out.append(Check(name, "env file present and as planned", same,
                             f"mode {oct(envf.mode)}" + ("" if same else "; managed block differs from the plan")
                             + (f"; also set outside the block: {', '.join(shadowed)}" if shadowed else "")))
        hn = host.check_output("hostname")
        addrs = host.addr(hn).ipv4_addresses if hn else []
        loop = [a for a in addrs if _is_loopback(a)]
        out.append(Check(name, "hostname not on loopback", bool(addrs) and not loop,
                         f"{hn} -> {', '.join(addrs) or 'nothing'}"))
        hosts_text = host.file("/etc/hosts").content_string
        m = BLOCK_RE.search(hosts_text)
        blocks[name] = m.group(1) if m else ""
        chrony = host.process.filter(comm="chronyd")
        tracking = host.run("chronyc -c -n tracking")
        synced = tracking.rc == 0 and "Not synchronised" not in tracking.stdout and tracking.stdout.strip() != ""
        out.append(Check(name, "chrony running and synchronised", bool(chrony) and synced,
                         f"{len(chrony)} chronyd; tracking: {tracking.stdout.strip()[:80] or tracking.stderr.strip()[:80]}"))
        fw_ids = sorted(i for i in by_host.get(name, set()) if i.startswith("firewall.") and i != "firewall.world-open")
        out.append(Check(name, "firewall admits the cluster CIDR", not fw_ids, ", ".join(fw_ids) or f"{ctx.cidr} allowed"))
        pr = ctx.hosts[name].probe or {}
        bad = [c for c in pr.get("connects") or [] if not c.get("ok")]
        out.append(Check(name, "probes (master port, ring peers) connect", not bad,
                         "; ".join(f"{c['name']} {c['address']}:{c['port']}: {c['error']}" for c in bad)
                         or f"{len(pr.get('connects') or [])} connects ok"))
    distinct = set(blocks.values())
    for name, b in blocks.items():
        # Identical everywhere; absent everywhere is fine too (the cluster resolves names without ddpfix's block).
        detail = ("present" if b else "no managed block") + ("" if len(distinct) == 1 else ": differs between nodes")
        out.append(Check(name, "managed /etc/hosts block identical on all nodes", len(distinct) == 1, detail))
    return out


CAUSES = [
    (re.compile(r"failed to run command|No module named .?torch", re.I),
     "ddp_python on this node cannot run torch (set ddp_python to an interpreter with torch installed)"),
    (re.compile(r"127\.0\.[01]\.1|remote=\[127\.|loopback", re.I),
     "an address on loopback was advertised: hostname -> 127.x (hosts.hostname-loopback)"),
    (re.compile(r"Unable to find address for|no such device|family \d+ is neither", re.I),
     "the socket interface name does not exist on this node (netif.missing)"),
    (re.compile(r"waiting for clients|DistStoreError", re.I),
     "the master's store did not hear from every node: workers cannot reach MASTER_ADDR:MASTER_PORT (firewall/route)"),
    (re.compile(r"No route to host|errno: 113|EHOSTUNREACH", re.I),
     "no route to host: an ICMP-rejecting firewall (firewalld's default) or a wrong route on the way to that address"),
    (re.compile(r"Connection refused|ECONNREFUSED", re.I),
     "connection refused: nothing listening, or a REJECT rule (firewall.* / wrong MASTER_ADDR)"),
    (re.compile(r"timed out|DistNetworkError", re.I),
     "connection timed out: a DROP rule, a wrong route or a non-cluster MASTER_ADDR (firewall.*, route.*, addr.*)"),
    (re.compile(r"Connection reset by peer", re.I),
     "connection reset by a peer: its firewall rejects the ports Gloo opens (firewall.peer-ports-blocked)"),
    (re.compile(r"No such file or directory.*ddp\.env|ddp\.env: No such file", re.I),
     "no env file: run ddpfix env --apply"),
]


def likely_cause(text: str, finding_ids: Iterable[str]) -> str:
    ids = sorted(set(finding_ids))
    for rx, cause in CAUSES:
        if rx.search(text):
            return cause + (f"; audit findings here: {', '.join(ids)}" if ids else "")
    return f"audit findings here: {', '.join(ids)}" if ids else "unknown: see the error text"


def run_torch(cluster: Cluster, *, limit: str | None, forks: int | None, verbosity: int,
              progress: Progress | None, findings: Iterable[Finding]) -> list[dict[str, Any]]:
    run = run_playbook(
        "verify_torch.yml", cluster.inventories, extravars={"ddpfix_target": GROUP}, limit=limit, forks=forks,
        n_hosts=len(cluster.nodes), verbosity=verbosity, on_event=progress.on_event if progress else None,
        name="verify-torch",
    )
    ids: dict[str, set[str]] = {}
    for f in findings:
        ids.setdefault(f.host or "", set()).add(f.id)
    out = []
    for node in cluster.nodes:
        hr = run.hosts.get(node.name)
        res = (hr.result("verify | torchrun") if hr else None) or {}
        if hr is None or hr.unreachable or not res:
            out.append({"host": node.name, "ok": False, "error": (hr.message if hr else "did not run"),
                        "cause": "node unreachable or the run failed before torchrun"})
            continue
        stdout, stderr = res.get("stdout", ""), res.get("stderr", "")
        result = None
        for line in stdout.splitlines():
            if line.startswith("DDPFIX_RESULT "):
                result = json.loads(line.split(" ", 1)[1])
        ok = res.get("rc") == 0 and bool(result and result.get("ok"))
        entry: dict[str, Any] = {"host": node.name, "ok": ok, "rc": res.get("rc"), "result": result}
        if not ok:
            text = stderr + "\n" + stdout
            entry["error"] = _error_line(text, res.get("rc"))
            entry["cause"] = likely_cause(text, ids.get(node.name, set()) | ids.get("", set()))
            if TORCH_MISSING.search(text):
                entry["missing"] = "torch"
            elif PYTHON_MISSING.search(text):
                entry["missing"] = "ddp_python"
        out.append(entry)
    return out


TORCH_MISSING = re.compile(r"No module named '?torch\b")
PYTHON_MISSING = re.compile(r"failed to run command .+: No such file or directory")


def torch_missing_line(results: Iterable[dict[str, Any]]) -> str | None:
    """One line when ddp_python is not there or cannot import torch on some node (the others then fail waiting)."""
    results = list(results)
    for what in ("torch", "ddp_python"):
        missing = [r for r in results if r.get("missing") == what]
        if missing:
            return (f"verify --torch: {what} is missing on {', '.join(r['host'] for r in missing)}: "
                    f"{missing[0]['error']}; install torch there or set ddp_python to an interpreter that has it")
    return None


EXC_LINE = re.compile(r"^[\w.]*(Error|Exception|Timeout)\b[^ ]*: ")


def _error_line(text: str, rc: Any) -> str:
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.strip().startswith(("frame #", "Exception raised from"))]
    for ln in reversed(lines):
        if EXC_LINE.match(ln) and "ChildFailedError" not in ln:
            return ln[:400]
    for pat in ("Error:", "Error ", "error:", "failed", "Timed out", "timed out"):
        for ln in reversed(lines):
            if pat in ln and not ln.startswith("File "):
                return ln[:400]
    if rc == 124:
        return "torchrun killed at the deadline (timeout)"
    return (lines[-1][:400] if lines else f"exit code {rc}")
