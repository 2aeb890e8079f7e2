#!/usr/bin/env python3
"""ddpfix benchmark: audit / remediate on lab clusters side by side with plain Ansible, and the analysis alone.

    sudo .venv/bin/python benchmarks/run.py                       # N = 4,8,16,32, 5 pairs (< 15 min)
    sudo .venv/bin/python benchmarks/run.py --quick                # smoke run
    sudo .venv/bin/python benchmarks/run.py --experiments          # settings experiments at N=16

For each N: a clean lab of N nodes (unique name, a free /24), one warm-up of each command, then `--pairs`
alternating pairs of A = `ddpfix -i INV audit --format json` and B = `ansible ddp_nodes -i INV -m setup -a
gather_subset=network -f F` (F = ddpfix's default forks for N; B gets ddpfix's own Ansible settings from
`ddpfix.ansible.env.ansible_env()`: pipelining, ControlPersist, timeouts, no ~/.ansible). Every run gets a fresh
DDPFIX_STATE_DIR (so a fresh ControlPersist directory: every run starts with cold SSH connections) and is
measured by benchmarks/_measure.py (wall, CPU of the whole process tree, peak RSS). Probe connections and
per-task timings come from the audit's ansible-runner job events. Then the env files ddpfix
would write are put on the nodes (the only thing a clean lab lacks), and `remediate` (dry run) /
`remediate --apply` (nothing to change) run alternately, `--remediate-runs` times each. Finally
benchmarks/analysis.py times the controller's analysis on synthetic facts for 100, 1,000 and 2,000 nodes.

`--experiments` runs instead the Ansible settings experiments (round-robin against the unchanged audit
and remediate) at `--experiments-at` N.

Writes the raw runs to benchmarks/results/ (not in git), the small summary benchmarks/summary.json and BENCHMARKS.md
(generated from the summary). Labs are always torn down.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import glob
import importlib.metadata as md
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RAW = HERE / "results"  # raw results: not in git (.gitignore); BENCHMARKS.md is generated from summary.json
SUMMARY = HERE / "summary.json"
BIN = Path(sys.executable).parent
DDPFIX = str(BIN / "ddpfix")
ANSIBLE = str(BIN / "ansible")
PROBE_PEERS = 2  # ddpfix audit's default --probe-peers

sys.path.insert(0, str(HERE))
import report  # noqa: E402  (benchmarks/report.py)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- machine, subnet, lab


def machine_info() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kb = int(next(ln.split()[1] for ln in meminfo if ln.startswith("MemTotal")))
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()

    def ver(p: str) -> str:
        try:
            return md.version(p)
        except md.PackageNotFoundError:
            return "?"

    return {
        "cores": os.cpu_count(), "cpu_model": model, "mem_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "ansible_core": ver("ansible-core"), "ansible_runner": ver("ansible-runner"), "ddpfix": ver("ddpfix"),
        "openssh": ssh,
        "node_python": subprocess.run(["/usr/bin/python3", "-V"], capture_output=True, text=True).stdout.strip(),
    }


def free_subnet() -> str:
    """A /24 that no route on this machine overlaps (the lab's own helper)."""
    from ddpfix import lab

    return lab.free_subnet()


def lab_up(name: str, n: int, inv_dir: Path, tmp: Path) -> tuple[Any, dict[str, Any]]:
    """Bring a clean lab up on a free subnet; returns (LabInfo, notes)."""
    from ddpfix import lab

    notes: dict[str, Any] = {}
    last: Exception | None = None
    for _ in range(5):
        subnet = free_subnet()
        t = time.monotonic()
        try:
            info = lab.up(name, n, "clean", subnet, None, inv_dir)
            notes.update(subnet=subnet, up_s=round(time.monotonic() - t, 2))
            return info, notes
        except lab.LabError as exc:
            last = exc
            if "Argument list too long" in str(exc):
                # Lab limitation (reported in BENCHMARKS.md): the launcher gets every node's init script on its
                # command line, > 128 KiB (MAX_ARG_STRLEN) past ~27 nodes. Work around it for this process only
                # by handing the launcher comment-free copies of the two scripts (same code, via ast.unparse).
                import ddpfix.lab.daemons as daemons

                mini = tmp / "lab-scripts"
                mini.mkdir(exist_ok=True)
                for f in ("_nodeinit.py", "_supervisor.py"):
                    src = (Path(daemons.__file__).parent / f).read_text()
                    (mini / f).write_text(ast.unparse(ast.parse(src)) + "\n")
                daemons._PKG = mini  # type: ignore[attr-defined]
                notes["lab_argv_workaround"] = True
                log(f"lab up {n} nodes hit E2BIG (lab launcher argv > 128 KiB); "
                    "retrying with comment-free node scripts")
                continue
            if "overlaps" in str(exc):
                continue
            raise
    raise RuntimeError(f"lab up failed: {last}")


# ---------------------------------------------------------------- running and measuring


class Runner:
    def __init__(self, tmp: Path, inv: Path, n: int, forks: int, profile: bool = False) -> None:
        self.tmp, self.inv, self.n, self.forks = tmp, inv, n, forks
        self.audit_env = {"DDPFIX_FACTS_PROFILE": "1"} if profile else {}  # --profile-facts
        self.count = 0
        tmp.mkdir(parents=True, exist_ok=True)

    def _run(self, kind: str, argv: list[str], env: dict[str, str], state: Path) -> dict[str, Any]:
        self.count += 1
        d = self.tmp / f"run{self.count:03d}-{kind}"
        d.mkdir(parents=True, exist_ok=True)
        res_path, out, err = d / "measure.json", d / "stdout", d / "stderr"
        subprocess.run([sys.executable, str(HERE / "_measure.py"), str(res_path), str(out), str(err), "--", *argv],
                       env=env, check=True)
        res = json.loads(res_path.read_text())
        res["kind"] = kind
        res["stdout_path"], res["stderr_path"] = str(out), str(err)
        res["events"] = [events_summary(Path(p)) for p in sorted(glob.glob(str(state / "runs" / "*")))
                         if Path(p, "artifacts").is_dir()]
        return res

    def _env(self, state: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DDPFIX_", "BENCH_"))}
        env["DDPFIX_STATE_DIR"] = str(state)
        env.update(extra or {})
        return env

    def ddpfix(self, kind: str, args: list[str], *, variant: dict[str, str] | None = None,
               forks: int | None = None) -> dict[str, Any]:
        state = Path(tempfile.mkdtemp(prefix="state-", dir=self.tmp))
        head = [sys.executable, str(HERE / "_variant.py")] if variant is not None else [DDPFIX]
        argv = [*head, "-i", str(self.inv), *(["--forks", str(forks)] if forks else []), *args]
        res = self._run(kind, argv, self._env(state, {**self.audit_env, **(variant or {})}), state)
        res["state_dir"] = str(state)
        return res

    def raw_ssh(self, ssh_config: Path, nodes: list[str]) -> dict[str, Any]:
        """The floor: one plain `ssh` per node, all in parallel, running the same reads (benchmarks/_rawssh.py)."""
        state = Path(tempfile.mkdtemp(prefix="state-", dir=self.tmp))
        res = self._run("raw-ssh", [sys.executable, str(HERE / "_rawssh.py"), str(ssh_config), *nodes],
                        self._env(state), state)
        res["ok"] = res["rc"] == 0
        res["state_dir"] = str(state)
        return res

    def baseline(self, kind: str = "baseline", module: tuple[str, ...] = ("setup", "gather_subset=network"),
                 ) -> dict[str, Any]:
        from ddpfix.ansible.env import ansible_env

        state = Path(tempfile.mkdtemp(prefix="state-", dir=self.tmp))
        run_dir = state / "runs" / "baseline"
        (run_dir / "tmp").mkdir(parents=True)
        saved = os.environ.get("DDPFIX_STATE_DIR")
        os.environ["DDPFIX_STATE_DIR"] = str(state)
        try:
            aenv = ansible_env(run_dir, self.forks)  # ddpfix's own Ansible settings
            # but not ddpfix's exit callback (plugins/callback/ddpfix_exit.py): the baseline is plain Ansible's exit
            # (`ansible` loads no enabled callback by default anyway: bin_ansible_callbacks)
            aenv.pop("ANSIBLE_CALLBACKS_ENABLED", None)
        finally:
            if saved is None:
                os.environ.pop("DDPFIX_STATE_DIR", None)
            else:
                os.environ["DDPFIX_STATE_DIR"] = saved
        argv = [ANSIBLE, "ddp_nodes", "-i", str(self.inv), "-m", module[0], *(["-a", module[1]] if module[1:] else []),
                "-f", str(self.forks)]
        res = self._run(kind, argv, self._env(state, aenv), state)
        text = Path(res["stdout_path"]).read_text(errors="replace")
        res["hosts_ok"] = text.count("| SUCCESS")
        res["ok"] = res["rc"] == 0 and res["hosts_ok"] == self.n
        res["state_dir"] = str(state)
        return res


def events_summary(run_dir: Path) -> dict[str, Any]:
    """Per-task timings and probe connections from one ansible-runner run's job events."""
    evs = []
    for f in glob.glob(str(run_dir / "artifacts" / "*" / "job_events" / "*.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            evs.append(json.loads(Path(f).read_text()))
    evs.sort(key=lambda e: e.get("counter", 0))

    def ts(e: dict[str, Any]) -> float:
        return dt.datetime.fromisoformat(e["created"]).timestamp()

    out: dict[str, Any] = {"name": run_dir.name.split("-", 1)[-1], "events": len(evs), "tasks": [],
                           "probe_connects": 0, "probe_connects_ok": 0, "probe_hosts": 0}
    if not evs:
        return out
    out["span_s"] = round(ts(evs[-1]) - ts(evs[0]), 3)
    tasks: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    probes: dict[str, list[dict[str, Any]]] = {}
    for e in evs:
        d = e.get("event_data") or {}
        kind = e.get("event", "")
        if kind == "playbook_on_task_start":
            name = d.get("task", "")
            if name not in tasks:
                order.append(name)
                tasks[name] = {"start": ts(e), "end": ts(e), "durations": [], "hosts": 0}
        elif kind.startswith("runner_on_") and kind not in ("runner_on_start",) and d.get("task") in tasks:
            t = tasks[d["task"]]
            t["end"] = max(t["end"], ts(e))
            if d.get("duration") is not None:
                t["durations"].append(float(d["duration"]))
            t["hosts"] += 1
            node = ((d.get("res") or {}).get("ansible_facts") or {}).get("ddpfix_node") or {}
            if node.get("now_elapsed") is not None:
                t.setdefault("module", []).append(float(node["now_elapsed"]))  # the module's own time on the node
            prof = (d.get("res") or {}).get("profile")
            if isinstance(prof, dict):  # DDPFIX_FACTS_PROFILE=1 (--profile-facts): ms per reader on the node
                for k, v in prof.items():
                    t.setdefault("profile", {}).setdefault(k, []).append(float(v))
            if kind == "runner_on_ok" and "connects" in (node.get("probe") or {}):
                probes[d.get("host")] = node["probe"]["connects"] or []  # the last result per host
    out["probe_hosts"] = len(probes)
    out["probe_connects"] = sum(len(cs) for cs in probes.values())
    out["probe_connects_ok"] = sum(1 for cs in probes.values() for c in cs if c.get("ok"))
    for name in order:
        t = tasks[name]
        durs = t["durations"]
        out["tasks"].append({
            "task": name[:90], "span_s": round(t["end"] - t["start"], 3), "hosts": t["hosts"],
            "host_median_s": round(statistics.median(durs), 3) if durs else None,
            "host_max_s": round(max(durs), 3) if durs else None,
            "module_median_s": round(statistics.median(t["module"]), 3) if t.get("module") else None,
            **({"profile_median_ms": {k: round(statistics.median(v), 1) for k, v in t["profile"].items()}}
               if t.get("profile") else {}),
        })
    return out


def cleanup_state(res: dict[str, Any]) -> None:
    if res.get("state_dir"):
        shutil.rmtree(res["state_dir"], ignore_errors=True)


def audit_ok(res: dict[str, Any], n: int) -> None:
    try:
        doc = json.loads(Path(res["stdout_path"]).read_text())
        res["summary"] = doc.get("summary")
        res["finding_ids"] = sorted({f["id"] for f in doc.get("findings", [])})
        # on a clean lab every probe.* finding is false: keep its evidence (the run directory is temporary)
        res["probe_findings"] = [{k: f.get(k) for k in ("id", "host", "summary", "evidence")}
                                 for f in doc.get("findings", []) if f["id"].startswith("probe.")]
        res["ok"] = res["rc"] in (0, 1) and doc["summary"]["reachable"] == n
        if doc.get("command") == "remediate":
            res["changes"] = len(doc.get("changes") or [])
            res["changed"] = sum((doc.get("changed") or {}).values())
            res["remaining_fixable"] = len(doc.get("remaining_fixable") or [])
            res["ok"] = res["rc"] == 0 if doc.get("apply") else res["rc"] in (0, 1)  # a dry run with changes: 1
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        res["ok"] = False
        res["error"] = f"{exc}: {Path(res['stderr_path']).read_text(errors='replace')[-400:]}"


# ---------------------------------------------------------------- experiments


def mitogen_root(tmp: Path) -> tuple[Path, str] | None:
    """(content root, strategy plugin dir) for the mitogen variants, or None when mitogen is not installed
    (`pip install mitogen`: it is not a dependency of ddpfix). The content root is a copy of ddpfix's collection
    whose plays use `mitogen_linear` instead of the `linear` they pin; nothing in the checkout changes."""
    try:
        import ansible_mitogen  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    from ddpfix import paths

    src, root = paths.ansible_root(), tmp / "ansible-mitogen"
    if not root.exists():
        root.mkdir(parents=True)
        for part in ("playbooks", "roles", "plugins", "meta"):  # the playbook-adjacent collections link stays relative
            shutil.copytree(src / part, root / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(src / "galaxy.yml", root / "galaxy.yml")
        for pb in (root / "playbooks").glob("*.yml"):
            pb.write_text(pb.read_text().replace("strategy: linear", "strategy: mitogen_linear"))
    return root, str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy")


def experiment_variants(tmp: Path, n: int) -> list[dict[str, Any]]:
    few = max(2, min(4, n // 4))
    return [
        {"id": "default", "label": "ddpfix settings as shipped", "env": {}},
        {"id": "pipelining-off", "label": "ANSIBLE_PIPELINING=False",
         "env": {"BENCH_ENV": json.dumps({"ANSIBLE_PIPELINING": "False"})}},
        {"id": "controlpersist-off", "label": "no ControlMaster/ControlPersist (new SSH connection per task)",
         "env": {"BENCH_ENV": json.dumps({"ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o ServerAliveInterval=15"})}},
        {"id": "inject-facts-on", "label": "ANSIBLE_INJECT_FACT_VARS=True",
         "env": {"BENCH_ENV": json.dumps({"ANSIBLE_INJECT_FACT_VARS": "True"})}},
        {"id": f"forks-{few}", "label": f"--forks {few} (instead of one per host)", "env": {}, "forks": few},
        {"id": "no-event-files", "label": "event handler returns False (ansible-runner writes no job_events/*.json)",
         "env": {"BENCH_NO_EVENT_FILES": "1"}},
        {"id": "only-failed-event-data", "label": "ansible-runner only_failed_event_data=True", "once": True,
         "env": {"BENCH_RUNNER_KWARGS": json.dumps({"only_failed_event_data": True})}},
    ]


REMEDIATE_VARIANTS = [
    {"id": "remediate-apply-default", "label": "`remediate --apply` (no-op) as shipped", "env": {}},
]


def mitogen_variants(tmp: Path) -> list[dict[str, Any]]:
    """The audit, `remediate` (dry run: its check-mode play of several tasks per host) and `remediate --apply`
    through mitogen's `mitogen_linear` strategy (issue 10 item 5: offered only where it is faster and gives
    identical results), when mitogen is installed."""
    found = mitogen_root(tmp)
    if found is None:
        log("  mitogen is not installed (pip install mitogen): its variants are left out")
        return []
    root, strategies = found
    env = {"BENCH_ANSIBLE_ROOT": str(root), "BENCH_ENV": json.dumps({"ANSIBLE_STRATEGY_PLUGINS": strategies})}
    what = f"with mitogen_linear (mitogen {_version('mitogen')})"
    return [
        {"id": "mitogen", "label": f"audit {what}", "env": env},
        {"id": "remediate-dry-mitogen", "label": f"`remediate` (dry run, env files missing) {what}", "env": env},
        {"id": "remediate-apply-mitogen", "label": f"`remediate --apply` (no-op) {what}", "env": env},
    ]


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "?"


DRY_DEFAULT = {"id": "remediate-dry-default", "label": "`remediate` (dry run, env files missing) as shipped",
               "env": {}}


def _command(variant_id: str) -> list[str]:
    if variant_id.startswith("remediate-dry-"):
        return ["remediate"]
    return ["remediate", "--apply"] if variant_id.startswith("remediate-") else ["audit"]


def _reference(variant_id: str) -> str:
    """The variant each one is compared with, in the same round."""
    for prefix in ("remediate-dry-", "remediate-apply-"):
        if variant_id.startswith(prefix):
            return prefix + "default"
    return "default"


def run_experiments(r: Runner, variants: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for rnd in range(rounds):
        for v in variants:
            if v.get("once") and rnd > 0:
                continue
            res = r.ddpfix("exp-" + v["id"], [*_command(v["id"]), "--format", "json"], variant=v["env"],
                           forks=v.get("forks"))
            audit_ok(res, r.n)
            res["variant"], res["round"] = v["id"], rnd
            cleanup_state(res)
            runs.append(res)
            log(f"  exp {v['id']:24s} round {rnd}: {res['wall_s']:.2f} s, cpu {res['cpu_s']:.2f} s, ok={res.get('ok')}"
                f", probes={sum(e['probe_connects'] for e in res['events'])}, changes {res.get('changes', '-')}")
    return runs


# ---------------------------------------------------------------- one cluster size


def make_clean(name: str, info: Any) -> int:
    """Write on every node the env file ddpfix would write (so remediate has nothing to do), without Ansible:
    the plan from the inventory and the lab's known addresses/interfaces, `render_env` as remediate uses it."""
    from ddpfix import lab
    from ddpfix.inventory.derive import load_cluster
    from ddpfix.plan import plan_cluster, render_env

    cluster = load_cluster([str(info.inventory)])
    by = {n.name: n for n in info.nodes}
    facts = {
        n.name: {"hostname": by[n.name].hostname,
                 "cluster": {"address": by[n.name].address, "cidr": cluster.cluster_cidr, "ifname": by[n.name].ifname},
                 "interfaces": [{"name": by[n.name].ifname,
                                 "addrs": [{"family": "inet", "local": by[n.name].address}]}]}
        for n in cluster.nodes
    }
    path = cluster.env_path
    for node, plan in plan_cluster(cluster, facts).items():
        lab.node_exec(name, node, ["sh", "-c", f"umask 022; mkdir -p '{os.path.dirname(path)}' && cat > '{path}'"],
                      input=render_env(plan))
    return len(facts)


def remediate_runs_for(args: argparse.Namespace, idx: int) -> int:
    reps = [int(x) for x in str(args.remediate_runs).split(",") if x]
    return reps[idx] if idx < len(reps) else reps[-1]


def bench_size(n: int, idx: int, args: argparse.Namespace, tmp: Path, name: str) -> dict[str, Any]:
    from ddpfix.ansible.env import default_forks

    inv_dir = tmp / f"inv{n}"
    forks = default_forks(n, None)
    t0 = time.monotonic()
    info, notes = lab_up(name, n, inv_dir, tmp)
    log(f"N={n}: lab {name} up on {notes['subnet']} in {notes['up_s']} s; forks {forks}")
    out: dict[str, Any] = {"n": n, "forks": forks, "lab": notes, "runs": []}
    r = Runner(tmp / f"n{n}", info.inventory, n, forks, args.profile_facts)
    try:
        for i in range(-1, args.pairs):
            warm = i < 0
            a = r.ddpfix("audit", ["audit", "--format", "json"])
            audit_ok(a, n)
            b = r.baseline()
            c = r.raw_ssh(info.ssh_config, [x.name for x in info.nodes])
            for x in (a, b, c):
                x["pair"], x["warmup"] = i, warm
                x["load1"] = os.getloadavg()[0]
                cleanup_state(x)
                out["runs"].append(x)
            log(f"  {'warm-up' if warm else f'pair {i + 1}'}: audit {a['wall_s']:.2f} s (ok={a.get('ok')}, "
                f"{','.join(a.get('finding_ids') or [])}), baseline {b['wall_s']:.2f} s (ok={b.get('ok')}), "
                f"raw ssh {c['wall_s']:.2f} s (ok={c.get('ok')}), ratio {a['wall_s'] / b['wall_s']:.2f}")
        out["fixed"] = fixed_costs(r)
        log(f"  fixed costs in the CLI process: {out['fixed']}")
        if n == args.forks_check_n and args.forks_check_runs:
            out["forks_check"] = forks_check(r, n, args.forks_check_forks, args.forks_check_runs)
        # the audited lab lacks only the env files (env_rules.MISSING, info): write them, then remediate has
        # nothing to do
        make_clean(name, info)
        for i in range(remediate_runs_for(args, idx)):
            for kind, extra in (("remediate-dry", []), ("remediate-apply-noop", ["--apply"])):
                x = r.ddpfix(kind, ["remediate", *extra, "--format", "json"])
                audit_ok(x, n)
                x["rep"] = i
                cleanup_state(x)
                out["runs"].append(x)
                log(f"  {kind}: {x['wall_s']:.2f} s, changes {x.get('changes')}, changed {x.get('changed')}, "
                    f"rc {x['rc']}, "
                    f"findings {','.join(x.get('finding_ids') or []) or 'none'}")
    finally:
        lab_down(name, out)
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


# ---------------------------------------------------------------- remediate's cost (issue 21 item 5)
# `--remediate-cost 4,8,16,32`: per N, on a clean lab (env files missing: every node has its env file and cluster
# file to write), `--remediate-cost-rounds` rounds of, back to back: audit, remediate (dry run), remediate --apply
# (writes every node's env and cluster file, then re-audits); after each apply the written files are removed again.
# Its own summary (benchmarks/remediate-cost.json) and section (benchmarks/remediate-cost.md, in BENCHMARKS.md).

REMEDIATE_COST_JSON = HERE / "remediate-cost.json"


def remove_env_files(name: str, info: Any) -> None:
    """Back to 'env files missing' on every node: the env file and the cluster file (and their backups) removed."""
    from ddpfix import lab
    from ddpfix.inventory.derive import load_cluster

    path = load_cluster([str(info.inventory)]).env_path
    d = os.path.dirname(path)
    for n in info.nodes:
        lab.node_exec(name, n.name, ["sh", "-c", f"rm -f '{path}' '{d}/cluster.json' '{d}'/*~"])


def remediate_cost_size(n: int, rounds: int, tmp: Path, name: str) -> dict[str, Any]:
    from ddpfix.ansible.env import default_forks

    forks = default_forks(n, None)
    info, notes = lab_up(name, n, tmp / f"rc-inv{n}", tmp)
    log(f"remediate cost N={n}: lab {name} up on {notes['subnet']} in {notes['up_s']} s; forks {forks}")
    out: dict[str, Any] = {"n": n, "forks": forks, "lab": notes, "runs": []}
    r = Runner(tmp / f"rc{n}", info.inventory, n, forks)
    try:
        for i in range(-1, rounds):
            for kind, args in (("audit", ["audit"]), ("remediate-dry", ["remediate"]),
                               ("remediate-apply", ["remediate", "--apply"])):
                x = r.ddpfix(kind, [*args, "--format", "json"])
                audit_ok(x, n)
                x["pair"], x["warmup"], x["load1"] = i, i < 0, os.getloadavg()[0]
                cleanup_state(x)
                out["runs"].append(x)
            remove_env_files(name, info)
            a, d, p = (out["runs"][-3:][k] for k in range(3))
            log(f"  {'warm-up' if i < 0 else f'round {i + 1}'}: audit {a['wall_s']:.2f} s, dry {d['wall_s']:.2f} s "
                f"({d.get('changes')} changes, ok={d.get('ok')}), apply {p['wall_s']:.2f} s (changed "
                f"{p.get('changed')}, ok={p.get('ok')}), load {os.getloadavg()[0]:.1f}")
    finally:
        lab_down(name, out)
    return out


def lab_down(name: str, out: dict[str, Any]) -> None:
    from ddpfix import lab

    try:
        lab.down(name)
    except Exception as exc:  # noqa: BLE001 - report, keep going with the other sizes
        log(f"lab down {name} failed: {exc}")
        out["lab_down_error"] = str(exc)


def remediate_cost(args: argparse.Namespace, tmp: Path, name: str) -> int:
    """The `--remediate-cost` run: its own results and summary; BENCHMARKS.md re-rendered from summary.json with
    its section."""
    from ddpfix import lab

    t0, started = time.monotonic(), time.time()
    res: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine_info(),
        "started": dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "load_before": os.getloadavg(), "other_labs_before": [x for x in lab.list_labs() if x != name], "sizes": [],
    }
    try:
        for i, n in enumerate(int(x) for x in args.remediate_cost.split(",") if x):
            res["sizes"].append(remediate_cost_size(n, args.remediate_cost_rounds, tmp, f"{name}-c{i}"))
            res["load_after"] = os.getloadavg()
            res["duration_s"] = round(time.monotonic() - t0, 1)
            res["finished"] = dt.datetime.now().isoformat(timespec="seconds")
            (RAW / "results-remediate-cost.json").parent.mkdir(parents=True, exist_ok=True)
            (RAW / "results-remediate-cost.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
            REMEDIATE_COST_JSON.write_text(json.dumps(report.summarize_remediate_cost(res), indent=1) + "\n")
            (HERE / "remediate-cost.md").write_text(
                report.render_remediate_cost(json.loads(REMEDIATE_COST_JSON.read_text())) + "\n")
    finally:
        if SUMMARY.exists():
            Path(args.md).write_text(report.render_summary(json.loads(SUMMARY.read_text())))
    return 0


def fixed_costs(r: Runner, runs: int = 5) -> dict[str, Any]:
    """Medians over `runs` fresh processes of benchmarks/_fixed.py: the CLI's import (`ddpfix audit`'s)."""
    got: list[dict[str, float]] = []
    for _ in range(runs):
        state = Path(tempfile.mkdtemp(prefix="state-", dir=r.tmp))
        p = subprocess.run([sys.executable, str(HERE / "_fixed.py")], env=r._env(state),
                           capture_output=True, text=True, check=True)
        got.append(json.loads(p.stdout))
        shutil.rmtree(state, ignore_errors=True)
    return {k: round(statistics.median(x[k] for x in got), 3) for k in got[0]} | {"runs": runs}


def forks_check(r: Runner, n: int, forks: int, runs: int) -> dict[str, Any]:
    """`runs` consecutive clean audits with --forks below N: count the probe.* findings (each one is false: the lab
    is clean) and the runs that used the second round."""
    out: dict[str, Any] = {"n": n, "forks": forks, "runs": runs, "false_probe_findings": 0, "second_round": 0,
                           "failed_runs": 0, "walls": []}
    for i in range(runs):
        a = r.ddpfix("audit-forks", ["audit", "--format", "json"], forks=forks)
        audit_ok(a, n)
        try:
            doc = json.loads(Path(a["stdout_path"]).read_text())
        except (OSError, json.JSONDecodeError):
            doc = {}
        probe = [f for f in doc.get("findings", []) if f["id"].startswith("probe.")]
        out["false_probe_findings"] += len(probe)
        out["second_round"] += (doc.get("probe_rounds") or {}).get("rounds") == 2
        out["failed_runs"] += not a.get("ok")
        out["walls"].append(round(a["wall_s"], 2))
        cleanup_state(a)
        log(f"  forks {forks} audit {i + 1}/{runs}: {a['wall_s']:.2f} s, probe findings {len(probe)}, ok={a.get('ok')}")
    return out


def experiments_size(n: int, args: argparse.Namespace, tmp: Path, name: str) -> dict[str, Any]:
    from ddpfix import lab
    from ddpfix.ansible.env import default_forks

    info, notes = lab_up(name, n, tmp / f"inv{n}", tmp)
    log(f"experiments N={n}: lab {name} up on {notes['subnet']}")
    r = Runner(tmp / f"n{n}", info.inventory, n, default_forks(n, None))
    extra = mitogen_variants(tmp / f"exp{n}")
    dry = [DRY_DEFAULT] + [v for v in extra if v["id"].startswith("remediate-dry-")]
    rest = (experiment_variants(tmp / f"exp{n}", n) + [v for v in extra if v["id"] == "mitogen"] + REMEDIATE_VARIANTS
            + [v for v in extra if v["id"].startswith("remediate-apply-")])
    try:
        # first, while the lab lacks its env files: remediate's dry run plans the env role on every node and runs
        # its check-mode play (several tasks per host), and can be repeated; then the no-op applies and the audits
        runs = run_experiments(r, dry, args.experiment_rounds)
        make_clean(name, info)
        runs += run_experiments(r, rest, args.experiment_rounds)
        return {"n": n, "rounds": args.experiment_rounds, "runs": runs, "lab": notes,
                "variants": [{"id": v["id"], "label": v["label"], "ref": _reference(v["id"])} for v in dry + rest]}
    finally:
        lab.down(name)


# ---------------------------------------------------------------- fleet-size stand-in: N aliases of a small lab


def alias_inventory(info: Any, n: int, path: Path) -> list[tuple[str, str]]:
    """Write an inventory of `n` aliases of the lab's nodes (round-robin): each alias is its own inventory host with
    `ansible_host` = a lab node's address, so Ansible, SSH (ControlPersist: one control path per alias) and ddpfix
    treat it as a node of its own. The lab's own group vars are kept; the master is the first alias. Returns
    [(alias, address)]."""
    import yaml

    doc = yaml.safe_load(Path(info.inventory).read_text())
    group = doc["all"]["children"]["ddp_nodes"]
    addrs = [h["ansible_host"] for h in group["hosts"].values()]
    aliases = [(f"f{i + 1:04d}", addrs[i % len(addrs)]) for i in range(n)]
    # its own SSH connection too: Ansible's default ControlPath hashes the address, which aliases share
    group["hosts"] = {a: {"ansible_host": ip, "ansible_control_path": f"%(directory)s/{a}"} for a, ip in aliases}
    group["vars"]["ddp_master"] = aliases[0][0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return aliases


def alias_names_resolve(name: str, info: Any, aliases: list[tuple[str, str]]) -> None:
    """Every lab node's /etc/hosts gets the aliases' names (as a fleet's names resolve), so that the nodes' name
    checks answer from files, not from the lab's DNS that refuses every query."""
    from ddpfix import lab

    lines = "".join(f"{ip}\t{a}\n" for a, ip in aliases)
    for node in info.nodes:
        lab.node_exec(name, node.name, ["sh", "-c", "cat >> /etc/hosts"], input=lines)


def alias_findings(res: dict[str, Any]) -> None:
    """The audit's findings by id and count (the aliases' share of a node is visible in them: duplicate hostnames
    and machine-ids, routes over lo, listener ports taken by another alias of the same node)."""
    try:
        doc = json.loads(Path(res["stdout_path"]).read_text())
    except (OSError, json.JSONDecodeError):
        return
    counts: dict[str, int] = {}
    for f in doc.get("findings", []):
        counts[f["id"]] = counts.get(f["id"], 0) + 1
    res["finding_counts"] = counts


def sliced_pattern(r: Runner, n: int, forks: int, k: int, audit: dict[str, Any], facts: Path) -> list[dict[str, Any]]:
    """One controller past its reach, the CLI's way (docs/fleet.md): `k` `--limit` batches of the aliases in
    inventory order (`ddp_nodes[a:b]`), each `ddpfix audit --facts-out DIR`, then one `ddpfix audit --facts-in DIR
    ...` over all of them (no node contacted). The merge's findings are compared with the single audit's (`audit`):
    every non-probe finding equal, its probe findings a subset (a batch dials only its own nodes)."""
    out, dirs = [], []
    bounds = [round(j * n / k) for j in range(k + 1)]
    for j in range(k):
        d = facts / f"batch{j}"
        x = r.ddpfix("sliced-batch", ["audit", "--limit", f"ddp_nodes[{bounds[j]}:{bounds[j + 1] - 1}]",
                                      "--facts-out", str(d), "--fail-on", "none", "--format", "json"], forks=forks)
        x["ok"] = x["rc"] == 0
        x["batch"], x["batches"] = j, k
        out.append(x)
        dirs += ["--facts-in", str(d)]
    m = r.ddpfix("sliced-merge", ["audit", *dirs, "--format", "json"])
    m["batches"] = k
    alias_findings(m)
    try:
        single = _finding_keys(Path(audit["stdout_path"]))
        merged = _finding_keys(Path(m["stdout_path"]))
        doc = json.loads(Path(m["stdout_path"]).read_text())
        m["reachable"] = doc["summary"]["reachable"]
    except (OSError, json.JSONDecodeError, KeyError):
        m["ok"] = False
    else:
        def probes(ks: set[tuple[str, str]]) -> set[tuple[str, str]]:
            return {x for x in ks if x[0].startswith("probe.")}

        m["nonprobe_equal"] = merged - probes(merged) == single - probes(single)
        m["probe_subset"] = probes(merged) <= probes(single)
        m["ok"] = m["rc"] in (0, 1) and m["nonprobe_equal"] and m["probe_subset"] and m["reachable"] == n
    return [*out, m]


def _finding_keys(path: Path) -> set[tuple[str, str]]:
    return {(f["id"], str(f["host"])) for f in json.loads(path.read_text()).get("findings", [])}


def bench_aliases(spec: str, args: argparse.Namespace, tmp: Path, name: str) -> dict[str, Any]:
    """`--aliases N:NODES:FORKS`: a lab of NODES real nodes, an inventory of N aliases of them, and `--alias-rounds`
    rounds of, back to back: the audit, `ansible -m setup -a gather_subset=network` and `ansible -m ping`, then
    (`--alias-sliced K`) the sliced CLI pattern (K `--limit` batches saving their facts, one merge), then
    (`--alias-remediate`) the remediate dry run and `--apply`, all with `--forks FORKS` (cold SSH connections in
    every run)."""
    from ddpfix import lab

    n, nodes, forks, *more = (int(x) for x in spec.split(":"))
    rounds = more[0] if more else args.alias_rounds  # N:NODES:FORKS:ROUNDS: this spec's own number of rounds
    t0 = time.monotonic()
    info, notes = lab_up(name, nodes, tmp / f"alias-lab{nodes}", tmp)
    inv = tmp / f"aliases{n}" / "hosts.yml"
    out: dict[str, Any] = {"n": n, "nodes": nodes, "forks": forks, "lab": notes, "runs": []}
    log(f"aliases N={n} of {nodes} lab nodes on {notes['subnet']}, --forks {forks}")
    try:
        aliases = alias_inventory(info, n, inv)
        alias_names_resolve(name, info, aliases)
        r = Runner(tmp / f"aliases{n}", inv, n, forks)
        for i in range(rounds):
            a = r.ddpfix("audit", ["audit", "--format", "json"], forks=forks)
            audit_ok(a, n)
            alias_findings(a)
            b = r.baseline()
            c = r.baseline("ping", ("ping",))
            more = []
            sliced = (sliced_pattern(r, n, forks, args.alias_sliced, a, tmp / f"aliases{n}" / f"facts{i}")
                      if args.alias_sliced else [])
            for kind, extra in (("remediate-dry", []), ("remediate-apply", ["--apply"])):
                if kind.removeprefix("remediate-") in args.alias_remediate.split(","):
                    x = r.ddpfix(kind, ["remediate", *extra, "--format", "json"], forks=forks)
                    audit_ok(x, n)
                    more.append(x)
            if more and more[-1]["kind"] == "remediate-apply" and i + 1 < rounds:
                remove_env_files(name, info)  # every round starts from the same nodes (env files missing)
            for x in (a, b, c, *sliced, *more):
                x["pair"], x["warmup"], x["load1"] = i, False, os.getloadavg()[0]
                cleanup_state(x)
                out["runs"].append(x)
            log(f"  round {i + 1}: audit {a['wall_s']:.1f} s (rc {a['rc']}, {a.get('finding_counts')}), "
                f"setup {b['wall_s']:.1f} s (rc {b['rc']}, {b.get('hosts_ok')}/{n} ok), "
                f"ping {c['wall_s']:.1f} s (rc {c['rc']}, {c.get('hosts_ok')}/{n} ok), "
                + "".join(f"{x['kind']} {x['wall_s']:.1f} s (rc {x['rc']}, {x.get('changes')} changes, "
                          f"{x.get('changed')} changed), " for x in more) + f"load {os.getloadavg()}")
            if args.alias_sliced:
                log("  " + report.sliced_line(report.sliced_of(out["runs"], i)))
    finally:
        lab.down(name)
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description="ddpfix benchmark (see BENCHMARKS.md)")
    ap.add_argument("--sizes", default="4,8,16,32", help="lab cluster sizes (default 4,8,16,32)")
    ap.add_argument("--pairs", type=int, default=5, help="A/B pairs after the warm-up (default 5)")
    ap.add_argument("--remediate-runs", default="2,1,1,1",
                    help="dry runs and no-op applies per size: one number, or one per size (default 3,2,1,1)")
    ap.add_argument("--analysis-sizes", default="100,1000,2000")
    ap.add_argument("--analysis-budget", type=float, default=20, help="seconds per analysis variant and size")
    ap.add_argument("--experiments", action="store_true",
                    help="instead: the Ansible settings experiments at --experiments-at (about 8 min at 16)")
    ap.add_argument("--experiments-at", default="16")
    ap.add_argument("--experiment-rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: sizes 4,8, 2 pairs, 1 remediate run, analysis 100,1000")
    ap.add_argument("--json",
                    help="raw results (default benchmarks/results/results.json; results-experiments.json with "
                         "--experiments)")
    ap.add_argument("--md", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--summary",
                    help="the summary BENCHMARKS.md is rendered from (default benchmarks/summary.json with the default "
                         "--md; with another --md, MD's name with .summary.json, so a trial run leaves the published "
                         "summary alone)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    ap.add_argument("--forks-check", default="16:4:20",
                    help="N:FORKS:RUNS consecutive clean audits with --forks FORKS at size N "
                         "(default 16:4:20; 0 runs: skip)")
    ap.add_argument("--aliases", default="",
                    help="instead: N:NODES:FORKS[:ROUNDS], the fleet-size stand-in (N inventory aliases of a "
                         "NODES-node lab, audit / setup / ping with --forks FORKS, ROUNDS rounds, default "
                         "--alias-rounds); several separated by commas")
    ap.add_argument("--alias-rounds", type=int, default=1, help="rounds per --aliases spec (default 1)")
    ap.add_argument("--alias-remediate", default="",
                    help="with --aliases: also `remediate` after each round's ping: dry, apply or dry,apply "
                         "(default none)")
    ap.add_argument("--alias-sliced", type=int, default=0, metavar="K",
                    help="with --aliases: also the sliced CLI pattern after each round's ping: K `--limit` batches "
                         "with --facts-out, then one --facts-in merge (docs/fleet.md; default 0: not run)")
    ap.add_argument("--remediate-cost",
                    help="instead: audit, remediate dry run and --apply side by side, env files missing, at these "
                         "sizes (e.g. 4,8,16,32); writes benchmarks/remediate-cost.{json,md}")
    ap.add_argument("--remediate-cost-rounds", type=int, default=3, help="rounds per size after the warm-up")
    ap.add_argument("--profile-facts", action="store_true",
                    help="the audits run with DDPFIX_FACTS_PROFILE=1: the facts module's ms per reader on each node "
                         "(raw results: events.tasks.profile_median_ms)")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.pairs, args.remediate_runs, args.analysis_sizes = "4,8", 2, "1", "100,1000"
        args.experiments_at, args.experiment_rounds = "8", 1
    args.json = args.json or str(RAW / ("results-aliases.json" if args.aliases else
                                        "results-experiments.json" if args.experiments else "results.json"))
    args.forks_check_n, args.forks_check_forks, args.forks_check_runs = (int(x) for x in args.forks_check.split(":"))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if os.geteuid() != 0:
        print("run.py needs root (the lab uses network namespaces)", file=sys.stderr)
        return 4
    from ddpfix import lab

    started = time.time()
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="ddpfix-bench-"))
    name = f"bench{os.getpid() % 100000}"
    results: dict[str, Any] = {
        "schema": "ddpfix.bench/v1",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "args": vars(args),
        "machine": machine_info(),
        "started": dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "load_before": os.getloadavg(),
        "other_labs_before": [x for x in lab.list_labs() if x != name],
        "sizes": [],
    }
    log(f"machine {results['machine']['cores']} cores, {results['machine']['mem_gib']} GiB; "
        f"load {results['load_before']}; "
        f"other labs running: {results['other_labs_before'] or 'none'}")
    if args.remediate_cost:
        try:
            return remediate_cost(args, tmp, name)
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    try:
        if args.aliases:
            results["aliases"] = []
            for i, spec in enumerate(x for x in args.aliases.split(",") if x):
                results["aliases"].append(bench_aliases(spec, args, tmp, f"{name}-a{i}"))
                _save(results, args, t0)
        elif args.experiments:
            results["experiments"] = [experiments_size(int(n), args, tmp, f"{name}-x{n}")
                                      for n in args.experiments_at.split(",") if n]
        else:
            for i, n in enumerate(sizes):
                results["sizes"].append(bench_size(n, i, args, tmp, f"{name}-{i}"))
                _save(results, args, t0)  # partial results survive an interrupted run
            log("analysis on synthetic facts")
            import analysis

            results["analysis"] = analysis.run_sizes([int(s) for s in args.analysis_sizes.split(",") if s],
                                                     ["current"], args.analysis_budget)
    finally:
        results["load_after"] = os.getloadavg()
        results["other_labs_after"] = [x for x in lab.list_labs() if not x.startswith(name)]
        _save(results, args, t0)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"done in {results['duration_s']:.0f} s: {args.json}, {args.md}")
    return 0


def summary_path(args: argparse.Namespace) -> Path:
    """Where this run's summary goes: --summary; else the published one for the published BENCHMARKS.md, and a file
    next to any other --md (a trial run does not overwrite benchmarks/summary.json)."""
    if args.summary:
        return Path(args.summary)
    md = Path(args.md)
    return SUMMARY if md.resolve() == (ROOT / "BENCHMARKS.md").resolve() else md.with_suffix(".summary.json")


def _earlier(target: Path) -> dict[str, Any]:
    """The summary the rows this run does not measure come from: the target's, else the published one."""
    for p in (target, SUMMARY):
        if p.exists():
            return dict(json.loads(p.read_text()))
    return {}


def _save(results: dict[str, Any], args: argparse.Namespace, t0: float) -> None:
    target = summary_path(args)
    results["duration_s"] = round(time.monotonic() - t0, 1)
    results["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    if args.aliases:  # the stand-in's own part of summary.json; the other sizes' rows stay as they were
        summary = _earlier(target)
        summary["aliases"] = report.summarize_aliases(results)
        target.write_text(json.dumps(summary, indent=1) + "\n")
        Path(args.md).write_text(report.render_summary(summary))
    elif args.experiments:
        (HERE / "experiments.md").write_text(report.render_experiments(results) + "\n")
    else:
        summary = report.summarize(results)
        # the fleet-size stand-in's rows come from their own runs (--aliases)
        summary["aliases"] = _earlier(target).get("aliases") or []
        target.write_text(json.dumps(summary, indent=1) + "\n")
        Path(args.md).write_text(report.render_summary(summary))


if __name__ == "__main__":
    sys.exit(main())
