"""Reports: a readable table and a stable, versioned JSON document (`ddpfix.report/v1`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ddpfix import __version__
from ddpfix.model.finding import Finding, Severity

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA = "ddpfix.report/v1"
_SEV_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def summary(findings: Iterable[Finding], hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    fl = list(findings)
    return {
        "hosts": len(hosts),
        "reachable": sum(1 for h in hosts.values() if h.get("reachable")),
        # a node whose module failed answered over SSH: counted apart (`module_failed`), never as unreachable
        "unreachable": sum(1 for h in hosts.values() if not h.get("reachable") and not h.get("module_failed")),
        "module_failed": sum(1 for h in hosts.values() if h.get("module_failed")),
        "findings": {s.label: sum(1 for f in fl if f.severity == s) for s in sorted(Severity, reverse=True)},
        "not_evaluated": sum(len(h.get("not_evaluated") or []) for h in hosts.values()),
    }


def document(command: str, inventory: Iterable[str], hosts: Mapping[str, Mapping[str, Any]],
             findings: Iterable[Finding], extra: Mapping[str, Any] | None = None,
             skipped: Iterable[Finding] = ()) -> dict[str, Any]:

    fl = list(findings)
    inventory = list(inventory)
    now = time.time()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "ddpfix_version": __version__,
        "command": command,
        "inventory": list(inventory),
        "hosts": {k: dict(v) for k, v in sorted(hosts.items())},
        "findings": [_with_inventory(f.to_json(), inventory) for f in fl],
        "summary": summary(fl, hosts),
        "skipped": [f.to_json() for f in skipped],
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "generated_at_unix": round(now, 3),
    }
    if extra:
        doc.update(extra)
    return doc


def _with_inventory(f: dict[str, Any], inventory: Iterable[str]) -> dict[str, Any]:
    """Fix texts name the inventory the user gave, not a placeholder."""
    inv = " ".join(f"-i {i}" for i in inventory)
    if inv and f.get("fix"):
        fix = f["fix"].replace("-i INVENTORY", inv).replace("-i INV ", inv + " ")
        # "ddpfix env --apply" / "(ddpfix remediate)": the exact command, with the inventory the user gave
        f["fix"] = re.sub(r"ddpfix (env|remediate)(?: --apply)?(?! -i)", lambda m: f"ddpfix {m.group(1)} {inv} --apply",
                          fix)
    return f


def to_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def render_table(doc: Mapping[str, Any], console: Console) -> None:
    from rich.table import Table  # rich only for this format (the CLI preloads it while Ansible runs)

    findings = doc["findings"]
    if findings:
        t = Table(show_lines=True, title=f"ddpfix {doc['command']}: findings", title_justify="left")
        t.add_column("severity", no_wrap=True)
        t.add_column("id", no_wrap=True)
        t.add_column("host", no_wrap=True)
        t.add_column("what is wrong / evidence / fix", overflow="fold")
        for f in findings:
            sev = Severity.parse(f["severity"])
            body = f"{_esc(f['message'])}\n[dim]evidence:[/] {_esc(f['evidence'])}\n[green]fix:[/] {_esc(f['fix'])}"
            if not f["fixable"]:
                body += " [dim](manual)[/]"
            t.add_row(f"[{_SEV_STYLE[sev]}]{sev.label}[/]", f["id"], f["host"] or "cluster", body)
        console.print(t)
    blind = [(h, x) for h, v in doc["hosts"].items() for x in v.get("not_evaluated") or []]
    if blind:
        t = Table(
            show_lines=False,
            title=f"ddpfix {doc['command']}: NOT EVALUATED (facts not read or rules undecided; not a pass)",
            title_justify="left",
        )
        t.add_column("host", no_wrap=True)
        t.add_column("check", no_wrap=True)
        t.add_column("why", overflow="fold")
        for h, x in blind:
            t.add_row(h, f"[magenta]{x['id']}[/]", _esc(x["reason"]))
        console.print(t)
    s = doc["summary"]
    counts = ", ".join(f"{n} {k}" for k, n in s["findings"].items())
    failed = f", {s['module_failed']} with a failed module" if s.get("module_failed") else ""
    line = (f"{s['hosts']} hosts audited, {s['reachable']} reachable, {s['unreachable']} unreachable{failed}; "
            f"findings: {counts}")
    if blind:
        line += f"; [magenta]{len(blind)} check(s) not evaluated[/] on {len({h for h, _ in blind})} host(s)"
    console.print(line)


def _esc(text: str) -> str:
    return str(text).replace("[", r"\[")
