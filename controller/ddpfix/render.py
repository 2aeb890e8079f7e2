"""Renderings of a report document (`ddpfix.report/v1`): text (default), plain, JUnit XML, Prometheus textfile,
one self-contained HTML file. Pure functions of the JSON document, so every output shows the same findings."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from typing import Any

from ddpfix.findings import RULES

SEVERITIES = ("error", "warning", "info")
#: --format values and the file extensions -o infers them from.
FORMATS = ("text", "table", "json", "plain", "junit", "prometheus", "html")
EXTENSIONS = {".json": "json", ".html": "html", ".htm": "html", ".xml": "junit", ".prom": "prometheus",
              ".txt": "plain"}


def _findings(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(doc.get("findings") or [])


def _explained(doc: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in _findings(doc):
        if f.get("caused_by"):
            out.setdefault(f["caused_by"], []).append(f)
    return out


def key_of(f: Mapping[str, Any]) -> str:
    return f"{f['id']}@{f.get('host') or 'cluster'}"


def _host_order(doc: Mapping[str, Any]) -> list[str]:
    hosts = doc.get("hosts") or {}
    return sorted(hosts, key=lambda h: (hosts[h].get("rank") if hosts[h].get("rank") is not None else 1 << 30, h))


def summary_line(doc: Mapping[str, Any]) -> str:
    s = doc.get("summary") or {}
    counts = s.get("findings") or {}
    parts = [f"{counts.get(k, 0)} {k}{'s' if counts.get(k, 0) != 1 and k != 'info' else ''}" for k in SEVERITIES]
    ncauses = sum(1 for f in _findings(doc) if not f.get("caused_by"))
    line = (f"ddpfix {doc.get('command')}: {s.get('hosts', 0)} hosts, {s.get('reachable', 0)} reachable"
            f"{', ' + str(s['unreachable']) + ' unreachable' if s.get('unreachable') else ''}"
            f"{', ' + str(s['module_failed']) + ' with a failed module' if s.get('module_failed') else ''}; "
            f"{', '.join(parts)}")
    if _findings(doc):
        line += f"; {ncauses} root cause{'s' if ncauses != 1 else ''}"
    if doc.get("skipped"):
        line += f"; {len(doc['skipped'])} skipped"
    if s.get("not_evaluated"):
        line += f"; {s['not_evaluated']} checks NOT evaluated (facts not read or rules undecided)"
    return line


def _explains_text(items: list[dict[str, Any]]) -> str:
    by_id: dict[str, list[str]] = {}
    for f in items:
        by_id.setdefault(f["id"], []).append(f.get("host") or "cluster")
    return "; ".join(f"{i} on {', '.join(dict.fromkeys(hosts))}" for i, hosts in by_id.items())


def render_text(doc: Mapping[str, Any], width: int | None = None, exit_line: str | None = None) -> str:
    """Summary first; then cluster-wide causes, then each host's causes (one line each, evidence, fix and what the
    cause explains indented and wrapped to the terminal width); the exit code last."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    width = max(60, min(width, 160))
    explained = _explained(doc)
    out = [summary_line(doc)]
    rounds = doc.get("probe_rounds") or {}
    if rounds.get("rounds", 1) > 1:
        out.append(f"probes: second round used ({len(rounds.get('detached') or [])} detached probers collected: "
                   "not every node ran at once)")
    groups: dict[str, list[dict[str, Any]]] = {}
    for f in _findings(doc):
        if f.get("caused_by"):
            continue
        groups.setdefault(f.get("host") or "", []).append(f)
    hosts = doc.get("hosts") or {}
    order = ["", *_host_order(doc)]
    ok_hosts = []
    for h in order:
        items = groups.get(h, [])
        blind = (hosts.get(h, {}).get("not_evaluated") or []) if h else []
        if not items and not blind:
            if h and hosts.get(h, {}).get("reachable"):
                ok_hosts.append(h)
            continue
        info = hosts.get(h, {})
        head = h if h else "cluster"
        if h and info.get("address"):
            head += f" ({info.get('address')}, rank {info.get('rank')})"
        out.append("")
        out.append(head)
        for f in sorted(items, key=lambda x: SEVERITIES.index(x["severity"])):
            out.append(textwrap.fill(f"{f['severity'].upper():<7} {f['id']}: {f['message']}", width=width,
                                     initial_indent="  ", subsequent_indent="          "))
            ind = "          "
            out.append(textwrap.fill(f"evidence: {f['evidence']}", width=width, initial_indent=ind,
                                     subsequent_indent=ind + "  "))
            if f["id"] in ("probe.master-port-unreachable", "probe.peer-unreachable") and not f.get("caused_by"):
                out.append(textwrap.fill("no rule on the hosts explains this: something the audit cannot see (a "
                                         "cloud security group, a switch ACL, a host-external firewall) blocks the "
                                         "path", width=width, initial_indent=ind, subsequent_indent=ind + "  "))
            fix = f"fix: {f['fix']}" + ("" if f.get("fixable") else " (manual)")
            out.append(textwrap.fill(fix, width=width, initial_indent=ind, subsequent_indent=ind + "  "))
            more = [x for x in explained.get(key_of(f), []) if x is not f and x != f]
            if more:
                out.append(textwrap.fill(f"explains: {_explains_text(more)}", width=width, initial_indent=ind,
                                         subsequent_indent=ind + "  "))
        if blind:
            reasons: dict[str, list[str]] = {}
            for b in blind:
                reasons.setdefault(b.get("reason", ""), []).append(b["id"])
            for why, ids in reasons.items():
                out.append(textwrap.fill(f"NOT EVALUATED (not a pass): {', '.join(ids)}: {why}", width=width,
                                         initial_indent="  ", subsequent_indent="          "))
    if ok_hosts:
        out.append("")
        out.append(textwrap.fill(f"no findings: {', '.join(ok_hosts)}", width=width))
    for s in doc.get("skipped") or []:
        out.append(f"skipped (accepted): {s['id']} on {s.get('host') or 'cluster'}: {s['message']}")
    if exit_line:
        out.append("")
        out.append(exit_line)
    return "\n".join(out) + "\n"


def render_plain(doc: Mapping[str, Any]) -> str:
    """One line per finding, for grep: `severity id host message` (host `cluster` for cluster-wide ones)."""
    lines = []
    for f in _findings(doc):
        cause = f" (caused by {f['caused_by']})" if f.get("caused_by") else ""
        lines.append(f"{f['severity']} {f['id']} {f.get('host') or 'cluster'} {f['message']}{cause}")
    for s in doc.get("skipped") or []:
        lines.append(f"skipped {s['id']} {s.get('host') or 'cluster'} {s['message']}")
    return "\n".join(lines) + ("\n" if lines else "")


def render_junit(doc: Mapping[str, Any]) -> str:
    """JUnit XML: one testcase per check and host (classname = check id, name = host); a failure carries the
    message, evidence and fix; checks on a host that could not be audited are skipped."""
    import xml.etree.ElementTree as ET

    hosts = doc.get("hosts") or {}
    names = _host_order(doc)
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in _findings(doc):
        by.setdefault((f["id"], f.get("host") or "cluster"), []).append(f)
    skipped = {(s["id"], s.get("host") or "cluster") for s in doc.get("skipped") or []}
    blind = {h: {b["id"]: b.get("reason", "") for b in v.get("not_evaluated") or []} for h, v in hosts.items()}
    suite = ET.Element("testsuite", name=f"ddpfix.{doc.get('command')}")
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    cluster_ids = {i for (i, h) in by if h == "cluster"} | {i for (i, h) in skipped if h == "cluster"}
    for rid in RULES:
        targets = (["cluster"] if rid in cluster_ids else []) + names
        for h in targets:
            tc = ET.SubElement(suite, "testcase", classname=rid, name=h)
            counts["tests"] += 1
            if (rid, h) in skipped:
                ET.SubElement(tc, "skipped", message="accepted (--skip / ddp_skip_findings)")
                counts["skipped"] += 1
            elif (rid, h) in by:
                for f in by[(rid, h)]:
                    el = ET.SubElement(tc, "failure", message=f["message"], type=f["severity"])
                    el.text = f"evidence: {f['evidence']}\nfix: {f['fix']}" + (
                        f"\ncaused by: {f['caused_by']}" if f.get("caused_by") else "")
                counts["failures"] += 1
            elif h != "cluster" and rid in blind.get(h, {}):
                ET.SubElement(tc, "skipped", message=f"not evaluated (not a pass): {blind[h][rid]}")
                counts["skipped"] += 1
            elif h != "cluster" and not hosts.get(h, {}).get("reachable", True) \
                    and rid not in ("host.unreachable", "host.module-failed"):
                ET.SubElement(tc, "skipped", message=f"{h} could not be audited")
                counts["skipped"] += 1
    for k, v in counts.items():
        suite.set(k, str(v))
    suites = ET.Element("testsuites")
    suites.append(suite)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def render_prometheus(doc: Mapping[str, Any]) -> str:
    """node_exporter textfile format: `ddpfix_finding{id,host,severity} 1`, counts, unreachable hosts, timestamp."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    g = Gauge("ddpfix_finding", "A ddpfix finding (1 while it is present).", ["id", "host", "severity"],
              registry=reg)
    for f in _findings(doc):
        g.labels(id=f["id"], host=f.get("host") or "cluster", severity=f["severity"]).set(1)
    counts = Gauge("ddpfix_findings", "Findings by severity.", ["severity"], registry=reg)
    for sev in SEVERITIES:
        counts.labels(severity=sev).set((doc.get("summary") or {}).get("findings", {}).get(sev, 0))
    Gauge("ddpfix_hosts", "Hosts in the inventory.", registry=reg).set((doc.get("summary") or {}).get("hosts", 0))
    Gauge("ddpfix_hosts_unreachable", "Hosts that could not be audited.", registry=reg).set(
        (doc.get("summary") or {}).get("unreachable", 0))
    Gauge("ddpfix_audit_timestamp_seconds", "When the report was made (Unix time).", registry=reg).set(
        float(doc.get("generated_at_unix") or 0))
    return generate_latest(reg).decode()


def render_html(doc: Mapping[str, Any]) -> str:
    """One self-contained HTML file (inline CSS, no scripts or remote resources): summary, causes (each with how it
    shows in a job's log: explain's pattern table), per-host findings, the connectivity matrix."""
    import jinja2

    from ddpfix.explain import symptoms
    from ddpfix.matrix import SYMBOL

    env = jinja2.Environment(loader=jinja2.PackageLoader("ddpfix", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), keep_trailing_newline=True)
    explained = _explained(doc)
    causes = [f for f in _findings(doc) if not f.get("caused_by")]
    return env.get_template("report.html.j2").render(
        doc=doc, summary=summary_line(doc), causes=causes, hosts=_host_order(doc),
        explains={key_of(f): _explains_text([x for x in explained.get(key_of(f), []) if x != f]) for f in causes},
        matrix=doc.get("matrix"), symbol=SYMBOL,
        symptoms={f["id"]: [(p.key, p.example) for p in symptoms(f["id"])] for f in causes})


RENDERERS = {"plain": render_plain, "junit": render_junit, "prometheus": render_prometheus, "html": render_html}
