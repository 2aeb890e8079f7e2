"""Fabric cases on a running lab: apply_fabric switches a lab brought up with `clean` or a fabric scenario to another
fabric scenario in place.

Every fabric scenario differs from `clean` only in what apply_fabric can redo in place: the synthetic tree and
stand-ins under the nodes' /run/ddpfix-lab-fabric, files in the nodes' /etc (the env file, memlock-low's PAM and
limits.d files) and inventory variables. So the lab tests bring up one lab and switch it from case to case.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ddpfix import lab
from ddpfix.errors import ExitCode
from ddpfix.lab.model import ENV_PATH, LabError, LabPlan, NodePlan
from ddpfix.lab.scenarios.fabric import FABRIC_RUN

if TYPE_CHECKING:
    from ddpfix.lab.model import LabInfo

FABRIC_APPLIED = "fabric-applied.json"  # in the lab's state dir: what the last apply_fabric changed, to undo it
_SESSION_ETC = ("ssh/", "security/", "pam.d/")  # /etc files sshd reads per login: restart sshd when they change


class _InPlace:
    """The part of the lab's Runtime that fabric tasks use (node_dir, write_run), for a lab that is already up."""

    def __init__(self, sdir: Path) -> None:
        self.sdir = sdir

    def node_dir(self, node: NodePlan) -> Path:
        return self.sdir / "nodes" / node.name

    def write_run(self, node: NodePlan, rel: str, text: str, mode: int = 0o644) -> None:
        _replace_file(self.node_dir(node) / "run" / rel, text, mode)


def _replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


def _etc_files(node: NodePlan) -> dict[str, str]:
    """What the plan writes into the node's /etc copy besides the base image (as `up` does: env file, then files)."""
    files: dict[str, str] = {}
    if node.env is not None:  # as `up` writes it (ddpfix.lab: env_text)
        files[ENV_PATH.removeprefix("/etc/")] = "# written by hand, long ago (ddpfix lab scenario)\n" + "".join(
            f"{k}={v}\n" for k, v in node.env.items()
        )
    files.update(node.files)
    return files


def fabric_plan(name: str, nodes: int, scenario_name: str, subnet: str, ifnames: list[str]) -> LabPlan:
    """The plan of `scenario_name` (clean or fabric-*) for a lab; LabError when it differs from the clean plan in
    more than apply_fabric redoes in place (host/group vars, env file, /etc files, /run tasks)."""

    if scenario_name != "clean" and not scenario_name.startswith("fabric-"):
        raise LabError(f"apply_fabric: {scenario_name!r} is not a fabric scenario", ExitCode.INVALID_INPUT)
    plan = lab.plan_lab(name, nodes, scenario_name, subnet, ifnames)
    base = lab.plan_lab(name, nodes, "clean", subnet, ifnames)

    def rest(p: LabPlan) -> tuple[LabPlan, list[NodePlan]]:
        return (
            replace(p, nodes=[], scenarios=[], groupvars={}),
            [replace(n, hostvars={}, env=None, files={}, tasks=[]) for n in p.nodes],
        )

    if rest(plan) != rest(base):
        raise LabError(
            f"apply_fabric: {scenario_name} changes more than files and variables; bring up a lab with it",
            ExitCode.INVALID_INPUT,
        )
    return plan


def apply_fabric(info: LabInfo, scenario_name: str) -> None:
    """Switch a running lab, brought up with `clean` or a fabric scenario, to fabric scenario `scenario_name` (or
    back to `clean`) in place, as if `lab up` had built it with that scenario alone.

    The scenario is planned for the lab's nodes; a scenario that changes anything besides host/group vars, env
    files, /etc files and /run tasks is refused (LabError). On every node the tree under /run/ddpfix-lab-fabric is
    rewritten, /etc files a previous apply wrote are restored and the new ones written (sshd restarted where a
    file it reads at login changed, which also ends the controller's persistent connections there), and the
    inventory's host and group variables are replaced. The lab's state still names its first scenario."""

    ifnames = [n.ifname for n in info.nodes]
    for name in info.scenarios:
        if name != "clean" and not name.startswith("fabric-"):
            raise LabError(
                f"apply_fabric: lab {info.name} was brought up with {name}, not a fabric scenario",
                ExitCode.INVALID_INPUT,
            )
    plan = fabric_plan(info.name, len(info.nodes), scenario_name, info.subnet, ifnames)
    sdir = lab.state_dir(info.name)
    record_path = sdir / FABRIC_APPLIED
    if record_path.exists():
        prev = json.loads(record_path.read_text())
    else:  # what `up` wrote for the lab's own scenarios (the /etc files were not in the image)
        first = lab.plan_lab(info.name, len(info.nodes), info.scenarios, info.subnet, ifnames)
        prev = {
            "hostvars": {n.name: sorted(n.hostvars) for n in first.nodes},
            "groupvars": sorted(first.groupvars),
            "etc": {n.name: dict.fromkeys(_etc_files(n)) for n in first.nodes},
        }
    rt = _InPlace(sdir)
    record: dict[str, Any] = {"scenario": scenario_name, "hostvars": {}, "groupvars": sorted(plan.groupvars), "etc": {}}
    restart: list[str] = []
    for n in plan.nodes:
        etc = rt.node_dir(n) / "etc"
        originals: dict[str, str | None] = prev["etc"].get(n.name, {})
        wanted = _etc_files(n)
        rels = sorted(set(originals) | set(wanted))
        before = {rel: _read(etc / rel) for rel in rels}
        for rel, text in originals.items():  # undo the previous case
            if text is None:
                (etc / rel).unlink(missing_ok=True)
            else:
                _replace_file(etc / rel, text)
        record["etc"][n.name] = {rel: _read(etc / rel) for rel in wanted}
        for rel, text in wanted.items():
            _replace_file(etc / rel, text)
        if any(rel.startswith(_SESSION_ETC) and _read(etc / rel) != before[rel] for rel in rels):
            restart.append(n.name)
        shutil.rmtree(rt.node_dir(n) / "run" / FABRIC_RUN, ignore_errors=True)
        for task in n.tasks:
            task(rt, n)  # type: ignore[arg-type]  # fabric tasks use node_dir and write_run only
        record["hostvars"][n.name] = sorted(n.hostvars)
    _rewrite_inventory_vars(info.inventory, plan, prev)
    for name in restart:
        lab.stop_sshd(info.name, name)
        lab.start_sshd(info.name, name)
    record_path.write_text(json.dumps(record, indent=2))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _rewrite_inventory_vars(path: Path, plan: LabPlan, prev: dict[str, Any]) -> None:
    """Replace the variables a previous apply_fabric set with the plan's, keeping the header `lab down` checks."""

    text = path.read_text()
    lines = text.splitlines(keepends=True)
    header = "".join(ln for ln in lines[: next(i for i, ln in enumerate(lines) if not ln.startswith("#"))])
    doc = yaml.safe_load(text)
    group = doc["all"]["children"]["ddp_nodes"]
    for key in prev["groupvars"]:
        group["vars"].pop(key, None)
    group["vars"].update(plan.groupvars)
    for n in plan.nodes:
        host = group["hosts"][n.name]
        for key in prev["hostvars"].get(n.name, []):
            host.pop(key, None)
        host.update(n.hostvars)
    tmp = path.with_suffix(".yml.tmp")
    tmp.write_text(header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    tmp.replace(path)
