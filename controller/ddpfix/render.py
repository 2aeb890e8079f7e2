"""Renderings of a report document (`ddpfix.report/v1`): text (default), plain, JUnit XML, Prometheus textfile,
one self-contained HTML file. Pure functions of the JSON document, so every output shows the same findings."""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Mapping
from typing import Any

from ddpfix.rules import registry
from ddpfix.rules.reachability import NOT_AUDITED
from ddpfix.rules.registry import RULES

SEVERITIES = ("error", "warning", "info")


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
    if rounds.get("unobserved"):
        out.append(f"probes: {rounds['unobserved']} dial(s) to later nodes not evaluated (no listener record spoke "
                   "for them: see the matrix)")
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
            # a long word (a node's value, shown escaped) is never cut: a cut could start a line with the rest of
            # an escaped line break, which would read as a line of its own
            out.append(textwrap.fill(f"{f['severity'].upper():<7} {f['id']}: {f['message']}", width=width,
                                     initial_indent="  ", subsequent_indent="          ", break_long_words=False))
            ind = "          "
            out.append(textwrap.fill(f"evidence: {f['evidence']}", width=width, initial_indent=ind,
                                     subsequent_indent=ind + "  ", break_long_words=False))
            if f["id"] in registry.unseen_if_unexplained() and not f.get("caused_by"):
                out.append(textwrap.fill("no rule on the hosts explains this: something the audit cannot see (a "
                                         "cloud security group, a switch ACL, a host-external firewall) blocks the "
                                         "path", width=width, initial_indent=ind, subsequent_indent=ind + "  "))
            fix = f"fix: {f['fix']}" + ("" if f.get("fixable") else " (manual)")
            out.append(textwrap.fill(fix, width=width, initial_indent=ind, subsequent_indent=ind + "  ",
                                     break_long_words=False))
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


def _junit_time(seconds: float) -> str:
    return f"{max(seconds, 0.0):.3f}"


def render_junit(doc: Mapping[str, Any]) -> str:
    """JUnit XML that the Jenkins xunit plugin's junit-10.xsd and the Ant JUnit schema both accept: one testsuite
    (name, package, id, timestamp, hostname, tests, failures, errors, skipped, time = the run's duration), one
    testcase per check and host (classname = check id, name = host, time 0: checks are not timed one by one), at
    most one `<failure>` per testcase (several findings of one check on one host: one failure listing each), a
    check that could not be evaluated is `<skipped>` with the reason (never a pass), properties: command, version."""
    # CLI start: the JUnit writer is needed only for --format junit
    import socket
    import xml.etree.ElementTree as ET

    hosts = doc.get("hosts") or {}
    names = _host_order(doc)
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in _findings(doc):
        by.setdefault((f["id"], f.get("host") or "cluster"), []).append(f)
    skipped = {(s["id"], s.get("host") or "cluster") for s in doc.get("skipped") or []}
    blind = {h: {b["id"]: b.get("reason", "") for b in v.get("not_evaluated") or []} for h, v in hosts.items()}
    name = f"ddpfix.{doc.get('command')}"
    # Ant: timestamp without a zone (UTC here, as generated_at); hostname "localhost" when it cannot be determined
    suite = ET.Element("testsuite", name=name, package=name, id="0",
                       timestamp=str(doc.get("generated_at") or "1970-01-01T00:00:00Z").rstrip("Z"),
                       hostname=socket.gethostname() or "localhost")
    props = ET.SubElement(suite, "properties")
    for k in ("command", "ddpfix_version", "generated_at"):
        ET.SubElement(props, "property", name=k, value=str(doc.get(k) or ""))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    cluster_ids = {i for (i, h) in by if h == "cluster"} | {i for (i, h) in skipped if h == "cluster"}
    for rid in RULES:
        targets = (["cluster"] if rid in cluster_ids else []) + names
        for h in targets:
            tc = ET.SubElement(suite, "testcase", classname=rid, name=h, time=_junit_time(0))
            counts["tests"] += 1
            if (rid, h) in skipped:
                ET.SubElement(tc, "skipped", message="accepted (--skip / ddp_skip_findings)")
                counts["skipped"] += 1
            elif (rid, h) in by:
                fl = by[(rid, h)]
                worst = min(fl, key=lambda x: SEVERITIES.index(x["severity"]))
                message = fl[0]["message"] if len(fl) == 1 else f"{len(fl)} findings: " + "; ".join(
                    x["message"] for x in fl)
                el = ET.SubElement(tc, "failure", message=message, type=worst["severity"])
                el.text = "\n\n".join(f"evidence: {x['evidence']}\nfix: {x['fix']}" + (
                    f"\ncaused by: {x['caused_by']}" if x.get("caused_by") else "") for x in fl)
                counts["failures"] += 1
            elif h != "cluster" and rid in blind.get(h, {}):
                ET.SubElement(tc, "skipped", message=f"not evaluated (not a pass): {blind[h][rid]}")
                counts["skipped"] += 1
            elif h != "cluster" and not hosts.get(h, {}).get("reachable", True) \
                    and rid not in NOT_AUDITED:
                ET.SubElement(tc, "skipped", message=f"{h} could not be audited")
                counts["skipped"] += 1
    ET.SubElement(suite, "system-out")
    ET.SubElement(suite, "system-err")
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("time", _junit_time(float(doc.get("duration_s") or 0)))
    suites = ET.Element("testsuites")
    suites.append(suite)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


#: Help texts are constant: node_exporter's textfile collector refuses a metric whose HELP differs between files.
_PROM_HELP = {
    "finding": "ddpfix findings present in the last run, by check id, host and severity (the number of findings).",
    "findings": "Findings of the last run by severity.",
    "hosts": "Hosts in the inventory of the last run.",
    "hosts_unreachable": "Hosts that could not be audited in the last run.",
    "last_run_success": "1 when the last run of the command exited 0, else 0.",
    "run_duration_seconds": "Wall-clock duration of the last run of the command, seconds.",
    "timestamp_seconds": "When the last run of this command made its report (Unix time).",
}


def render_prometheus(doc: Mapping[str, Any]) -> str:
    """node_exporter textfile format. Every series carries `command` (audit, remediate), so the textfiles of both
    commands side by side never repeat a series: `ddpfix_finding{command,id,host,severity}` (value: how many findings
    of that check on that host: never two series of one labelset), `ddpfix_findings{command,severity}`,
    `ddpfix_hosts`, `ddpfix_hosts_unreachable`, `ddpfix_last_run_success`, `ddpfix_run_duration_seconds` and
    `ddpfix_<command>_timestamp_seconds`."""
    # CLI start: prometheus_client loads only for --format prom
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    command = str(doc.get("command") or "unknown")
    reg = CollectorRegistry()
    c = {"command": command}
    g = Gauge("ddpfix_finding", _PROM_HELP["finding"], ["command", "id", "host", "severity"], registry=reg)
    for f in _findings(doc):
        g.labels(id=f["id"], host=f.get("host") or "cluster", severity=f["severity"], **c).inc()
    counts = Gauge("ddpfix_findings", _PROM_HELP["findings"], ["command", "severity"], registry=reg)
    summary = doc.get("summary") or {}
    for sev in SEVERITIES:
        counts.labels(severity=sev, **c).set(summary.get("findings", {}).get(sev, 0))
    Gauge("ddpfix_hosts", _PROM_HELP["hosts"], ["command"], registry=reg).labels(**c).set(summary.get("hosts", 0))
    Gauge("ddpfix_hosts_unreachable", _PROM_HELP["hosts_unreachable"], ["command"], registry=reg).labels(**c).set(
        summary.get("unreachable", 0))
    if doc.get("exit_code") is not None:
        Gauge("ddpfix_last_run_success", _PROM_HELP["last_run_success"], ["command"], registry=reg).labels(**c).set(
            1 if doc["exit_code"] == 0 else 0)
    if doc.get("duration_s") is not None:
        Gauge("ddpfix_run_duration_seconds", _PROM_HELP["run_duration_seconds"], ["command"],
              registry=reg).labels(**c).set(float(doc["duration_s"]))
    stamp = re.sub(r"[^a-zA-Z0-9_]", "_", command)
    Gauge(f"ddpfix_{stamp}_timestamp_seconds", _PROM_HELP["timestamp_seconds"], ["command"],
          registry=reg).labels(**c).set(float(doc.get("generated_at_unix") or 0))
    return generate_latest(reg).decode()


def render_html(doc: Mapping[str, Any]) -> str:
    """One self-contained HTML file (inline CSS, no scripts or remote resources): summary, causes (each with how it
    shows in a job's log: explain's pattern table), per-host findings, the connectivity matrix."""
    # CLI start: jinja2 and the matrix load only for --format html
    import jinja2

    # CLI start: explain's patterns and the matrix load only for --format html
    from ddpfix.diagnose.match import symptoms
    from ddpfix.matrix import SYMBOL

    env = jinja2.Environment(loader=jinja2.PackageLoader("ddpfix", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), keep_trailing_newline=True)
    explained = _explained(doc)
    causes = [f for f in _findings(doc) if not f.get("caused_by")]
    return env.get_template("report.html.j2").render(
        doc=doc, summary=summary_line(doc), causes=causes, hosts=_host_order(doc),
        explains={key_of(f): _explains_text([x for x in explained.get(key_of(f), []) if x != f]) for f in causes},
        matrix=doc.get("matrix"), symbol=SYMBOL, unseen=registry.unseen_if_unexplained(),
        symptoms={f["id"]: [(p.key, p.example) for p in symptoms(f["id"])] for f in causes})


RENDERERS = {"plain": render_plain, "junit": render_junit, "prometheus": render_prometheus, "html": render_html}
