"""The launch-path readers (plugins/module_utils/ddpfix_hostenv.py): torch's build from ddp_python (one start,
cached by the interpreter's path and mtime and torch's version.py), ARP sysctls, the open-file limit."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

from unit_helpers import FIXTURES, load_role_module

from ddpfix.rules import net as net_rules
from ddpfix.rules.host import nofile_fix, nofile_needed


def hostenv() -> ModuleType:
    return load_role_module("module_utils/ddpfix_hostenv.py", "ddpfix_hostenv")


def fake_torch(tmp_path: Path, version: str = "2.4.1+cu121", cuda: str | None = "12.1") -> Path:
    """A venv-like interpreter: a wrapper of this Python whose sys.path holds a torch package with only version.py
    (what the reader parses; nothing of torch runs, and CUDA's NCCL import then fails and is left out)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('a CPU-only stand-in: no torch._C')\n")
    (site / "torch" / "version.py").write_text(
        f"from typing import Optional\n__version__ = '{version}'\ncuda: Optional[str] = {cuda!r}\nhip = None\n")
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def test_torch_read_once_then_cached_until_reinstalled(tmp_path: Path) -> None:
    h = hostenv()
    exe = fake_torch(tmp_path)
    cache = tmp_path / "cache"
    info, why = h.torch_info(str(exe), str(cache))
    assert why is None and info["version"] == "2.4.1+cu121" and info["cuda"] == "12.1" and not info["cached"]
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    again, _ = h.torch_info(str(exe), str(cache))
    assert again["cached"] and again["version"] == "2.4.1+cu121"
    vf = tmp_path / "site" / "torch" / "version.py"  # pip install rewrites version.py: read again
    vf.write_text("__version__ = '2.5.0+cu124'\ncuda = '12.4'\n")
    os.utime(vf, ns=(1, 1))
    fresh, _ = h.torch_info(str(exe), str(cache))
    assert not fresh["cached"] and fresh["version"] == "2.5.0+cu124"


def test_torch_absent_cached_until_a_directory_of_the_import_path_changes(tmp_path: Path) -> None:
    h = hostenv()
    site, torch_dir = tmp_path / "site", tmp_path / "site" / "torch"
    site.mkdir()
    exe = tmp_path / "python"  # -S: none of this Python's site-packages (which may hold torch); the site on PYTHONPATH
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    exe.chmod(0o755)
    cache = tmp_path / "cache"
    info, why = h.torch_info(str(exe), str(cache))
    assert info["version"] is None and why and "torch is not installed" in why and not info["cached"]
    again, why_again = h.torch_info(str(exe), str(cache))
    assert again["cached"] and again["version"] is None and why_again == why  # no interpreter started
    (torch_dir).mkdir()  # torch installed meanwhile: the site directory changed, read afresh
    (torch_dir / "__init__.py").write_text("")
    (torch_dir / "version.py").write_text("__version__ = '2.4.1+cu121'\ncuda = '12.1'\n")
    fresh, why_fresh = h.torch_info(str(exe), str(cache))
    assert not fresh["cached"] and fresh["version"] == "2.4.1+cu121" and why_fresh is None


def test_an_argv_runs_as_a_container_runtime_would_never_cached(tmp_path: Path) -> None:
    """ddp_python as a list: a stand-in runtime `ctr run --rm IMAGE python3 -c CODE` that execs the image's Python
    (one with torch) with the words after the image; started without a shell, every audit (the image's import path
    is not this host's: no cache)."""
    h = hostenv()
    exe = fake_torch(tmp_path)
    log = tmp_path / "ctr.log"
    ctr = tmp_path / "ctr"
    ctr.write_text(f"#!/bin/sh\necho \"$1 $2 $3 $4 $5\" >> {log}\n[ \"$1 $2 $3\" = 'run --rm IMAGE' ] || exit 125\n"
                   f"shift 4\nexec {exe} \"$@\"\n")
    ctr.chmod(0o755)
    argv = [str(ctr), "run", "--rm", "IMAGE", "python3"]
    cache = tmp_path / "cache"
    for _ in range(2):
        info, why = h.torch_info(argv, str(cache))
        assert why is None and info["version"] == "2.4.1+cu121" and not info["cached"] and info["python"] == argv
    assert len(log.read_text().splitlines()) == 2 and not list(cache.glob("*.json"))
    info, why = h.torch_info([str(ctr), "run", "--rm", "OTHER", "python3"], None)
    assert why and why.startswith(f"{ctr} run --rm OTHER python3: rc=125") and info["absent"] is False
    info, why = h.torch_info(["no-such-runtime-xyz", "run", "IMAGE", "python3"], None)
    assert why == "no-such-runtime-xyz: no such command on this node"
    assert h.python_argv(["a", 1]) is None and h.python_argv("python3") == ["python3"] and h.python_argv([]) is None


def test_a_tampered_or_foreign_cache_is_not_used(tmp_path: Path) -> None:
    h = hostenv()
    exe = fake_torch(tmp_path)
    cache = tmp_path / "cache"
    h.torch_info(str(exe), str(cache))
    (entry,) = cache.iterdir()
    entry.write_text('{"key": ["/other"], "result": {"version": "9.9"}}')
    info, _ = h.torch_info(str(exe), str(cache))
    assert info["version"] == "2.4.1+cu121" and not info["cached"]
    cache.chmod(0o777)  # writable by others: no cache (read afresh, nothing written)
    info, _ = h.torch_info(str(exe), str(cache))
    assert not info["cached"]


def test_missing_interpreter_and_missing_torch_are_reasons_never_versions(tmp_path: Path) -> None:
    h = hostenv()
    info, why = h.torch_info(str(tmp_path / "nope"), str(tmp_path / "c"))
    assert info["version"] is None and why == f"{tmp_path / 'nope'}: no such interpreter on this node"
    bare = tmp_path / "bare"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I \"$@\"\n")  # -I: no site-packages, no PYTHONPATH
    bare.chmod(0o755)
    if os.system(f"{bare} -c 'import torch' 2>/dev/null") != 0:
        info, why = h.torch_info(str(bare), None)
        assert info["version"] is None and why and "torch is not installed" in why and info["absent"] is True
    junk = tmp_path / "junk"
    junk.write_text("#!/bin/sh\necho 2.18.1\n")  # a stand-in that prints something else
    junk.chmod(0o755)
    info, why = h.torch_info(str(junk), None)
    assert info["version"] is None and why and "printed no torch version" in why and info["absent"] is False
    assert h.torch_info(None)[1] == "no interpreter given (ddp_python)"


def test_arp_sysctls_read_all_and_each_interface(tmp_path: Path) -> None:
    h = hostenv()
    for conf, (ig, an) in {"all": (0, 0), "eth0": (1, 2)}.items():
        d = tmp_path / "sys" / "net" / "ipv4" / "conf" / conf
        d.mkdir(parents=True)
        (d / "arp_ignore").write_text(f"{ig}\n")
        (d / "arp_announce").write_text(f"{an}\n")
    got, why = h.arp_sysctls(["eth0", "ib0"], proc_root=str(tmp_path))  # ib0: no IPv4 configuration, left out
    assert why is None and got == {"all": {"arp_ignore": 0, "arp_announce": 0},
                                   "eth0": {"arp_ignore": 1, "arp_announce": 2}}
    (tmp_path / "sys/net/ipv4/conf/eth0/arp_ignore").write_text("x\n")
    _, why = h.arp_sysctls(["eth0"], proc_root=str(tmp_path))
    assert why and "is not a number" in why


def test_nofile_rule_and_fix_value() -> None:
    assert nofile_needed(3) == 896 and nofile_needed(4) > 1024  # 1024 breaks NCCL's bootstrap from 4 nodes on
    assert nofile_fix(896, 524288) == (65536, 0)  # within the hard limit: the soft limit only
    assert nofile_fix(896, 20000) == (20000, 0)
    assert nofile_fix(896, -1) == (65536, 0)
    assert nofile_fix(5000, 4096) == (65536, 65536)  # a hard limit below the need is raised too
    assert hostenv().nofile_limit()["soft"] != 0


def test_hostile_launch_path_facts_are_reported_and_dropped() -> None:
    from ddpfix.factguard.facts import guard_facts

    problems, clean = guard_facts({
        "limits": {"nofile": {"soft": True, "hard": 1, "source": "x"},
                   "nofile_units": {"a;reboot.service": {"soft": 1, "hard": 1}, "ok.service": {"soft": 9, "hard": 9}}},
        "sysctl": {"arp": {"all": {"arp_ignore": 0, "arp_announce": 0}, "eth0;id": {"arp_ignore": 0, "arp_announce": 0},
                           "eth1": {"arp_ignore": 9, "arp_announce": 0}}},
        "torch": {"python": "/opt/py $(id)", "version": "2.5.1+cu124", "cuda": "12.4\n", "nccl": "2.21.5"},
    })
    fields = {p[0] for p in problems}
    assert {"limits.nofile.soft", "limits.nofile_units", "sysctl.arp", "sysctl.arp[eth1].arp_ignore", "torch.python",
            "torch.cuda"} <= fields, fields
    assert clean["limits"] == {"nofile": None, "nofile_units": {"ok.service": {"soft": 9, "hard": 9}}}
    assert clean["sysctl"]["arp"] == {"all": {"arp_ignore": 0, "arp_announce": 0}}
    assert clean["torch"]["python"] is None and clean["torch"]["version"] is None  # compared whole: not compared


def test_remediate_plan_takes_the_values_the_checks_reported() -> None:
    import json

    from unit_helpers import Sim

    from ddpfix.remediate import build_plan
    from ddpfix.rules.engine import run_checks

    sim = Sim()
    fixture = json.loads((FIXTURES / "rules" / f"{net_rules.ARP_FLUX.id}.json").read_text())["fail"][0]
    sim.node("node3")["sysctl"]["arp"] = fixture["merge"]["node2"]["node"]["sysctl"]["arp"]
    sim.node("node3")["interfaces"] += [dict(fixture["append"]["node2"]["node"]["interfaces"][0], addrs=[
        {"family": "inet", "local": "192.168.77.113", "prefixlen": 32}])]
    sim.node("node2")["limits"] = {"nofile": {"soft": 512, "hard": 4096, "source": "ssh session"}, "nofile_units": {}}
    ctx = sim.context()
    plans, _ = build_plan(ctx, run_checks(ctx))
    assert plans["node2"].nofile == {"soft": "4096", "hard": "0", "unit_hard": "4096"} and not plans["node2"].arp
    assert plans["node3"].arp == ["arp0", "eth0"] and not plans["node3"].nofile
    assert plans["node3"].to_vars()["arp"] == ["arp0", "eth0"]
    only, _ = build_plan(ctx, run_checks(ctx), only={net_rules.ARP_FLUX.id})
    assert not only["node2"].nofile and only["node3"].arp
