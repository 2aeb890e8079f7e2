"""Verification of the end state: testinfra checks on every node, the active probes, and optionally a real
torch.distributed all-reduce launched with torchrun from the env files."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpfix import explain, nccl, paths
from ddpfix.ansible import config as ansiblecfg
from ddpfix.ansible.results import HostResult
from ddpfix.ansible.run import run_playbook
from ddpfix.envtemplate import write_needed
from ddpfix.fabric import has_rdma
from ddpfix.model.cluster import Cluster
from ddpfix.model.finding import Finding
from ddpfix.plan import managed_block
from ddpfix.progress import Progress
from ddpfix.rules.context import Context
from ddpfix.rules.context import is_loopback as _is_loopback
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
    from ddpfix.ansible import args as ansibleargs

    cfg = ansiblecfg.load(inventories)
    kwargs: dict[str, Any] = {}
    key = (ansibleargs.current().private_key or os.environ.get("ANSIBLE_PRIVATE_KEY_FILE")
           or cfg.parser.get("defaults", "private_key_file", raw=True, fallback=None))
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


def _control_dir() -> Path:
    """A directory for ssh control sockets whose paths fit a Unix socket address (108 bytes, with ssh's 40-character
    %C and its temporary suffix): the state dir's cp/, else a private directory under /tmp."""
    cp = paths.state_dir() / "cp"
    if len(str(cp)) > 40:
        cp = Path("/tmp") / f"ddpfix-cp-{os.getuid()}"
    cp.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = cp.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{cp} is not a private directory of this user: remove it or set DDPFIX_STATE_DIR")
    return cp


@contextlib.contextmanager
def _cli_connection(hostvars: Mapping[str, Any]) -> Iterator[None]:
    """-u/-b for testinfra's host as ansible-playbook applies them: below the host's own ansible_user/ansible_become
    (testinfra reads ANSIBLE_REMOTE_USER/ANSIBLE_BECOME above the inventory, so they are set only where the host has
    none)."""
    from ddpfix.ansible import args as ansibleargs

    args = ansibleargs.current()
    env: dict[str, str] = {}
    if args.user and "ansible_user" not in hostvars:
        env["ANSIBLE_REMOTE_USER"] = args.user
    if args.become and "ansible_become" not in hostvars:
        env["ANSIBLE_BECOME"] = "True"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _testinfra_host(name: str, inv: str, host_kwargs: dict[str, Any]) -> Any:
    """testinfra's host for `name` as its ansible backend builds it (ssh with the inventory's and ansible.cfg's
    settings, sudo for become), with SSH connection reuse: without a ControlPath testinfra's ControlMaster option
    does nothing and every command pays a full SSH handshake (two behind a bastion)."""
    import testinfra
    from testinfra.utils.ansible_runner import AnsibleRunner

    runner = AnsibleRunner.get_runner(inv)
    with _cli_connection(runner.inventory["_meta"].get("hostvars", {}).get(name, {})):
        host = runner.get_host(name, **host_kwargs)
    if host is None:  # a connection type testinfra runs through Ansible itself
        return testinfra.get_host(f"ansible://{name}?ansible_inventory={inv}", **host_kwargs)
    backend = host.backend
    if getattr(backend, "controlpersist", 0) and getattr(backend, "controlpath", "") is None:
        backend.controlpath = f"{_control_dir()}/ti-%%C"  # testinfra %-formats the command line: %% is ssh's %
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
            ef: Mapping[str, Any] = facts.get("env_file") or {}
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
        blocks[name] = managed_block(host.file("/etc/hosts").content_string)
        out.append(chrony_check(name, facts, ctx.thresholds.max_offset_s))
        fw_ids = sorted(i for i in by_host.get(name, set()) if i.startswith("firewall.") and i != "firewall.world-open")
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
    distinct = set(blocks.values())
    for name, b in blocks.items():
        # Identical everywhere; absent everywhere is fine too (the cluster resolves names without ddpfix's block).
        detail = ("present" if b else "no managed block") + ("" if len(distinct) == 1 else ": differs between nodes")
        out.append(Check(name, "managed /etc/hosts block identical on all nodes", len(distinct) == 1, detail))
    return out


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


def likely_cause(text: str, finding_ids: Iterable[str]) -> str:
    """The first known failure in a launch's output, from explain's one pattern table."""
    return explain.cause_line(text, finding_ids)


#: The role that launches torchrun, and the module its launch task runs (one launch task runs per play: the backend's).
VERIFY_ROLE = "ddpfix_verify"
TORCHRUN_MODULE = "shell"


def _torchrun_result(hr: HostResult | None) -> dict[str, Any]:
    """The torchrun launch's result on one host (the role's shell task that ran), {} when there is none."""
    t = hr.find(TORCHRUN_MODULE, role=VERIFY_ROLE, ran=True) if hr else None
    return t.res if t else {}


def run_torch(
    cluster: Cluster,
    *,
    limit: str | None,
    forks: int | None,
    verbosity: int,
    progress: Progress | None,
    findings: Iterable[Finding],
) -> list[dict[str, Any]]:
    run = run_playbook(
        # every node at once, whatever the fork cap: a rendezvous needs all of them started together
        "verify_torch.yml",
        cluster.inventories,
        extravars={},
        limit=limit,
        forks=max(forks or 0, len(cluster.nodes)),
        n_hosts=len(cluster.nodes),
        verbosity=verbosity,
        on_event=progress.on_event if progress else None,
        name="verify-torch",
    )
    ids: dict[str, set[str]] = {}
    for f in findings:
        ids.setdefault(f.host or "", set()).add(f.id)
    out = []
    for node in cluster.nodes:
        hr = run.hosts.get(node.name)
        res = _torchrun_result(hr)
        if hr is None or hr.unreachable or not res:
            out.append(
                {
                    "host": node.name,
                    "ok": False,
                    "error": (hr.message if hr else "did not run"),
                    "cause": "node unreachable or the run failed before torchrun",
                }
            )
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
            return (
                f"verify --torch: {what} is missing on {', '.join(r['host'] for r in missing)}: "
                f"{missing[0]['error']}; install torch there or set ddp_python to an interpreter that has it"
            )
    return None


EXC_LINE = re.compile(r"^[\w.]*(Error|Exception|Timeout)\b[^ ]*: ")


def _error_line(text: str, rc: Any) -> str:
    lines = [
        ln.strip()
        for ln in text.splitlines()
        if ln.strip() and not ln.strip().startswith(("frame #", "Exception raised from"))
    ]
    for ln in reversed(lines):
        if EXC_LINE.match(ln) and "ChildFailedError" not in ln:
            return ln[:400]
    for pat in ("Error:", "Error ", "error:", "failed", "Timed out", "timed out"):
        for ln in reversed(lines):
            if pat in ln and not ln.startswith("File "):
                return ln[:400]
    if rc == 124:
        return "torchrun killed at the deadline (timeout)"
    return lines[-1][:400] if lines else f"exit code {rc}"


# ---------------------------------------------------------------- verify --backend nccl

NO_GPU = re.compile(r"Cuda is not available|torch\.cuda\.is_available\(\) is False|no GPU for NCCL", re.I)
def _nccl_cause(text: str, finding_ids: Iterable[str]) -> str:
    return explain.cause_line(text, finding_ids)


def nccl_entry(
    host: str, res: dict[str, Any], rdma_present: bool, min_busbw: float | None, finding_ids: Iterable[str] = ()
) -> dict[str, Any]:
    """One node's (or pair's) verdict from the torchrun task result: sweep with algbw/busbw, transport, failures."""
    stdout, stderr = res.get("stdout", "") or "", res.get("stderr", "") or ""
    text = stdout + "\n" + stderr
    transport = nccl.parse_transport(text)
    results = nccl.parse_results(stdout)
    entry: dict[str, Any] = {"host": host, "rc": res.get("rc"), "transport": transport.to_json(), "sweep": []}
    if NO_GPU.search(text):
        entry.update(
            ok=False,
            skipped=True,
            error=f"no GPU on {host}: torch.cuda.is_available() is False",
            cause="verify --backend nccl needs a CUDA GPU and torch with CUDA on every node",
        )
        return entry
    r = results[0] if results else None
    if r:
        world = int(r.get("world_size") or 0)
        entry["world_size"] = world
        entry["gpus"] = r.get("gpus")
        entry["nccl"] = r.get("nccl")
        for pt in r.get("sweep") or []:
            alg = nccl.algbw(int(pt["size"]), float(pt["seconds"]))
            entry["sweep"].append(
                {
                    "size": int(pt["size"]),
                    "time_us": round(float(pt["seconds"]) * 1e6, 1),
                    "algbw": round(alg, 3),
                    "busbw": round(nccl.busbw(alg, world), 3),
                }
            )
    problems = []
    if res.get("rc") != 0 or not r or not r.get("ok"):
        problems.append(_error_line(text, res.get("rc")) if res.get("rc") != 0 or not r else "all-reduce result wrong")
    fb = nccl.fallback_error(transport, rdma_present)
    if fb:
        problems.append(fb)
    slow = nccl.below_threshold(entry["sweep"], min_busbw)
    if slow:
        problems.append(
            f"busbw {slow[0]['busbw']:g} GB/s at {nccl.format_size(slow[0]['size'])} is below --min-busbw {min_busbw:g}"
        )
    entry["ok"] = not problems
    if problems:
        entry["error"] = "; ".join(problems)
        entry["cause"] = (
            _nccl_cause(text, finding_ids)
            if (res.get("rc") != 0 or not r)
            else ("the transport or the links are slower than required: see transport and the fabric.* findings")
        )
    return entry


def run_nccl(
    ctx: Context,
    *,
    sizes: tuple[int, ...],
    iters: int,
    min_busbw: float | None,
    pairs: bool,
    limit: str | None,
    forks: int | None,
    verbosity: int,
    progress: Progress | None,
    findings: Iterable[Finding],
) -> dict[str, Any]:
    """The whole-gang sweep (and with `pairs`, one two-node sweep per ring neighbour pair)."""
    cluster = ctx.cluster
    ids: dict[str, set[str]] = {}
    for f in findings:
        ids.setdefault(f.host or "", set()).add(f.id)
    base = {
        "ddpfix_verify_backend": "nccl",
        "ddpfix_verify_sizes": list(sizes),
        "ddpfix_verify_iters": iters,
    }

    def one(extravars: dict[str, Any], hosts: list[str], name: str) -> dict[str, dict[str, Any]]:
        lim = ",".join(hosts)
        run = run_playbook(
            "verify_torch.yml",
            cluster.inventories,
            extravars={**base, **extravars},
            limit=lim if not limit else f"{limit}:&{lim}",
            forks=max(forks or 0, len(hosts)),
            n_hosts=len(hosts),
            verbosity=verbosity,
            on_event=progress.on_event if progress else None,
            name=name,
        )
        out = {}
        for h in hosts:
            hr = run.hosts.get(h)
            res = _torchrun_result(hr)
            if hr is None or hr.unreachable or not res:
                out[h] = {
                    "host": h,
                    "ok": False,
                    "error": hr.message if hr else "did not run",
                    "cause": "node unreachable or the run failed before torchrun",
                    "sweep": [],
                }
                continue
            out[h] = nccl_entry(h, res, has_rdma(ctx.facts.get(h)), min_busbw, ids.get(h, set()) | ids.get("", set()))
        return out

    gang = one({}, cluster.names, "verify-nccl")
    doc: dict[str, Any] = {"gang": [gang[n] for n in cluster.names], "pairs": None}
    if pairs and not all(e.get("skipped") for e in gang.values()):
        doc["pairs"] = []
        for a, b in nccl.ring_pairs(cluster.names):
            master = ctx.plan[a].address or cluster.node(a).address
            over = {
                a: {"NNODES": 2, "NODE_RANK": 0, "MASTER_ADDR": master},
                b: {"NNODES": 2, "NODE_RANK": 1, "MASTER_ADDR": master},
            }
            r = one({"ddpfix_verify_overrides": over}, [a, b], f"verify-nccl-{a}-{b}")
            ea = r[a]
            top = max(ea.get("sweep") or [{}], key=lambda p: p.get("size", 0))
            doc["pairs"].append(
                {
                    "pair": [a, b],
                    "ok": r[a]["ok"] and r[b]["ok"],
                    "busbw": top.get("busbw"),
                    "size": top.get("size"),
                    "transport": ea.get("transport", {}).get("kind"),
                    "error": "; ".join(f"{h}: {r[h]['error']}" for h in (a, b) if r[h].get("error")) or None,
                }
            )
    return doc


def nccl_skip_line(doc: dict[str, Any]) -> str | None:
    gang = doc.get("gang") or []
    if gang and all(e.get("skipped") for e in gang):
        return (
            f"verify --backend nccl: skipped, no GPU on {', '.join(e['host'] for e in gang)} "
            "(torch.cuda.is_available() is False); run it on GPU nodes with CUDA torch (ddp_python)"
        )
    return None
