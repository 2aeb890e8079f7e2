"""Saved facts: one audit's node facts kept in a directory (`ddpfix audit --facts-out DIR`), and the cluster's
analysis from several such directories without contacting a node (`ddpfix audit --facts-in DIR ...`).

The CLI's form of the playbooks' sliced fact-cache pattern (docs/awx.md): a fleet past one controller's reach is
audited in `--limit` batches (on one controller, one after another, or on several controllers at once), each batch
saving what it read; one analysis then reads every batch and makes the cross-node checks over the whole inventory's
cluster, in every --format, with --skip and the exit codes. What a batch saves per node is what the analysis of a
live run reads (`rules.context.HostFacts`): the facts, the probe result, the controller's clock window around the
facts task (the clock skew check), reachability and the error.

Probes need both ends at once: a batch's nodes dial only nodes of the same batch (the probe plan takes the play's
hosts), so the merged probe findings are those of pairs within a batch, never a false block across batches.

A saved file is node data, so hostile input, and the directory may hold anything: a file is read only when it is a
regular file (no link followed) of at most MAX_FILE_BYTES, a `ddpfix.facts/v1` document whose envelope is well
formed; the facts it carries are then guarded exactly as live facts (`rules.context.Context`: the fact guards).
A file of a host the inventory does not name is ignored with a note; a node whose newest file is older than the age
bound (or dated in the future) is *not read*, never a pass, as is a node no directory has a file for.
"""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote

from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.factguard.grammar import one_line
from ddpfix.model.cluster import Cluster
from ddpfix.model.facts import NodeFacts, ProbeResult
from ddpfix.rules.context import HostFacts
from ddpfix.safefile import write_atomic

SCHEMA = "ddpfix.facts/v1"
SUFFIX = ".facts.json"
#: A saved node's file at most (its firewall rulesets are the bulk of a node's facts; the module's own output bound)
MAX_FILE_BYTES = 16 * 1024 * 1024
#: Bytes read from all --facts-in directories at most (memory: each node's newest facts are kept until analysed);
#: past it, the rest are not read (those nodes: not read, with a note)
MAX_TOTAL_BYTES = 4 * 1024 * 1024 * 1024
#: Files read from one directory at most (a fleet's nodes, with room for stale ones); past it: invalid input
MAX_FILES = 100_000
#: How old saved facts may be by default (`--facts-max-age`), seconds: a batch run an hour ago no longer describes
#: the node (the playbook pattern's bound is the fact cache's timeout)
DEFAULT_MAX_AGE_S = 3600.0
#: A file dated this far past the controller's clock now is not read (clocks of two controllers may differ a little)
FUTURE_SLACK_S = 300.0
#: The error of a node no --facts-in directory has a file for
NOT_SAVED = "no saved facts: no --facts-in directory has this node (not in any batch, or its batch did not save)"


def file_name(host: str) -> str:
    """The file of `host` in a facts directory: the inventory name, percent-quoted (no `/`, no leading dot)."""
    q = quote(host, safe="")
    return ("%2E" + q[1:] if q.startswith(".") else q) + SUFFIX


def _host_of(name: str) -> str | None:
    return unquote(name[: -len(SUFFIX)]) if name.endswith(SUFFIX) and not name.startswith(".") else None


def controller_id() -> str:
    """The controller whose clock measured the facts tasks' windows (the skew check compares offsets within one)."""
    return one_line(socket.gethostname(), 253)


# --------------------------------------------------------------------------------------------------------------- save


def prepare(directory: str | os.PathLike[str]) -> Path:
    """`directory` made (0700) when missing and checked writable: `--facts-out` is refused before anything runs."""
    d = Path(directory).expanduser()
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise DdpfixError(f"--facts-out {d}: cannot create the directory: {exc.strerror}", ExitCode.INVALID_INPUT) \
            from exc
    if not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
        raise DdpfixError(f"--facts-out {d}: not a writable directory", ExitCode.INVALID_INPUT)
    return d


def save_facts(directory: str | os.PathLike[str], hosts: Mapping[str, HostFacts], *, run_id: str,
               inventory: Sequence[str] = (), limit: str | None = None, now: float | None = None) -> list[Path]:
    """Write one file per node of `hosts` (this run's nodes: every node the run matched, unreachable ones too)
    into `directory` (made 0700 when missing), each atomically (`safefile.write_atomic`, 0600). -> the files."""
    d = prepare(directory)
    run = {"id": run_id, "saved_at": round(time.time() if now is None else now, 3), "controller": controller_id(),
           "inventory": list(inventory), "limit": limit}
    out = []
    for name, h in sorted(hosts.items()):
        doc = {"schema": SCHEMA, "host": name, "run": run, "reachable": h.reachable, "failed": h.failed,
               "error": h.error, "collected_at": h.collected_at, "window": list(h.window) if h.window else None,
               "node": h.node, "probe": h.probe}
        try:
            out.append(write_atomic(d / file_name(name), json.dumps(doc, sort_keys=True, default=str), mode=0o600))
        except OSError as exc:
            raise DdpfixError(f"--facts-out {d}: cannot write {name}'s facts: {exc.strerror}",
                              ExitCode.INVALID_INPUT) from exc
    return out


# --------------------------------------------------------------------------------------------------------------- load


@dataclass
class Saved:
    """What the --facts-in directories gave: every inventory node's HostFacts (not read where nothing valid was
    saved), the batches (runs) read, and notes on what was ignored or not read."""

    hosts: dict[str, HostFacts]
    runs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def doc(self, dirs: Sequence[str], max_age: float) -> dict[str, Any]:
        """The report's `facts_in` part."""
        return {"dirs": list(dirs), "max_age_s": max_age, "runs": self.runs, "notes": self.notes}


@dataclass
class _File:
    host: str
    path: Path
    run: dict[str, Any]
    saved_at: float
    data: Mapping[str, Any]


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _read(path: Path, budget: int = MAX_FILE_BYTES) -> tuple[Mapping[str, Any], int]:
    """The JSON object in `path` and its size: a regular file, never through a link, at most MAX_FILE_BYTES and at
    most `budget` bytes. ValueError: why not."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ValueError(f"cannot open: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{st.st_size} bytes, past the {MAX_FILE_BYTES} bytes a node's facts may take")
        if st.st_size > budget:
            raise ValueError(f"not read: the {MAX_TOTAL_BYTES} bytes read from all --facts-in directories are spent")
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > min(MAX_FILE_BYTES, budget):
        raise ValueError(f"past the {MAX_FILE_BYTES} bytes a node's facts may take, or the bytes left to read")
    try:
        data = json.loads(raw.decode("utf-8"))  # NaN/Infinity as a live run's JSON has them: the guards judge them
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON ({one_line(str(exc), 120)})") from exc
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data, len(raw)


def _envelope(data: Mapping[str, Any], host: str) -> tuple[dict[str, Any], float]:
    """The file's run and its time, when the document is a ddpfix.facts/v1 of `host`. ValueError: why not."""
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document")
    if data.get("host") != host:
        raise ValueError(f"names host {one_line(str(data.get('host')), 80)!r}, not the file's {one_line(host, 80)!r}")
    run = data.get("run")
    saved_at = _num(run.get("saved_at")) if isinstance(run, Mapping) else None
    if not isinstance(run, Mapping) or saved_at is None:
        raise ValueError("no run time (run.saved_at)")
    for key, kind in (("reachable", bool), ("failed", bool), ("error", str), ("node", (dict, type(None))),
                      ("probe", (dict, type(None)))):
        if not isinstance(data.get(key), kind):
            raise ValueError(f"{key}: not a {kind.__name__ if isinstance(kind, type) else 'mapping or null'}")
    return {"id": one_line(str(run.get("id") or "?"), 120), "saved_at": saved_at,
            "controller": one_line(str(run.get("controller") or "?"), 253),
            "limit": one_line(str(run["limit"]), 400) if run.get("limit") else None}, saved_at


def _files(directory: Path, notes: list[str]) -> Iterable[tuple[str, Path]]:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise DdpfixError(f"--facts-in {directory}: cannot read the directory: {exc.strerror}",
                          ExitCode.INVALID_INPUT) from exc
    if len(entries) > MAX_FILES:
        raise DdpfixError(f"--facts-in {directory}: {len(entries)} entries, past the {MAX_FILES} read",
                          ExitCode.INVALID_INPUT)
    for e in entries:
        host = _host_of(e.name)
        if host is None:
            if not e.name.startswith(".") and e.name.endswith(".json"):
                notes.append(f"{directory / e.name}: ignored: not a saved facts file (*{SUFFIX})")
            continue
        yield host, Path(e.path)


def load_facts(dirs: Sequence[str | os.PathLike[str]], cluster: Cluster, *, max_age: float = DEFAULT_MAX_AGE_S,
               now: float | None = None) -> Saved:
    """Every node of `cluster` from the files in `dirs`: the newest valid file of each node, read as its HostFacts
    (guarded later, as live facts, by the Context); not read (unreachable, with why) when it has none, or its newest
    is older than `max_age` seconds or dated in the future. Files of hosts outside the inventory are ignored."""
    now = time.time() if now is None else now
    names = set(cluster.names)
    notes: list[str] = []
    best: dict[str, _File] = {}
    budget = MAX_TOTAL_BYTES
    for raw_dir in dirs:
        d = Path(raw_dir).expanduser()
        if not d.is_dir():
            raise DdpfixError(f"--facts-in {d}: not a directory", ExitCode.INVALID_INPUT)
        for host, path in _files(d, notes):
            if host not in names:
                notes.append(f"{path}: ignored: host {one_line(host, 120)!r} is not in the inventory")
                continue
            try:
                data, size = _read(path, budget)
                budget -= size
                run, saved_at = _envelope(data, host)
            except ValueError as exc:
                notes.append(f"{path}: ignored: {exc}")
                continue
            f = _File(host, path, run, saved_at, data)
            old = best.get(host)
            if old is not None:
                newer, older = (f, old) if saved_at > old.saved_at else (old, f)
                notes.append(f"{host}: saved twice ({older.path}, {newer.path}): the newer, run "
                             f"{newer.run['id']}, is read")
                f = newer
            best[host] = f
    hosts: dict[str, HostFacts] = {}
    runs: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        got = best.get(node.name)
        if got is None:
            hosts[node.name] = HostFacts(node.name, reachable=False, error=NOT_SAVED)
            continue
        f = got
        age = now - f.saved_at
        if age > max_age or age < -FUTURE_SLACK_S:
            why = (f"saved facts are {age:.0f} s old, past the {max_age:.0f} s --facts-max-age" if age > 0 else
                   f"saved facts are dated {-age:.0f} s in the future (the saving controller's clock)")
            hosts[node.name] = HostFacts(node.name, reachable=False, error=f"not read: {why} ({f.path})")
            notes.append(f"{node.name}: not read: {why}")
            continue
        hosts[node.name] = _host_facts(node.name, f)
        r = runs.setdefault(f.run["id"] + "\0" + f.run["controller"], {**f.run, "hosts": []})
        r["hosts"].append(node.name)
    notes += coverage_notes(cluster, hosts)
    return Saved(hosts, sorted(runs.values(), key=lambda r: (r["saved_at"], r["id"])), notes)


def coverage_notes(cluster: Cluster, hosts: Mapping[str, HostFacts]) -> list[str]:
    """What the batches' probes did not look at, said (a probe never run reads as no finding, so it is named):
    the read nodes that never dialled the master port, their batch not holding the master; clocks read by
    different controllers, which the skew check does not compare."""
    out = []
    clocks = sorted({h.clock for h in hosts.values() if h.reachable})
    if len(clocks) > 1:
        out.append(f"clock skew compared among the nodes of each controller only ({', '.join(clocks)}): offsets "
                   "measured by different controllers' clocks are not compared; run every batch from one "
                   "controller to compare all (docs/fleet.md)")
    read = [n for n in cluster.names if (h := hosts.get(n)) is not None and h.reachable and n != cluster.master]
    probed = [n for n in read if any(isinstance(c, Mapping) and c.get("kind") == "master"
                                     for c in ((hosts[n].probe or {}).get("connects") or []))]
    if read and len(probed) < len(read) and any(hosts[n].probe for n in read):
        out.append(f"the master port was probed from {len(probed)} of the {len(read)} other nodes read: only batches "
                   f"that held the master ({cluster.master}) dial it; put it in every batch, run one after another, "
                   "to probe it from all (docs/fleet.md)")
    return out


def _host_facts(name: str, f: _File) -> HostFacts:
    d = f.data
    win = d.get("window")
    window = None
    if isinstance(win, list) and len(win) == 2:
        lo, hi = _num(win[0]), _num(win[1])
        window = (lo, hi) if lo is not None and hi is not None and lo <= hi else None
    node = d.get("node")
    reachable = bool(d.get("reachable")) and node is not None
    return HostFacts(
        name=name,
        reachable=reachable,
        error=one_line(str(d.get("error") or ""), 400) if not reachable else "",
        failed=bool(d.get("failed")) and not reachable,
        node=cast(NodeFacts, dict(node)) if reachable and node is not None else None,
        probe=cast(ProbeResult, dict(d["probe"])) if reachable and d.get("probe") is not None else None,
        collected_at=_num(d.get("collected_at")),
        window=window,
        clock=f.run["controller"],
    )
