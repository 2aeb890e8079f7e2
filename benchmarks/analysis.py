#!/usr/bin/env python3
"""Benchmark of the controller's analysis alone, on synthetic facts (no hosts, no Ansible).

    .venv/bin/python benchmarks/analysis.py [--sizes 100,1000,2000] [--timeout 120] [--json OUT]

Each size runs in a fresh child process (so its memory figures are its own) that:

1. builds a clean cluster of M nodes with the shapes of the recorded clean 3-node cluster
   (tests/unit/fixtures/facts/clean3, read the same way as tests/unit/conftest.py's `Sim`): every node's
   `ddpfix_node` facts (interfaces, /etc/hosts holding every node, chrony tracking, the firewall state
   recorded on a real machine, an env file with the values ddpfix would write) and its `ddpfix_probe`
   result (every peer's name resolved, a route to every peer, master + 2 ring-peer connects);
2. times, without tracemalloc: `Context(...)` (which computes the cidr and `plan_cluster`), `run_checks`,
   `plan_cluster` on its own and `render_env` for every node;
3. re-runs the same phases under tracemalloc for the peak bytes allocated by the analysis (the input facts
   excluded), and reports the process's peak RSS (ru_maxrss: input facts + analysis + interpreter).

With the `fixed` variant (run after `current` on the same inputs), the child monkeypatches `ddpfix.checks` with the
index-based rewrites proposed in BENCHMARKS.md (nothing in the repository is changed) to show what they buy.
"""

from __future__ import annotations

import argparse
import copy
import gc
import ipaddress
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLEAN3 = ROOT / "tests" / "unit" / "fixtures" / "facts" / "clean3"
CIDR = "10.20.0.0/16"


# ---------------------------------------------------------------- synthetic facts


def build_cluster(m: int) -> tuple[Any, dict[str, Any]]:
    """(Cluster, {name: HostFacts}) for a clean M-node cluster derived from the recorded clean3 facts."""
    from ddpfix.checks import HostFacts
    from ddpfix.inventory import cluster_from_inventory_data
    from ddpfix.plan import plan_cluster

    docs = {json.loads(p.read_text())["name"]: json.loads(p.read_text()) for p in sorted(CLEAN3.glob("node*.json"))}
    master_t, peer_t = docs["node1"], docs["node2"]
    net = ipaddress.ip_network(CIDR)
    names = [f"node{i + 1}" for i in range(m)]
    addrs = [str(net[11 + i]) for i in range(m)]
    std_hosts = [e for e in peer_t["node"]["hosts_file"] if e["addr"] in ("127.0.0.1", "::1", "ff02::1", "ff02::2")]
    hosts_lines = std_hosts + [
        {"addr": a, "line": 8 + i, "names": [n], "text": f"{a}\t{n}"}
        for i, (n, a) in enumerate(zip(names, addrs, strict=True))
    ]
    hosts_json = json.dumps(hosts_lines)
    probe_ports = [40000 + i % 20000 for i in range(m)]
    inventory = {
        "_meta": {"hostvars": {n: {"ansible_host": a} for n, a in zip(names, addrs, strict=True)}},
        "all": {"children": ["ungrouped", "ddp_nodes"]},
        "ddp_nodes": {"hosts": list(names)},
    }
    cluster = cluster_from_inventory_data(inventory)
    facts: dict[str, dict[str, Any]] = {}
    probes: dict[str, dict[str, Any]] = {}
    for i, (n, a) in enumerate(zip(names, addrs, strict=True)):
        t = master_t if i == 0 else peer_t
        node = copy.deepcopy(t["node"])
        node["cluster"] = {"address": a, "cidr": CIDR, "ifname": "eth0", "source": "cidr"}
        node["hostname"] = node["fqdn"] = n
        node["master_ip"] = addrs[0]
        node["machine_id"] = f"{i:032x}"
        node["resolve_self"] = {n: [a]}
        node["probe"].update(address=a, port=probe_ports[i], pid=1000 + i)
        for iface in node["interfaces"]:
            if iface["name"] == "eth0":
                iface["addrs"][0].update(local=a, prefixlen=net.prefixlen)
        node["hosts_file"] = json.loads(hosts_json)  # each host's facts are decoded separately: no sharing
        facts[n] = node
        ring = [names[(i + s) % m] for s in (1, 2) if m > s]
        probes[n] = {
            "connects": [{"address": addrs[0], "error": None, "kind": "master", "name": names[0], "ok": True,
                          "port": 29500, "seconds": 0.0}]
            + [{"address": addrs[(i + k + 1) % m], "error": None, "kind": "peer",
                "name": p, "ok": True, "port": probe_ports[(i + k + 1) % m], "seconds": 0.0}
               for k, p in enumerate(ring)],
            "resolve": {p: [pa] for p, pa in zip(names, addrs, strict=True) if p != n},
            "routes": {pa: {"dev": "eth0", "src": a, "type": None, "via": None} for pa in addrs if pa != a},
        }
    # the env file ddpfix itself would write (a clean, remediated cluster)
    for n, p in plan_cluster(cluster, facts).items():
        facts[n]["env_file"] = {"exists": True, "path": "/etc/ddpfix/ddp.env", "values": dict(p.env)}
    collected = master_t["collected_at"]
    hosts = {n: HostFacts(n, node=facts[n], probe=probes[n],
                          collected_at=collected + facts[n]["now"] - master_t["node"]["now"])
             for n in names}
    return cluster, hosts


# ---------------------------------------------------------------- the proposed fix, as a monkeypatch


def apply_fixed_variant() -> None:
    """Index-based rewrites of the O(N^2)/O(N^3) spots in ddpfix.checks (proposal; the repo is not changed)."""
    from ddpfix import checks, inventory

    def audited(self):  # cache: Context.facts/cluster do not change after construction
        cached = self.__dict__.get("_audited")
        if cached is None:
            cached = [(n.name, self.facts[n.name]) for n in self.cluster.nodes if self.facts.get(n.name)]
            self.__dict__["_audited"] = cached
        return list(cached)

    checks.Context.audited = audited

    _node_index: dict[int, dict[str, Any]] = {}

    def node(self, name):
        idx = _node_index.get(id(self))
        if idx is None:
            idx = _node_index[id(self)] = {n.name: n for n in self.nodes}
        try:
            return idx[name]
        except KeyError:
            raise KeyError(name) from None

    inventory.Cluster.node = node

    def check_resolution(ctx):
        from ddpfix.findings import finding

        audited = ctx.audited()
        count: dict[str, int] = {}
        for _, f in audited:
            if f.get("hostname"):
                count[f["hostname"]] = count.get(f["hostname"], 0) + 1
        peers = {f.get("hostname"): name for name, f in audited if f.get("hostname")}
        dup = {hn for hn, c in count.items() if c > 1}
        families: dict[str, set[int]] = {}
        want_of = {hn: ctx.plan[peer].address for hn, peer in peers.items() if hn not in dup}
        for name, f in audited:
            res = (ctx.hosts[name].probe or {}).get("resolve") or {}
            # fast path: one C-level pass finds the names whose first answer is not the wanted address
            odd = [hn for hn, a in res.items() if hn in want_of and (not a or a[0] != want_of[hn] or ":" in a[0])]
            fams = {6 if ":" in a[0] else 4 for hn, a in res.items() if a and hn in want_of and peers[hn] != name}
            if fams:
                families.setdefault(name, set()).update(fams)
            for hn in odd:
                peer = peers[hn]
                if peer == name:
                    continue
                addrs = res.get(hn) or []
                want = want_of[hn]
                if not addrs:
                    yield finding("hosts.peer-unresolvable", name,
                                  f"peer {peer}'s hostname {hn} does not resolve on {name}",
                                  f"getaddrinfo({hn!r}) on {name}: no address; {checks._hosts_lines(f, hn)}")
                    continue
                first = addrs[0]
                if want and first != want:
                    where = ("outside the cluster network " + str(ctx.cidr) if not ctx.in_cidr(first)
                             else f"not {peer}'s cluster address {want}")
                    yield finding("hosts.peer-mismatch", name, f"{hn} resolves to {first} on {name}, {where}",
                                  f"getaddrinfo({hn!r}) on {name} = {', '.join(addrs)}; {checks._hosts_lines(f, hn)}")
        if len({frozenset(s) for s in families.values()}) > 1:
            per_node = "; ".join(f"{n}: IPv{'/'.join(str(x) for x in sorted(s))}" for n, s in sorted(families.items()))
            yield finding("addr.family-mismatch", None,
                          "peer names resolve to different address families on different nodes", per_node)

    def check_routes(ctx):
        from ddpfix.findings import finding

        by_addr: dict[str, str] = {}
        for p, pl in ctx.plan.items():
            if pl.address is not None:
                by_addr.setdefault(pl.address, p)
        for name, _f in ctx.audited():
            routes = (ctx.hosts[name].probe or {}).get("routes") or {}
            ifname = ctx.plan[name].ifname
            for dst, r in routes.items():  # run_checks sorts the findings anyway: no per-node sort of N routes
                if "error" in r:
                    continue
                if r.get("via") or (ifname and r.get("dev") != ifname):
                    peer = by_addr.get(dst, dst)
                    yield finding("route.via-gateway", name,
                                  f"traffic from {name} to {peer} ({dst}) leaves via {r.get('via') or r.get('dev')} "
                                  f"instead of on-link on {ifname}",
                                  f"ip route get {dst}: dev {r.get('dev')}"
                                  + (f" via {r['via']}" if r.get("via") else "")
                                  + (f" src {r['src']}" if r.get("src") else ""))

    real_fw = checks.firewall_lib()

    class MemoFirewall:
        """The role's evaluator, memoised on (firewall state content, arguments): clean clusters share states."""

        def __init__(self) -> None:
            self.memo: dict[Any, Any] = {}
            self.keys: dict[int, tuple[Any, str]] = {}

        def _key(self, state: Any) -> str:
            hit = self.keys.get(id(state))
            if hit is None or hit[0] is not state:
                hit = self.keys[id(state)] = (state, json.dumps(state, sort_keys=True, default=str))
            return hit[1]

        def _call(self, fn: str, state: Any, *args: Any, **kw: Any) -> Any:
            k = (fn, self._key(state), args, tuple(sorted(kw.items())))
            if k not in self.memo:
                self.memo[k] = getattr(real_fw, fn)(state, *args, **kw)
            return self.memo[k]

        def evaluate(self, state, *a, **kw):
            return self._call("evaluate", state, *a, **kw)

        def sample_ports(self, state, *a, **kw):
            return self._call("sample_ports", state, *a, **kw)

        def world_open(self, state, *a, **kw):
            return self._call("world_open", state, *a, **kw)

    orig_check_firewall = checks.check_firewall

    def check_firewall(ctx):
        # same function, fed the memoised evaluator (and the N-long source list cut early, see BENCHMARKS.md)
        memo = MemoFirewall()
        saved = checks.firewall_lib
        checks.firewall_lib = lambda: memo  # type: ignore[assignment]
        try:
            yield from orig_check_firewall(ctx)
        finally:
            checks.firewall_lib = saved

    checks.check_resolution = check_resolution
    checks.check_routes = check_routes
    checks.check_firewall = check_firewall
    repl = {"check_resolution": check_resolution, "check_routes": check_routes, "check_firewall": check_firewall}
    checks.CHECKS = tuple(repl.get(c.__name__, c) for c in checks.CHECKS)


# ---------------------------------------------------------------- one size, in this process


def _phases(cluster: Any, hosts: dict[str, Any]) -> dict[str, Any]:
    from ddpfix.checks import Context, Thresholds, run_checks
    from ddpfix.plan import plan_cluster, render_env

    out: dict[str, Any] = {}
    t = time.perf_counter()
    ctx = Context(cluster, hosts, Thresholds())
    out["context_s"] = time.perf_counter() - t
    t = time.perf_counter()
    findings = run_checks(ctx)
    out["checks_s"] = time.perf_counter() - t
    t = time.perf_counter()
    plans = plan_cluster(cluster, ctx.facts)
    out["plan_s"] = time.perf_counter() - t
    t = time.perf_counter()
    texts = [render_env(p) for p in plans.values()]
    out["render_env_s"] = time.perf_counter() - t
    out["total_s"] = out["context_s"] + out["checks_s"] + out["plan_s"] + out["render_env_s"]
    out["findings"] = len(findings)
    out["finding_ids"] = sorted({f.id for f in findings})
    out["env_bytes"] = sum(len(x) for x in texts)
    return out


class _Budget(Exception):
    pass


def _timed_pass(cluster: Any, hosts: dict[str, Any], budget_s: float) -> dict[str, Any]:
    """The phases under a wall-clock budget (SIGALRM interrupts the pure-Python loops)."""
    import signal

    def _alarm(*_: Any) -> None:
        raise _Budget()

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    t = time.perf_counter()
    try:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in _phases(cluster, hosts).items()}
    except _Budget:
        return {"timed_out": True, "budget_s": budget_s, "elapsed_s": round(time.perf_counter() - t, 1)}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _profile(cluster: Any, hosts: dict[str, Any]) -> list[dict[str, Any]]:
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    _phases(cluster, hosts)
    pr.disable()
    st = pstats.Stats(pr)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        if "ddpfix" in file or file.endswith("analysis.py"):
            rows.append({"function": f"{Path(file).name}:{line}:{func}", "calls": nc, "tottime_s": round(tt, 3),
                         "cumtime_s": round(ct, 3)})
    rows.sort(key=lambda r: r["cumtime_s"], reverse=True)
    return rows[:14]


def run_one(m: int, variants: list[str], budget_s: float, profile: bool) -> dict[str, Any]:
    """Build the inputs once, then time (and trace) each variant in turn on them."""
    from ddpfix.checks import firewall_lib

    firewall_lib()  # loading the role's module_utils is a one-off import, not analysis
    gc.disable()  # building millions of small dicts: no point in collecting while building
    t = time.perf_counter()
    cluster, hosts = build_cluster(m)
    build_s = time.perf_counter() - t
    gc.enable()
    gc.collect()
    out: dict[str, Any] = {"nodes": m, "build_inputs_s": round(build_s, 2),
                           "rss_after_inputs_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                           "variants": {}}
    for variant in variants:
        if variant == "fixed":
            apply_fixed_variant()
        res = _timed_pass(cluster, hosts, budget_s)
        res["rss_peak_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        if not res.get("timed_out") and res["total_s"] * 4 < budget_s:
            gc.collect()
            tracemalloc.start()
            _phases(cluster, hosts)
            res["tracemalloc_peak_mb"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
            tracemalloc.stop()
        if profile and not res.get("timed_out"):
            res["profile_top"] = _profile(cluster, hosts)
        out["variants"][variant] = res
    return out


# ---------------------------------------------------------------- driver


def run_sizes(sizes: list[int], variants: list[str], budget_s: float = 60, profile_at: int | None = None,
              python: str = sys.executable) -> list[dict[str, Any]]:
    results = []
    for m in sizes:
        argv = [python, str(Path(__file__).resolve()), "--one", str(m), "--variants", ",".join(variants),
                "--budget", str(budget_s)]
        if profile_at == m:
            argv.append("--profile")
        t = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            results.append({"nodes": m, "error": p.stderr.strip()[-2000:]})
            print(f"analysis {m} nodes failed: {p.stderr.strip()[-500:]}", file=sys.stderr)
            continue
        r = json.loads(p.stdout)
        r["wall_child_s"] = round(time.monotonic() - t, 1)
        results.append(r)
        for v, x in r["variants"].items():
            if x.get("timed_out"):
                print(f"analysis {v:8s} {m:>5} nodes: did not finish within {x['budget_s']:.0f} s", file=sys.stderr)
            else:
                print(f"analysis {v:8s} {m:>5} nodes: total {x['total_s']:.3f} s (checks {x['checks_s']:.3f}, "
                      f"Context incl. plan {x['context_s']:.3f}, plan {x['plan_s']:.3f}, "
                      f"render_env {x['render_env_s']:.3f}); "
                      f"tracemalloc peak {x.get('tracemalloc_peak_mb', '-')} MB; process RSS {x['rss_peak_mb']} MB "
                      f"(inputs {r['rss_after_inputs_mb']} MB)", file=sys.stderr)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sizes", default="100,1000,2000")
    ap.add_argument("--variants", default="current,fixed", help="current (the code as is) and/or fixed (proposal)")
    ap.add_argument("--budget", type=float, default=60, help="seconds allowed per variant and size")
    ap.add_argument("--profile-at", type=int, help="also cProfile the analysis at this size")
    ap.add_argument("--json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    if a.one:
        print(json.dumps(run_one(a.one, variants, a.budget, a.profile)))
        return
    res = run_sizes([int(s) for s in a.sizes.split(",")], variants, a.budget, a.profile_at)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    else:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
