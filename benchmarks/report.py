"""BENCHMARKS.md from benchmarks/summary.json (render_summary; `python benchmarks/report.py` re-renders), and the older
full render() of raw results (benchmarks/results/, not in git)."""

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


def pair_ratios(size: dict[str, Any]) -> list[float]:
    a = {r["pair"]: r for r in runs(size, "audit")}
    b = {r["pair"]: r for r in runs(size, "baseline")}
    return [a[p]["wall_s"] / b[p]["wall_s"] for p in sorted(a) if p in b]


def task_span(r: dict[str, Any], prefix: str, run_name: str | None = None) -> float | None:
    for ev in r.get("events") or []:
        if run_name and ev["name"] != run_name:
            continue
        for t in ev["tasks"]:
            if t["task"].startswith(prefix):
                return t["span_s"]
    return None


def run_span(r: dict[str, Any], idx: int) -> float | None:
    evs = r.get("events") or []
    return evs[idx].get("span_s") if len(evs) > idx else None


TASKS = [
    ("Validating arguments", "role argument validation (controller only)"),
    ("facts | Collect", "facts: collect node facts, start probe listeners"),
    ("probe | Resolve", "probe: resolve, route, connect"),
    ("probe | Stop", "probe: stop the listener"),
]


def summarise(results: dict[str, Any]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for s in results.get("sizes", []):
        a, b = runs(s, "audit"), runs(s, "baseline")
        dry, noop = runs(s, "remediate-dry"), runs(s, "remediate-apply-noop")
        x: dict[str, Any] = {
            "audit_wall": [r["wall_s"] for r in a], "base_wall": [r["wall_s"] for r in b],
            "audit_cpu": [r["cpu_s"] for r in a], "base_cpu": [r["cpu_s"] for r in b],
            "audit_rss": [r["maxrss_mb"] for r in a], "base_rss": [r["maxrss_mb"] for r in b],
            "audit_tree": [r["tree_rss_peak_mb"] for r in a], "base_tree": [r["tree_rss_peak_mb"] for r in b],
            "audit_machine": [r["machine_cpu_s"] for r in a], "base_machine": [r["machine_cpu_s"] for r in b],
            "ratios": pair_ratios(s),
            "dry": [r["wall_s"] for r in dry], "noop": [r["wall_s"] for r in noop],
            "dry_cpu": [r["cpu_s"] for r in dry], "noop_cpu": [r["cpu_s"] for r in noop],
            "first": [r["wall_s"] for r in runs(s, "remediate-first-apply")],
            "probes": [sum(e["probe_connects"] for e in r["events"]) for r in a + runs(s, "audit", True)],
            "probes_ok": [sum(e["probe_connects_ok"] for e in r["events"]) for r in a + runs(s, "audit", True)],
            "ok": all(r.get("ok") for r in a + b + dry + noop),
            "pb_span": [run_span(r, 0) for r in a],
            "tasks": {p: [task_span(r, p) for r in a] for p, _ in TASKS},
            "noop_phases": [[ev.get("span_s") for ev in r.get("events") or []] for r in noop],
            "dry_phases": [[ev.get("span_s") for ev in r.get("events") or []] for r in dry],
            "noop_changes": [r.get("changed") for r in noop], "dry_changes": [r.get("changes") for r in dry],
        }
        out[s["n"]] = x
    return out


# ---------------------------------------------------------------- targets


def targets(results: dict[str, Any], S: dict[int, dict[str, Any]]) -> str:
    ns = sorted(S)
    if not ns:
        return ""
    L = ["## Against the targets of issue 5 (this run)\n", "| target | where we stand | met |", "|---|---|---|"]
    rat = {n: med(S[n]["ratios"]) for n in ns}
    ok = all(r is not None and r <= 1.5 for r in rat.values())
    L.append("| audit / baseline ≤ 1.5 at every N | " + ", ".join(f"N={n}: {f2(r)}" for n, r in rat.items())
             + f" | {'yes' if ok else 'no'} |")
    grows = [rat[b] / rat[a] for a, b in itertools.pairwise(ns) if rat[a] and rat[b]]
    L.append("| the ratio does not grow with N | ratio(N)/ratio(N/2): " + ", ".join(f2(g) for g in grows)
             + f" | {'yes' if all(g <= 1.1 for g in grows) else 'no'} (≤ 1.1 counted as flat) |")
    am = {n: med(S[n]["audit_wall"]) for n in ns}
    gr = [am[b] / am[a] / (b / a) for a, b in itertools.pairwise(ns)]
    L.append("| audit time grows no faster than linearly (forks = N) | growth ÷ growth of N per step: "
             + ", ".join(f2(g) for g in gr)
             + f" | {'yes' if all(g <= 1.05 for g in gr) else 'no'} (≤ 1.05 counted as linear) |")
    nr = {n: (med(S[n]["noop"]) / am[n]) if S[n]["noop"] and am[n] else None for n in ns}
    L.append("| no-op `remediate --apply` ≤ 2× audit | " + ", ".join(f"N={n}: {f2(r)}" for n, r in nr.items())
             + f" | {'yes' if all(r is not None and r <= 2 for r in nr.values()) else 'no'} |")
    for r in results.get("analysis") or []:
        if r.get("nodes") == 2000:
            for v, x in r.get("variants", {}).items():
                if x.get("timed_out"):
                    L.append(f"| analysis of 2,000 nodes < 2 s and < 500 MB ({v}) | did not finish in "
                             f"{x['budget_s']:.0f} s | no |")
                else:
                    t_ok = x["total_s"] < 2
                    m_ok = (x.get("tracemalloc_peak_mb") or 0) < 500
                    L.append(f"| analysis of 2,000 nodes < 2 s and < 500 MB ({v}) | {x['total_s']:.2f} s; analysis "
                             "allocations "
                             f"{f2(x.get('tracemalloc_peak_mb'), '{:.0f}')} MB; process RSS with the input facts "
                             f"{x['rss_peak_mb']:.0f} MB | "
                             f"time {'yes' if t_ok else 'no'}, allocations {'yes' if m_ok else 'no'}"
                             f"{'; the input facts alone exceed 500 MB' if r['rss_after_inputs_mb'] > 500 else ''} |")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- the document


def render(results: dict[str, Any], experiments: dict[str, Any] | None = None) -> str:
    m = results.get("machine") or (experiments or {}).get("machine", {})
    S = summarise(results)
    ns = sorted(S)
    L: list[str] = []
    w = L.append
    w("# ddpfix benchmarks\n")
    w("How fast `ddpfix audit` and `ddpfix remediate` are next to the floor any Ansible tool pays, how the cost grows "
      "with the cluster, and what the controller's analysis costs on its own. Every figure below was measured by "
      "`benchmarks/run.py` in the run described here; the raw runs are in "
      "[`benchmarks/results.json`](benchmarks/results.json). "
      "The document is generated by the benchmark (`benchmarks/report.py`); the sections marked *analysis* are "
      "written against the figures of this run.\n")
    w("## How to run\n")
    w("    sudo .venv/bin/python benchmarks/run.py                 # N = 4,8,16,32, 5 pairs: 17 min in this run, under "
      "load")
    w("    sudo .venv/bin/python benchmarks/run.py --quick         # smoke run, 3-5 min")
    w("    sudo .venv/bin/python benchmarks/run.py --experiments   # the settings experiments at N=16, about 9 min")
    w("    .venv/bin/python benchmarks/analysis.py                 # the analysis benchmark alone (no root, no lab)\n")
    w("Options: `--sizes 4,8,16,32 --pairs 5 --remediate-runs 3,2,1,1 --analysis-sizes 100,1000,2000`; "
      "`--experiments --experiments-at 16 --experiment-rounds 2`. Needs root (the lab) and the packages "
      "`scripts/apt-deps.sh` installs. Both write `BENCHMARKS.md` from `benchmarks/results.json` and "
      "`benchmarks/results-experiments.json` (whichever exist); `python benchmarks/report.py` re-renders it.\n")
    w("## This run\n")
    w(f"- command: `{results.get('command')}`; started {results.get('started')}, finished {results.get('finished')}, "
      f"**{results.get('duration_s', 0) / 60:.1f} min** in total")
    w(f"- machine: {m.get('cores')} cores ({m.get('cpu_model')}), {m.get('mem_gib')} GiB RAM, kernel "
      f"{m.get('kernel')}; "
      f"controller Python {m.get('python')}, ansible-core {m.get('ansible_core')}, ansible-runner "
      f"{m.get('ansible_runner')}, "
      f"{m.get('openssh')}; nodes run {m.get('node_python')} (modules) in the lab's namespaces **on the same 2 cores**")
    lb, la = results.get("load_before") or [0, 0, 0], results.get("load_after") or [0, 0, 0]
    w(f"- load average (1/5/15 min) before: {lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f}, after: "
      f"{la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}; "
      f"other labs running on the machine before/after: {', '.join(results.get('other_labs_before') or []) or 'none'} "
      "/ "
      f"{', '.join(results.get('other_labs_after') or []) or 'none'}")
    loads = [r.get("load1_before") for s in results.get("sizes", []) for r in s["runs"]]
    if loads:
        w(f"- 1-min load average sampled before each measured run: median {med(loads):.2f}, max {max(loads):.2f} "
          "(our own runs contribute; anything well above ~2 between runs is somebody else's work)")
    w("")
    w("### What was measured\n")
    w("For each N a fresh `clean` lab (`ddpfix.lab.up`, unique name, a /24 no route on the machine overlaps) and "
      "then:\n")
    w("1. one warm-up of each command, then alternately A B A B … (`--pairs` pairs):")
    w("   - **A** `ddpfix -i INV audit --format json` (default forks = one per host, at most 50; probes on, 2 ring "
      "peers)")
    w("   - **B** `ansible ddp_nodes -i INV -m setup -a gather_subset=network -f F` with **the same forks F** and the "
      "environment "
      "of `ddpfix.runner.ansible_env()` (pipelining, `ControlMaster=auto ControlPersist=60s`, timeout 10, explicit "
      "gathering, "
      "`inject_facts_as_vars=False`, no `~/.ansible`), the same inventory (so the same SSH options and key);")
    w("2. the env files ddpfix would write are put on every node (`plan_cluster` + `render_env`, written with "
      "`lab.node_exec`: "
      "the only thing the clean lab lacks), then `remediate` (dry run) and `remediate --apply` (nothing to change) "
      "alternately, `--remediate-runs` times each (default 3, 2, 1, 1 for N = 4, 8, 16, 32, chosen for the 15-minute "
      "budget; *This run* says how long it took);")
    w("3. separately (`--experiments`), the settings experiments below, round-robin against the unchanged commands.\n")
    w("Every run gets its own `DDPFIX_STATE_DIR` (so its own ControlPersist socket directory: **every run starts with "
      "cold "
      "SSH connections**, as a user's single command does) and is measured by `benchmarks/_measure.py`: **wall** = "
      "spawn to "
      "exit; **CPU** = user+sys of the command's whole controller-side process tree (`os.wait4` of the command, which "
      "includes "
      "the ansible-playbook process, its forks and their ssh clients, plus the daemonised ControlPersist ssh masters, "
      "which the measuring process adopts as child subreaper, stops after the run and reaps); **RSS** = `ru_maxrss`, "
      "the peak "
      "RSS of the *largest single process* of that tree (not a sum); *tree RSS* = sum of the RSS of all processes of "
      "the tree "
      "sampled every 0.2 s (an upper bound: forked workers' shared pages count once per process). The lab nodes' own "
      "work "
      "(sshd, the modules' Python) is not controller CPU, but it runs on the same 2 cores, so wall times include it.\n")

    # ---------------- audit vs baseline
    w("## Audit vs the Ansible floor\n")
    w("Medians with [min–max] over the pairs (warm-ups excluded). Ratio = median of the per-pair ratios "
      "audit/baseline.\n")
    w("| N | forks | audit wall s | baseline wall s | ratio audit/baseline | audit CPU s | baseline CPU s | audit RSS "
      "MB | baseline RSS MB | audit tree RSS MB | baseline tree RSS MB |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in results.get("sizes", []):
        x = S[s["n"]]
        w(f"| {s['n']} | {s['forks']} | {mmm(x['audit_wall'])} | {mmm(x['base_wall'])} | {mmm(x['ratios'])} | "
          f"{mmm(x['audit_cpu'])} | {mmm(x['base_cpu'])} | {mmm(x['audit_rss'], '{:.0f}')} | "
          f"{mmm(x['base_rss'], '{:.0f}')} | "
          f"{mmm(x['audit_tree'], '{:.0f}')} | {mmm(x['base_tree'], '{:.0f}')} |")
    w("")
    bad = [n for n in ns if not S[n]["ok"]]
    w("All measured runs succeeded (every host reachable in every audit, every baseline host SUCCESS, remediate exit "
      "0): "
      f"**{'yes' if not bad else 'NO, sizes ' + ', '.join(map(str, bad))}**.\n")
    if ns:
        w("Growth with N (audit median wall; a straight line would double with N):\n")
        w("| N | audit s | audit s per node | ×prev (N doubled) | baseline s | ×prev | machine busy CPU s per audit "
          "(all processes) |")
        w("|---|---|---|---|---|---|---|")
        prev = None
        for n in ns:
            x = S[n]
            am, bm = med(x["audit_wall"]), med(x["base_wall"])
            g = f"{am / prev[0]:.2f}" if prev and am else "–"
            gb = f"{bm / prev[1]:.2f}" if prev and bm else "–"
            w(f"| {n} | {f2(am)} | {f2(am / n if am else None, '{:.3f}')} | {g} | {f2(bm)} | {gb} | "
              f"{mmm(x['audit_machine'], '{:.1f}')} |")
            prev = (am, bm)
        if len(ns) >= 2:
            xs = ns
            ys = [med(S[n]["audit_wall"]) for n in ns]
            mx, my = statistics.mean(xs), statistics.mean(ys)
            slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sum((a - mx) ** 2 for a in xs)
            w(f"\nLeast-squares line through the audit medians: **{my - slope * mx:.2f} s + {slope:.3f} s × N**.\n")

    # ---------------- per task
    w("## Where the audit's time goes (per task, from the job events)\n")
    w("Median over the measured audits of each task's span (first task start to the last host's result), and of the "
      "whole "
      "playbook (first to last event). *Outside the playbook* = wall − playbook span: interpreter start, imports, "
      "`ansible-inventory --list` (`load_cluster`), ansible-playbook start-up and the report.\n")
    w("| N | " + " | ".join(lbl for _, lbl in TASKS) + " | playbook | outside the playbook | wall |")
    w("|---|" + "---|" * (len(TASKS) + 3))
    for n in ns:
        x = S[n]
        pb = med(x["pb_span"])
        wall = med(x["audit_wall"])
        w(f"| {n} | " + " | ".join(f2(med(x['tasks'][p])) for p, _ in TASKS)
          + f" | {f2(pb)} | {f2(wall - pb if pb and wall else None)} | {f2(wall)} |")
    w("")
    # per-host median durations for the largest N
    if results.get("sizes"):
        big = results["sizes"][-1]
        a = runs(big, "audit")
        rows = {}
        for r in a:
            for ev in r["events"]:
                for t in ev["tasks"]:
                    rows.setdefault(t["task"], []).append(t["host_median_s"])
        w(f"Per-host task duration at N={big['n']} (Ansible's `duration` of each host's result; median over hosts, "
          "then over runs): "
          + "; ".join(f"`{k[:40]}` {f2(med(v))} s" for k, v in rows.items()) + ".\n")

    # ---------------- probes
    w("## Probe connections per audit\n")
    w("Counted from the `ddpfix_probe` results in each audit's job events (`connects` per host), warm-up included. "
      "Each node "
      "connects to the master port and to the probe listeners of its next k = 2 ring peers: (1 + k) · N.\n")
    w("| N | connections per audit (all audits) | of which succeeded | (1+k)·N, k=2 | per node |")
    w("|---|---|---|---|---|")
    for n in ns:
        x = S[n]
        k = min(2, n - 1)
        got = sorted(set(x["probes"]))
        w(f"| {n} | {', '.join(map(str, got))} | {', '.join(map(str, sorted(set(x['probes_ok']))))} | {(1 + k) * n} | "
          f"{f2(med(x['probes']) / n if x['probes'] else None)} |")
    w("")

    # ---------------- remediate
    w("## Remediate on a clean cluster\n")
    w("`remediate` = audit + the remediation play in check+diff mode; `remediate --apply` = audit + the play + a "
      "re-audit. "
      "Both on a clean cluster (0 changes expected, and the table shows what was reported). *audit s* is the audit "
      "median "
      "of the pairs above.\n")
    w("| N | runs | audit s | dry run s | dry/audit | no-op apply s | no-op apply/audit | dry CPU s | apply CPU s | "
      "changes (dry) / changed (apply) |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        x = S[n]
        am = med(x["audit_wall"])
        dm, nm = med(x["dry"]), med(x["noop"])
        w(f"| {n} | {len(x['noop'])} | {f2(am)} | {mmm(x['dry'])} | {f2(dm / am if dm and am else None)} | "
          f"{mmm(x['noop'])} | "
          f"{f2(nm / am if nm and am else None)} | {mmm(x['dry_cpu'])} | {mmm(x['noop_cpu'])} | "
          f"{','.join(map(str, sorted(set(x['dry_changes']))))} / {','.join(map(str, sorted(set(x['noop_changes']))))} "
          "|")
    w("")
    w("Phases of the no-op `--apply` (playbook spans from the job events, median over runs): ")
    for n in ns:
        ph = S[n]["noop_phases"]
        if ph and all(len(p) == 3 for p in ph):
            w(f"- N={n}: audit {f2(med([p[0] for p in ph]))} s, remediation play {f2(med([p[1] for p in ph]))} s, "
              f"re-audit {f2(med([p[2] for p in ph]))} s (the re-audit reuses the ControlPersist connections of the "
              "same command)")
    w("")

    w(render_experiments(experiments))

    # ---------------- analysis
    an = results.get("analysis") or []
    if an:
        w("## The controller's analysis alone (synthetic facts)\n")
        w("`benchmarks/analysis.py`: a clean M-node cluster with the shapes of the recorded clean cluster "
          "(`tests/unit/fixtures/facts/clean3`): every node's /etc/hosts lists every node, every node resolves every "
          "peer's "
          "name and routes to every peer address (as `ddpfix_probe` reports them), master + 2 ring connects, the "
          "recorded "
          "firewall state, the env file ddpfix would write. One child process per size; `current` = the code as it is "
          "(`fixed`, an older in-memory prototype of the index-based rewrites, is now part of `checks.py`). Times are "
          "one run each (perf_counter); *analysis peak* = tracemalloc peak of the analysis' own "
          "allocations; *RSS* = the child's peak RSS, almost all of it the input facts.\n")
        w("| nodes | variant | Context (cidr + plan) s | run_checks s | plan_cluster s | render_env ×M s | total s | "
          "analysis peak MB | RSS MB (inputs) |")
        w("|---|---|---|---|---|---|---|---|---|")
        for r in an:
            if "error" in r:
                w(f"| {r['nodes']} | – | error: {r['error'][:80]} |||||||")
                continue
            for v, x in r["variants"].items():
                if x.get("timed_out"):
                    w(f"| {r['nodes']} | {v} | – | **did not finish in {x['budget_s']:.0f} s** | – | – | > "
                      f"{x['budget_s']:.0f} | – | {r['rss_after_inputs_mb']:.0f} |")
                else:
                    w(f"| {r['nodes']} | {v} | {x['context_s']:.3f} | {x['checks_s']:.3f} | {x['plan_s']:.3f} | "
                      f"{x['render_env_s']:.3f} | "
                      f"**{x['total_s']:.2f}** | {f2(x.get('tracemalloc_peak_mb'), '{:.1f}')} | {x['rss_peak_mb']:.0f} "
                      f"({r['rss_after_inputs_mb']:.0f}) |")
        w("")
    w(targets(results, S))
    extra = HERE / "NOTES.md"
    if extra.exists():
        w(extra.read_text())
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- the committed summary and BENCHMARKS.md from it


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
          "content directory, or for the remediate prototype the CLI's re-audit); `default` runs through the same "
          "wrapper "
          "without overrides. Every run has cold SSH connections (own state dir). Ratio = median over rounds of "
          "variant / its reference in the same round (`default` for audits, `remediate-dry-default` for dry runs, "
          "`remediate-apply-default` for applies). The plays pin their strategy (`ddpfix.cluster.ddpfix_linear`), "
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
              "import, and Ansible's imports and initialisation plus the in-process inventory read (the CLI "
              "validates the inventory before any node is contacted; ansible-playbook then initialises Ansible "
              "again). The rest: ansible-playbook's start until its first event and its exit after the last, "
              "ansible-runner (its pty close alone sleeps 0.1 s), the analysis and the report. The setup baseline "
              "pays only ansible's own start and exit.", "",
              "| N | audit wall s | playbook span s | outside s | CLI import s | Ansible init + inventory s | rest s |",
              "|---|---|---|---|---|---|---|"]
        for s in sm.get("sizes") or []:
            fx, out = s.get("fixed") or {}, s.get("audit_outside_playbook_s")
            rest = (out - fx["cli_import_s"] - fx["ansible_inventory_s"]) if (fx and out is not None) else None
            L.append(f"| {s['n']} | {f(s['audit']['wall_s'])} | {f(s.get('audit_playbook_span_s'))} | {f(out)} | "
                     f"{f(fx.get('cli_import_s'))} | {f(fx.get('ansible_inventory_s'))} | {f(rest)} |")
    for part in ("experiments.md", "analysis-at-scale.md"):  # sections of their own runs (--experiments, analysis)
        extra = Path(__file__).resolve().parent / part
        if extra.exists():
            L += ["", extra.read_text().rstrip()]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    import json as _json
    from pathlib import Path as _Path

    _p = _Path(__file__).resolve().parent
    (_p.parent / "BENCHMARKS.md").write_text(render_summary(_json.loads((_p / "summary.json").read_text())))
