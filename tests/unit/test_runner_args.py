"""The remediation run's command line stays small whatever the cluster size: extra vars go through a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpfix.errors import DdpfixError
from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.remediate import HostPlan, run_remediation
from ddpfix.rules.context import Context, HostFacts

N = 5000


def _ctx() -> Context:
    names = [f"gpu-node-{i:05d}.rack{i // 40:03d}.example.org" for i in range(N)]
    hv = {n: {"ansible_host": f"10.{i // 65536}.{(i // 256) % 256}.{i % 256 + 0}", "ddp_cluster_cidr": "10.0.0.0/16"}
          for i, n in enumerate(names)}
    data = {"_meta": {"hostvars": hv}, "all": {"children": ["ddp_nodes"]}, "ddp_nodes": {"hosts": names}}
    cluster = cluster_from_inventory_data(data, ["/dev/null"])
    hosts = {n: HostFacts(n, node={"hostname": n.split(".")[0], "cluster": {"address": hv[n]["ansible_host"]}})
             for n in names}
    return Context(cluster, hosts)


def test_5000_hosts_extravars_do_not_reach_the_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ansible_runner
    from ansible_runner.config.runner import RunnerConfig

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path))
    ctx = _ctx()
    plans = {n: HostPlan(hosts=True, env="X=1\n" * 10) for n in ctx.cluster.names}
    seen: dict[str, Any] = {}

    def fake_run(**kw: Any) -> Any:
        rc = RunnerConfig(**{k: v for k, v in kw.items() if k in (
            "private_data_dir", "project_dir", "playbook", "inventory", "limit", "forks", "cmdline", "envvars",
            "suppress_env_files", "extravars", "verbosity", "tags")})
        rc.prepare()
        seen["command"] = rc.command
        raise KeyboardInterrupt  # stop here: nothing runs

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    with pytest.raises(DdpfixError):  # the KeyboardInterrupt, reported as an interrupted run
        run_remediation(ctx, plans, apply=False, limit=None, forks=None, verbosity=0, progress=None)
    cmd = seen["command"]
    assert max(len(a) for a in cmd) < 4096 and sum(len(a) for a in cmd) < 16384, [a[:80] for a in cmd]
    at = [a for a in cmd if a.startswith("@")]
    assert at and Path(at[0][1:]).stat().st_size > 128 * 1024  # the plan itself is big: it went to the file
