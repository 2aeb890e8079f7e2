"""BENCHMARKS.md from benchmarks/summary.json (render_summary; `python benchmarks/report.py` re-renders it), with the
sections of their own runs: benchmarks/experiments.md (render_experiments, `run.py --experiments`),
benchmarks/NOTES.md (hand-written) and benchmarks/analysis-at-scale.md."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- small helpers


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def mmm(xs: list[float], fmt: str = "{:.2f}") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}–{fmt.format(max(xs))}]"


def f2(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def runs(size: dict[str, Any], kind: str, warm: bool = False) -> list[dict[str, Any]]:
    return [r for r in size["runs"] if r["kind"] == kind and bool(r.get("warmup")) == warm]


def render_experiments(experiments: dict[str, Any] | None) -> str:
    """The settings experiments' section (also written alone to benchmarks/experiments.md, which BENCHMARKS.md
    includes)."""
    L: list[str] = []
    w = L.append
    for e in (experiments or {}).get("experiments") or []:
        w(f"## Ansible scaling settings, measured (N={e['n']}, {e['rounds']} rounds, round-robin)\n")
        lb2, la2 = experiments.get("load_before") or [0, 0, 0], experiments.get("load_after") or [0, 0, 0]
        w(f"Run `{experiments.get('command')}` (started {experiments.get('started')}, "
          f"{experiments.get('duration_s', 0) / 60:.1f} min, "
          f"load before {lb2[0]:.2f}, after {la2[0]:.2f}). Each variant runs ddpfix through `benchmarks/_variant.py`, "
          "which only "
          "overrides settings in memory (`ansible_env()`, `ansible_runner.run` keywords, the event handler, the "
          "Ansible "
          "content directory); `default` runs through the same "
          "wrapper "
          "without overrides. Every run has cold SSH connections (own state dir). Ratio = median over rounds of "
          "variant / its reference in the same round (`default` for audits, `remediate-dry-default` for dry runs, "
          "`remediate-apply-default` for applies). The plays pin their strategy (`linear`), "
          "so ANSIBLE_STRATEGY alone changes nothing; the mitogen variants run a copy of the collection whose plays "
          "name `mitogen_linear`.\n")
        w("| variant | what | wall s | CPU s | ratio vs default | probe connections | result |")
        w("|---|---|---|---|---|---|---|")
        by: dict[str, list[dict[str, Any]]] = {}
        for r in e["runs"]:
            by.setdefault(r["variant"], []).append(r)
        for v in e["variants"]:
            ref = v.get("ref") or ("remediate-apply-default" if v["id"].startswith("remediate-") else "default")
            base = {r["round"]: r["wall_s"] for r in by.get(ref, [])}
            rs = by.get(v["id"], [])
            ratio = [r["wall_s"] / base[r["round"]] for r in rs if r["round"] in base]
            res = []
            for r in rs:
                summ = r.get("summary")
                if summ:
                    fx = summ["findings"]
                    txt = (f"{summ['reachable']}/{summ['hosts']} hosts with facts; "
                           f"findings e/w/i {fx['error']}/{fx['warning']}/{fx['info']}")
                    if r.get("finding_ids"):
                        txt += " (" + ", ".join(r["finding_ids"]) + ")"
                    if "changed" in r:
                        txt += f"; changes {r.get('changes')}, changed {r['changed']}, rc {r['rc']}"
                else:
                    txt = "no report: " + str(r.get("error", "?"))[:60]
                res.append(txt)
            uniq = list(dict.fromkeys(res))
            w(f"| `{v['id']}` | {v['label']} | {mmm([r['wall_s'] for r in rs])} | {mmm([r['cpu_s'] for r in rs])} | "
              f"{f2(med(ratio))} | {', '.join(str(sum(ev['probe_connects'] for ev in r['events'])) for r in rs)} | "
              f"{'; '.join(uniq)} |")
        w("")

    return "\n".join(L)


def _med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def _kind_ratio(size: dict[str, Any], a_kind: str, b_kind: str, key: str = "wall_s") -> float | None:
    a = {r["pair"]: r for r in runs(size, a_kind)}
    b = {r["pair"]: r for r in runs(size, b_kind)}
    return _med([a[p][key] / b[p][key] for p in sorted(a) if p in b and b[p][key]])


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """The small summary committed next to the benchmark (benchmarks/summary.json): medians and ratios per N, the
    forks check, the machine and its load. The raw runs stay in benchmarks/results/ (not in git)."""
    sizes = []
    for s in results.get("sizes") or []:
        row: dict[str, Any] = {"n": s["n"], "forks": s["forks"], "pairs": len(runs(s, "audit"))}
        for kind in ("audit", "baseline", "raw-ssh"):
            rs = runs(s, kind)
            row[kind] = {"wall_s": _med([r["wall_s"] for r in rs]), "cpu_s": _med([r["cpu_s"] for r in rs]),
                         "ok": all(r.get("ok") for r in rs)}
        row["ratio_audit_setup"] = _kind_ratio(s, "audit", "baseline")
        row["ratio_audit_raw"] = _kind_ratio(s, "audit", "raw-ssh")
        row["cpu_ratio_audit_setup"] = _kind_ratio(s, "audit", "baseline", "cpu_s")
        if runs(s, "sliced-merge"):  # run.py --alias-sliced K
            row["sliced"] = [sliced_of(s["runs"], i) for i in range(row["rounds"])]
        last = (runs(s, "audit") or [{}])[-1]
        ev = (last.get("events") or [{}])[-1]
        row["probe_connects"] = ev.get("probe_connects")
        row["probe_connects_ok"] = ev.get("probe_connects_ok")
        row["audit_tasks"] = ev.get("tasks") or []
        spans = [(r["wall_s"], (r.get("events") or [{}])[-1].get("span_s")) for r in runs(s, "audit")]
        row["audit_outside_playbook_s"] = _med([w - sp for w, sp in spans if sp is not None])
        row["audit_playbook_span_s"] = _med([sp for _, sp in spans if sp is not None])
        row["fixed"] = s.get("fixed")
        row["load1_median"] = _med([r.get("load1") for r in s["runs"] if r.get("load1") is not None])
        if s.get("forks_check"):
            fc = dict(s["forks_check"])
            fc["wall_median_s"] = _med(fc.pop("walls", []))
            row["forks_check"] = fc
        sizes.append(row)
    analysis = [{"nodes": r["nodes"], "variant": v, **{k: x.get(k) for k in ("total_s", "cpu_s", "rss_peak_mb")}}
                for r in results.get("analysis") or [] for v, x in (r.get("variants") or {}).items()]
    return {"schema": "ddpfix.bench-summary/v1", "command": results.get("command"), "started": results.get("started"),
            "analysis": analysis,
            "finished": results.get("finished"), "duration_s": results.get("duration_s"),
            "machine": results.get("machine"), "load_before": results.get("load_before"),
            "load_after": results.get("load_after"), "other_labs_before": results.get("other_labs_before"),
            "sizes": sizes}


# ---------------------------------------------------------------- fleet-size stand-in (run.py --aliases)


def summarize_aliases(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per `--aliases` spec: medians of audit / setup / ping (wall, controller CPU, memory), their ratios, the
    audit's task spans and findings, and the machine's load."""
    out = []
    for s in results.get("aliases") or []:
        row: dict[str, Any] = {"n": s["n"], "nodes": s["nodes"], "forks": s["forks"], "rounds": len(runs(s, "audit")),
                               "started": results.get("started"), "command": results.get("command"),
                               "load_before": results.get("load_before"), "load_after": results.get("load_after"),
                               "other_labs_before": results.get("other_labs_before")}
        for kind in ("audit", "baseline", "ping"):
            rs = runs(s, kind)
            row[kind] = {"wall_s": _med([r["wall_s"] for r in rs]), "cpu_s": _med([r["cpu_s"] for r in rs]),
                         "maxrss_mb": _med([r.get("maxrss_mb") for r in rs]),
                         "tree_rss_peak_mb": _med([r.get("tree_rss_peak_mb") for r in rs]),
                         "rcs": [r["rc"] for r in rs], "hosts_ok": [r.get("hosts_ok") for r in rs],
                         "walls": [round(r["wall_s"], 1) for r in rs]}
        row["ratio_audit_setup"] = _kind_ratio(s, "audit", "baseline")
        row["ratio_audit_ping"] = _kind_ratio(s, "audit", "ping")
        for kind in ("remediate-dry", "remediate-apply"):  # run.py --alias-remediate
            rs = runs(s, kind)
            if rs:
                row[kind] = {"wall_s": _med([r["wall_s"] for r in rs]), "cpu_s": _med([r["cpu_s"] for r in rs]),
                             "rcs": [r["rc"] for r in rs], "walls": [round(r["wall_s"], 1) for r in rs],
                             "changes": [r.get("changes") for r in rs], "changed": [r.get("changed") for r in rs],
                             "ratio_audit": _kind_ratio(s, kind, "audit")}
        last = (runs(s, "audit") or [{}])[-1]
        ev = (last.get("events") or [{}])[-1]
        row["audit_ok"] = [r.get("ok") for r in runs(s, "audit")]
        row["finding_counts"] = last.get("finding_counts")
        row["probe_connects"], row["probe_connects_ok"] = ev.get("probe_connects"), ev.get("probe_connects_ok")
        row["audit_tasks"] = ev.get("tasks") or []
        row["audit_playbook_span_s"] = ev.get("span_s")
        row["load1_median"] = _med([r.get("load1") for r in s["runs"] if r.get("load1") is not None])
        out.append(row)
    return out


def sliced_of(rs: list[dict[str, Any]], pair: int) -> dict[str, Any]:
    """Round `pair`'s sliced CLI pattern (run.py --alias-sliced): its batches and merge, the total on one controller
    (batches one after another, then the merge), the wall had each batch its own controller (the slowest batch,
    then the merge), beside the round's single audit."""
    mine = [r for r in rs if r.get("pair", pair) == pair]
    batches = [r for r in mine if r["kind"] == "sliced-batch"]
    merge = next((r for r in mine if r["kind"] == "sliced-merge"), {})
    audit = next((r for r in mine if r["kind"] == "audit"), {})
    total = sum(r["wall_s"] for r in batches) + merge.get("wall_s", 0.0)
    return {"k": len(batches), "batch_walls": [round(r["wall_s"], 1) for r in batches],
            "batch_rcs": [r["rc"] for r in batches], "batch_cpu_s": round(sum(r["cpu_s"] for r in batches), 1),
            "merge_wall_s": merge.get("wall_s"), "merge_cpu_s": merge.get("cpu_s"), "merge_rc": merge.get("rc"),
            "merge_maxrss_mb": merge.get("maxrss_mb"), "total_one_controller_s": round(total, 1),
            "wall_k_controllers_s": round(max((r["wall_s"] for r in batches), default=0.0)
                                          + merge.get("wall_s", 0.0), 1),
            "ratio_total_audit": round(total / audit["wall_s"], 2) if audit.get("wall_s") else None,
            "nonprobe_equal": merge.get("nonprobe_equal"), "probe_subset": merge.get("probe_subset"),
            "reachable": merge.get("reachable"), "ok": merge.get("ok")}


def sliced_line(x: dict[str, Any]) -> str:
    return (f"sliced CLI pattern, {x['k']} batches: batches {x['batch_walls']} s (rc {x['batch_rcs']}), merge "
            f"{x['merge_wall_s']} s (rc {x['merge_rc']}, CPU {x['merge_cpu_s']} s); one controller "
            f"{x['total_one_controller_s']} s ({x['ratio_total_audit']}x the audit), {x['k']} controllers "
            f"{x['wall_k_controllers_s']} s; findings from facts equal the audit's: {x['nonprobe_equal']}, probe "
            f"findings a subset: {x['probe_subset']}, reachable {x['reachable']}")


def render_aliases(sm: dict[str, Any]) -> list[str]:
    """The fleet-size stand-in's section (issue 21 item 6)."""
    rows = sm.get("aliases") or []
    if not rows:
        return []

    def f(x: Any) -> str:
        return "–" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))

    L = ["", "## At fleet size: inventory aliases of a small lab (`run.py --aliases N:NODES:FORKS`)", "",
         "Each alias is its own inventory host whose `ansible_host` is one of the lab's real nodes (round-robin), so "
         "Ansible, SSH and ddpfix treat it as a node of its own (own SSH connection and ControlPersist socket, own "
         "module run); the aliases' names are added to the nodes' /etc/hosts. Audit, setup "
         "(`-m setup -a gather_subset=network`) and ping (`-m ping`) run back to back with the same `--forks`, cold "
         "SSH connections each. CPU = user+sys of the controller-side process tree (ansible, its forks, ssh clients); "
         "RSS: peak of the largest process, and the sampled sum over the tree. See the notes below for how aliases "
         "distort what is measured.", "",
         "| N aliases | lab nodes | forks | rounds | audit wall s | setup wall s | ping wall s | audit/setup | "
         "audit/ping | audit CPU s | setup CPU s | ping CPU s | audit RSS max / tree MB | rc audit/setup/ping | "
         "1-min load (median) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b, p = r["audit"], r["baseline"], r["ping"]
        L.append(f"| {r['n']} | {r['nodes']} | {r['forks']} | {r['rounds']} | {f(a['wall_s'])} | {f(b['wall_s'])} | "
                 f"{f(p['wall_s'])} | {f(r['ratio_audit_setup'])} | {f(r['ratio_audit_ping'])} | {f(a['cpu_s'])} | "
                 f"{f(b['cpu_s'])} | {f(p['cpu_s'])} | {f(a['maxrss_mb'])} / {f(a['tree_rss_peak_mb'])} | "
                 f"{','.join(map(str, a['rcs']))}/{','.join(map(str, b['rcs']))}/{','.join(map(str, p['rcs']))} | "
                 f"{f(r['load1_median'])} |")
    L.append("")
    for r in rows:
        lb, la = r.get("load_before") or [], r.get("load_after") or []
        L.append(f"- N={r['n']}: `{r.get('command')}`, started {r.get('started')}; load before "
                 f"{'/'.join(f'{x:.2f}' for x in lb)}, after {'/'.join(f'{x:.2f}' for x in la)}; walls audit "
                 f"{r['audit']['walls']}, setup {r['baseline']['walls']}, ping {r['ping']['walls']}; setup hosts ok "
                 f"{r['baseline']['hosts_ok']}, ping hosts ok {r['ping']['hosts_ok']}; probe connects ok "
                 f"{f(r.get('probe_connects_ok'))}/{f(r.get('probe_connects'))}; findings "
                 f"{', '.join(f'{k} ×{v}' for k, v in sorted((r.get('finding_counts') or {}).items())) or 'none'}")
        for kind, what in (("remediate-dry", "remediate dry run"), ("remediate-apply", "remediate --apply")):
            x = r.get(kind)
            if x:
                L.append(f"  - {what}: {f(x['wall_s'])} s wall ({f(x['ratio_audit'])}× the audit), controller CPU "
                         f"{f(x['cpu_s'])} s, rc {','.join(map(str, x['rcs']))}, changes planned {x['changes']}, "
                         f"changed {x['changed']}")
        for x in r.get("sliced") or []:
            L.append(f"  - {sliced_line(x)}")
        spans = "; ".join(f"`{t['task'][:50]}` {t['span_s']} s (per host median {t['host_median_s']} s, module "
                          f"{f(t.get('module_median_s'))} s)" for t in r.get("audit_tasks") or [])
        L.append(f"  - audit playbook span {f(r.get('audit_playbook_span_s'))} s; tasks: {spans or '–'}")
    notes = HERE / "fleet-notes.md"  # hand-written reading of the stand-in's figures (what is not met, why)
    if notes.exists():
        L += ["", notes.read_text().rstrip()]
    return L


def render_targets(sm: dict[str, Any], peers: int = 2) -> list[str]:
    """Issue 10's targets against this run: met or not, and by how much."""
    sizes = sm.get("sizes") or []

    def row(target: str, values: list[tuple[int, float | None]], limit: float, unit: str = "") -> str:
        got = ", ".join(f"N={n}: {'–' if v is None else f'{v:.2f}{unit}'}" for n, v in values)
        miss = [(n, v / limit - 1) for n, v in values if v is None or v > limit]
        verdict = ("met" if not miss else "**not met**: " + ", ".join(
            f"N={n} {'no figure' if v is None else f'by {v:+.0%}'}" for n, v in miss))
        return f"| {target} | {got} | {verdict} |"

    L = ["## Against the targets (issue 10)", "", "| target | this run | |", "|---|---|---|",
         row("audit / setup-network ≤ 1.0", [(s["n"], s["ratio_audit_setup"]) for s in sizes], 1.0),
         row("audit CPU ≤ 1.2 × setup's", [(s["n"], s["cpu_ratio_audit_setup"]) for s in sizes], 1.2)]
    rat = [s["ratio_audit_setup"] for s in sizes]
    grows = [b / a for a, b in itertools.pairwise(rat) if a and b]
    L.append(f"| the ratio does not grow with N | ratio(N)/ratio(previous N): {', '.join(f'{g:.2f}' for g in grows)} | "
             f"{'met' if all(g <= 1.0 for g in grows) else '**not met**'} |")
    raw = ", ".join(f"N={s['n']}: {s['ratio_audit_raw']:.2f}" for s in sizes if s.get("ratio_audit_raw"))
    L.append(f"| audit / raw-SSH floor reported | {raw} | {'met' if raw else '**not met**'} |")
    probes = [(s["n"], s.get("probe_connects"), s.get("probe_connects_ok")) for s in sizes]
    exact = all(c == (1 + peers) * n and ok == c for n, c, ok in probes)
    L.append(f"| (1+k)·N probe connects (k={peers}), all succeeded | "
             f"{', '.join(f'N={n}: {ok}/{c}' for n, c, ok in probes)} | {'met' if exact else '**not met**'} |")
    for fc in [s["forks_check"] for s in sizes if s.get("forks_check")]:
        good = fc["false_probe_findings"] == 0 and not fc["failed_runs"] and fc["runs"] >= 20
        L.append(f"| 0 false `probe.*` findings in 20 clean audits, N=16, `--forks 4` | {fc['runs']} audits at "
                 f"N={fc['n']}, `--forks {fc['forks']}`: {fc['false_probe_findings']} false findings, "
                 f"{fc['failed_runs']} failed runs | {'met' if good else '**not met**'} |")
    for a in sm.get("analysis") or []:
        if a.get("nodes") == 2000 and a.get("total_s") is not None:
            good = a["total_s"] < 2 and (a.get("rss_peak_mb") or 0) < 500
            L.append(f"| analysis of 2,000 nodes < 2 s, peak RSS < 500 MB | {a['total_s']:.2f} s "
                     f"(CPU {a.get('cpu_s') or 0:.2f} s), {a.get('rss_peak_mb') or 0:.0f} MB ({a['variant']} facts) | "
                     f"{'met' if good else '**not met**'} |")
    return L


def render_summary(sm: dict[str, Any]) -> str:
    """BENCHMARKS.md from benchmarks/summary.json alone."""
    def f(x: Any) -> str:
        return "–" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))

    m = sm.get("machine") or {}
    L = ["# ddpfix benchmarks", "",
         "Generated by `benchmarks/report.py` from [`benchmarks/summary.json`](benchmarks/summary.json), which "
         "`benchmarks/run.py` writes (raw runs go to `benchmarks/results/`, not in git). Benchmarks are "
         "measurements, not tests.", "",
         "## How to run", "",
         "    sudo .venv/bin/python benchmarks/run.py --sizes 4,8,16,32 --pairs 5 --forks-check 16:4:20",
         "    sudo .venv/bin/python benchmarks/run.py --experiments --experiments-at 8   # writes experiments.md; "
         "the mitogen variants need `.venv/bin/pip install mitogen` (not a ddpfix dependency)",
         "    .venv/bin/python benchmarks/report.py            # re-render this file from summary.json", "",
         "Per N, on a fresh clean lab, after one warm-up, `--pairs` rounds of, back to back: **audit** "
         "(`ddpfix -i INV audit --format json`, default forks), **setup** (`ansible ddp_nodes -m setup -a "
         "gather_subset=network` with the same forks and ddpfix's Ansible settings) and **raw ssh** (one plain `ssh` "
         "per node, all in parallel, running the same reads: `benchmarks/_rawssh.py`). Every run starts with cold "
         "SSH connections. Wall = spawn to exit; CPU = user+sys of the controller-side process tree. Ratios are "
         "medians of per-round ratios.", "",
         "## This run", "",
         f"- command: `{sm.get('command')}`; {sm.get('started')} to {sm.get('finished')} ({f(sm.get('duration_s'))} s)",
         f"- machine: {m.get('cores')} cores, {m.get('mem_gib')} GiB; the lab nodes run on the same cores",
         f"- load average (1/5/15 min) before: {'/'.join(f'{x:.2f}' for x in sm.get('load_before') or [])}, after: "
         f"{'/'.join(f'{x:.2f}' for x in sm.get('load_after') or [])}; other labs before: "
         f"{', '.join(sm.get('other_labs_before') or []) or 'none'} (the machine is shared: other sessions' tests ran)",
         *[f"- note: {n}" for n in sm.get("notes") or []],
         "", "## Audit vs setup-network vs the raw-SSH floor", "",
         "| N | forks | rounds | audit wall s | setup wall s | raw ssh wall s | audit/setup | audit/raw | audit CPU s "
         "| setup CPU s | CPU audit/setup | probe connects ok | 1-min load (median) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sm.get("sizes") or []:
        L.append(f"| {s['n']} | {s['forks']} | {s['pairs']} | {f(s['audit']['wall_s'])} | "
                 f"{f(s['baseline']['wall_s'])} | "
                 f"{f(s['raw-ssh']['wall_s'])} | {f(s['ratio_audit_setup'])} | {f(s['ratio_audit_raw'])} | "
                 f"{f(s['audit']['cpu_s'])} | {f(s['baseline']['cpu_s'])} | {f(s['cpu_ratio_audit_setup'])} | "
                 f"{f(s['probe_connects_ok'])}/{f(s['probe_connects'])} | {f(s['load1_median'])} |")
    L.append("")
    L.append("All runs succeeded: " + ("yes" if all(s[k]["ok"] for s in sm.get("sizes") or []
                                                      for k in ("audit", "baseline", "raw-ssh")) else "**no**"))
    fcs = [s["forks_check"] for s in sm.get("sizes") or [] if s.get("forks_check")]
    if fcs:
        L += ["", "## Forks below N", ""]
        for fc in fcs:
            L.append(f"- {fc['runs']} consecutive clean audits at N={fc['n']} with `--forks {fc['forks']}`: "
                     f"**{fc['false_probe_findings']} false `probe.*` findings**, second round used in "
                     f"{fc['second_round']}/{fc['runs']}, failed runs {fc['failed_runs']}, median wall "
                     f"{f(fc.get('wall_median_s'))} s")
    L += ["", *render_targets(sm)]
    notes = Path(__file__).resolve().parent / "NOTES.md"  # hand-written reading of the figures (what is not met, why)
    if notes.exists():
        L += ["", notes.read_text().rstrip()]
    L += ["", "## Where the audit's time goes (task spans of the last measured audit)", "",
          "Per host: Ansible's duration of the task (SSH, module transfer, the node's Python, the module); *module*: "
          "the module's own time on the node (its `now_elapsed`: the reads, the probes, waiting for peers' dials).",
          ""]
    for s in sm.get("sizes") or []:
        spans = "; ".join(f"`{t['task'][:60]}` {t['span_s']} s (per host median {t['host_median_s']} s, module "
                          f"{f(t.get('module_median_s'))} s)" for t in s.get("audit_tasks") or [])
        L.append(f"- N={s['n']}: {spans or '–'}")
    if any(s.get("fixed") for s in sm.get("sizes") or []):
        L += ["", "### Outside the playbook: the fixed cost", "",
              "*outside* = audit wall − the playbook's span (its first to its last event), medians over the rounds. "
              "Of it, measured in separate fresh processes (`benchmarks/_fixed.py`, medians of 5): the ddpfix CLI's "
              "import (with its `audit` subcommand). The CLI does not read the inventory: ansible-playbook reads it "
              "once, and the play's first task hands the cluster to the CLI. The rest: ansible-playbook's start "
              "until its first event and its exit after the last, ansible-runner, the analysis and the report. The "
              "setup baseline pays only ansible's own start and exit.", "",
              "| N | audit wall s | playbook span s | outside s | CLI import s | rest s |",
              "|---|---|---|---|---|---|"]
        for s in sm.get("sizes") or []:
            fx, out = s.get("fixed") or {}, s.get("audit_outside_playbook_s")
            rest = (out - fx["cli_import_s"] - fx.get("ansible_inventory_s", 0.0)) if (fx and out is not None) else None
            L.append(f"| {s['n']} | {f(s['audit']['wall_s'])} | {f(s.get('audit_playbook_span_s'))} | {f(out)} | "
                     f"{f(fx.get('cli_import_s'))} | {f(rest)} |")
    L += render_aliases(sm)
    # sections of their own runs (--experiments, analysis, --remediate-cost)
    for part in ("experiments.md", "analysis-at-scale.md", "remediate-cost.md"):
        extra = Path(__file__).resolve().parent / part
        if extra.exists():
            L += ["", extra.read_text().rstrip()]
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- remediate's cost (run.py --remediate-cost)


def summarize_remediate_cost(results: dict[str, Any]) -> dict[str, Any]:
    """benchmarks/remediate-cost.json: per N, the medians of audit, dry run and apply, their per-round ratios to the
    audit of the same round, and the task spans of the last dry run and apply."""
    sizes = []
    for s in results.get("sizes") or []:
        row: dict[str, Any] = {"n": s["n"], "forks": s["forks"], "rounds": len(runs(s, "audit"))}
        for kind in ("audit", "remediate-dry", "remediate-apply"):
            rs = runs(s, kind)
            row[kind] = {"wall_s": _med([r["wall_s"] for r in rs]), "cpu_s": _med([r["cpu_s"] for r in rs]),
                         "ok": bool(rs) and all(r.get("ok") for r in rs),
                         "changes": _med([r.get("changes") for r in rs if r.get("changes") is not None])}
            last = (rs or [{}])[-1]
            row[kind]["tasks"] = [t for ev in last.get("events") or [] for t in ev.get("tasks") or []]
        row["ratio_dry_audit"] = _kind_ratio(s, "remediate-dry", "audit")
        row["ratio_apply_audit"] = _kind_ratio(s, "remediate-apply", "audit")
        row["load1_median"] = _med([r.get("load1") for r in s["runs"] if r.get("load1") is not None])
        sizes.append(row)
    return {"command": results.get("command"), "started": results.get("started"),
            "finished": results.get("finished"), "duration_s": results.get("duration_s"),
            "machine": results.get("machine"), "load_before": results.get("load_before"),
            "load_after": results.get("load_after"), "other_labs_before": results.get("other_labs_before"),
            "sizes": sizes}


def _per_n(sm: dict[str, Any], key: str) -> str:
    return ", ".join(f"N={s['n']}: {f2(s[key])}" for s in sm.get("sizes") or [])


def render_remediate_cost(sm: dict[str, Any]) -> str:
    """The section of `run.py --remediate-cost` (benchmarks/remediate-cost.md, included in BENCHMARKS.md)."""
    lb, la = sm.get("load_before") or [0, 0, 0], sm.get("load_after") or [0, 0, 0]
    L = ["## remediate beside the audit (env files missing)", "",
         f"Run `{sm.get('command')}` ({sm.get('started')} to {sm.get('finished')}, load average (1/5/15 min) before "
         f"{'/'.join(f'{x:.2f}' for x in lb)}, after {'/'.join(f'{x:.2f}' for x in la)}; other labs before: "
         f"{', '.join(sm.get('other_labs_before') or []) or 'none'}). Per N, on a clean lab, after one warm-up, "
         "rounds of, back to back: **audit**, **dry run** (`ddpfix remediate`, every node's env file and cluster file "
         "missing) and **apply** (`ddpfix remediate --apply`: writes them on every node and re-audits); the written "
         "files are removed after each round. Default forks, cold SSH connections. Ratios are medians of per-round "
         "ratios to the same round's audit. Targets (issue 21): dry run ≤ 1.3× audit, apply ≤ 3× audit.", "",
         "| N | forks | rounds | audit wall s | dry run wall s | apply wall s | dry/audit | apply/audit | "
         "audit CPU s | dry CPU s | apply CPU s | dry-run changes | all ok | 1-min load (median) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ok_keys = ("audit", "remediate-dry", "remediate-apply")
    for s in sm.get("sizes") or []:
        a, d, p = (s[k] for k in ok_keys)
        L.append(f"| {s['n']} | {s['forks']} | {s['rounds']} | {f2(a['wall_s'])} | {f2(d['wall_s'])} | "
                 f"{f2(p['wall_s'])} | {f2(s['ratio_dry_audit'])} | {f2(s['ratio_apply_audit'])} | {f2(a['cpu_s'])} | "
                 f"{f2(d['cpu_s'])} | {f2(p['cpu_s'])} | {f2(d.get('changes'), '{:.0f}')} | "
                 f"{'yes' if all(s[k]['ok'] for k in ok_keys) else '**no**'} | {f2(s['load1_median'])} |")
    dry = [s["ratio_dry_audit"] for s in sm.get("sizes") or [] if s["ratio_dry_audit"] is not None]
    app = [s["ratio_apply_audit"] for s in sm.get("sizes") or [] if s["ratio_apply_audit"] is not None]
    L += ["", f"- dry run ≤ 1.3× audit: {'met' if dry and max(dry) <= 1.3 else 'not met'} "
              f"({_per_n(sm, 'ratio_dry_audit')})",
          f"- apply ≤ 3× audit: {'met' if app and max(app) <= 3 else 'not met'} "
          f"({_per_n(sm, 'ratio_apply_audit')})", "",
          "Task spans of the last dry run and apply (per-host median in brackets):", ""]
    for s in sm.get("sizes") or []:
        for k in ("remediate-dry", "remediate-apply"):
            spans = "; ".join(f"`{t['task'][:60]}` {t['span_s']} s ({t['host_median_s']} s)"
                              for t in s[k].get("tasks") or [])
            L.append(f"- N={s['n']} {k}: {spans or '–'}")
    return "\n".join(L)


if __name__ == "__main__":
    import json as _json
    from pathlib import Path as _Path

    _p = _Path(__file__).resolve().parent
    (_p.parent / "BENCHMARKS.md").write_text(render_summary(_json.loads((_p / "summary.json").read_text())))
