"""`ddpfix verify --torch`: a real torch.distributed Gloo all-reduce launched with torchrun from the env files
(role ddpfix_verify), and its failures named."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ddpfix.ansible.results import HostResult
from ddpfix.ansible.run import run_playbook
from ddpfix.diagnose.bounded import shown
from ddpfix.diagnose.match import cause_line
from ddpfix.model.cluster import Cluster
from ddpfix.model.finding import Finding
from ddpfix.progress import Progress
from ddpfix.verify.output import TORCH_FIELDS, capped_output, result_lines


def likely_cause(text: str, finding_ids: Iterable[str]) -> str:
    """The first known failure in a launch's output, from explain's one pattern table."""
    return cause_line(text, finding_ids)


#: The role that launches torchrun, and the module its launch task runs (one launch task runs per play: the backend's).
VERIFY_ROLE = "ddpfix_verify"
TORCHRUN_MODULE = "command"


def torchrun_result(hr: HostResult | None) -> dict[str, Any]:
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
        res = torchrun_result(hr)
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
        entry = torch_entry(node.name, res, ids.get(node.name, set()) | ids.get("", set()))
        out.append(entry)
    return out


def torch_entry(host: str, res: dict[str, Any], finding_ids: Iterable[str] = ()) -> dict[str, Any]:
    """One node's verdict from its torchrun task result: its output capped, its `DDPFIX_RESULT` line validated (a
    malformed one is this node's error), the likely cause of a failure from explain's table."""
    stdout, stderr, cuts = capped_output(res)
    results, bad = result_lines(stdout, RESULT_PREFIX, TORCH_FIELDS)
    result = results[-1] if results else None
    ok = res.get("rc") == 0 and bool(result and result.get("ok")) and not bad
    entry: dict[str, Any] = {"host": host, "ok": ok, "rc": res.get("rc"), "result": result}
    if cuts:
        entry["output_cut"] = cuts
    if not ok:
        text = stderr + "\n" + stdout
        entry["error"] = bad[0] if bad else error_line(text, res.get("rc"))
        entry["cause"] = likely_cause(text, finding_ids)
        if TORCH_MISSING.search(text):
            entry["missing"] = "torch"
        elif PYTHON_MISSING.search(text):
            entry["missing"] = "ddp_python"
    return entry


RESULT_PREFIX = "DDPFIX_RESULT "
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


def error_line(text: str, rc: Any) -> str:
    lines = [
        ln.strip()
        for ln in text.splitlines()
        if ln.strip() and not ln.strip().startswith(("frame #", "Exception raised from"))
    ]
    for ln in reversed(lines):
        if EXC_LINE.match(ln) and "ChildFailedError" not in ln:
            return shown(ln, 400)
    for pat in ("Error:", "Error ", "error:", "failed", "Timed out", "timed out"):
        for ln in reversed(lines):
            if pat in ln and not ln.startswith("File "):
                return shown(ln, 400)
    if rc == 124:
        return "torchrun killed at the deadline (timeout)"
    return shown(lines[-1], 400) if lines else f"exit code {rc}"
