"""Matching a log against the failure table (`diagnose.patterns.PATTERNS`): `diagnose`, the cause line `verify`
gives a failed launch, the README's generated list and what a log says against the inventory."""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ddpfix.diagnose.bounded import MAX_LINE, for_matching, shown
from ddpfix.diagnose.events import (
    CONSEQUENCE,
    CONSEQUENCE_ANCHORS,
    CONSEQUENCE_KEYS,
    JOB_ANCHORS,
    event,
    is_job_failure,
)
from ddpfix.diagnose.hosts import HostFacts, read_hosts, versions_line
from ddpfix.diagnose.model import Diagnosis, Explanation, LogFacts, Pattern
from ddpfix.diagnose.narrow import narrow
from ddpfix.diagnose.patterns import PATTERNS, VERSIONS_DIFFER

FALLBACK_ADVICE = ("No known failure recognised. Run the job with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL "
                   "and TORCH_CPP_LOG_LEVEL=INFO, and audit the nodes: ddpfix audit -i INV.")

#: a line of distributed communication: c10d, Gloo, NCCL, the store, torchrun/elastic, a torch.distributed frame
DIST_CONTEXT = re.compile(
    r"c10d|[Gg]loo|NCCL|TCPStore|ProcessGroup|torch[./]distributed|torchrun|elastic|init_process_group|"
    r"[Rr]endezvous|DistNetworkError|DistStoreError|DistBackendError|MASTER_ADDR|socket\.cpp|pair\.cc|"
    r"(?:server|client) socket has failed|network addresses? of \(")
#: a download / HTTP client / package manager / web server line: a reset or an EMFILE near it is not a DDP failure
FOREIGN_CONTEXT = re.compile(
    r"urllib3|requests[./]|huggingface_hub|hf_hub_download|HfHubHTTPError|pip[./]_internal|Downloading|aiohttp|"
    r"http[./]client|botocore|fsspec|ConnectionError\(|MaxRetryError|ReadTimeoutError|wandb|"
    r"uvicorn|gunicorn|HTTP/1\.[01]\"|socket\.accept\(\) out of system resource|Could not install packages")
_WINDOW_BEFORE, _WINDOW_AFTER = 8, 3
#: what a healthy job prints at NCCL init: not a distributed context for a line next to it
_CHATTER = re.compile(r"NCCL (?:INFO|version)")


_RANK = re.compile(r"\[[Rr]ank ?(\d{1,6})\]")
_NCCL_VERSION = re.compile(r"NCCL version:? ?(\d+\.\d+\.\d+)")


def log_facts(lines: Iterable[str]) -> LogFacts:
    text = "\n".join(lines)
    ranks = sorted({int(r) for r in _RANK.findall(text)})
    versions = sorted(set(_NCCL_VERSION.findall(text)))
    return LogFacts(tuple(ranks), tuple(versions))


def _compile(scope: str) -> list[tuple[Pattern, list[re.Pattern[str]]]]:
    return [(p, p.compiled()) for p in PATTERNS if p.scope == "all" or scope == "verify"]


_COMPILED = {"all": _compile("all"), "verify": _compile("verify")}
#: Literal strings one of which every line a regex above can match contains: only lines holding one are tried
#: (str.find over the whole log: a log of several MB in well under a second). A regex added to the table needs
#: its anchor here; the corpus tests fail otherwise.
ANCHORS: tuple[str, ...] = (
    "127.", "::1", "Unable to find address", "no socket interface", "NCCL_SOCKET_IFNAME", "No usable listening",
    "AF_INET", "NET/Socket", "Bootstrap", "EADDRINUSE", "ddress already in use", "errno: 9", "ddress family",
    "EAFNOSUPPORT",
    "trying to connect", "connect/validate", "any network address", "errno: 11", "C10d store", "onnection refused",
    "waiting for clients", "ncclUniqueId", "connectFullMesh", "willRetry", "pair.cc", "Connect to",
    "Call to connect", "socketStartConnect", "same subnet as remote", "onnection reset", "onnection closed",
    "Socket Timeout", "ECONNRESET",
    "endezvous", "DistStoreError", "orld size", "out of range", ">= world_size", "Invalid rank", "ibv_", "NET/IB",
    "NET/OFI", "aws-ofi-nccl", "Watchdog caught", "last completed", "network addresses", "Name or service",
    "name resolution", "host not found", "getaddrinfo", "ECONNREFUSED", "o route to host", "EHOSTUNREACH",
    "onnection timed out", "ETIMEDOUT", "failed to run command", "No module named", "ddp.env", "Got completion",
    "o such device", "/dev/shm", "insufficient shared memory", "oo many open files", "EMFILE", "errno: 24",
    "errno: 10", "errno: 22", "errno: 1 ", "errno: 13", "Original timeout", "store based barrier", "Stop_waiting",
    "expected, but not set", "operation to complete", "unhandled system error", "ncclSystemError",
    "remote process exited", "ncclRemoteError",
)


def _candidates(text: str, starts: list[int], anchors: Iterable[str] = ANCHORS) -> dict[int, set[str]]:
    """The lines (by index; a line starts at `starts`) that hold an anchor, each with the anchors it holds."""
    out: dict[int, set[str]] = {}
    end = len(text)
    for a in anchors:
        i = text.find(a)
        while i != -1:
            ln = bisect.bisect_right(starts, i) - 1
            out.setdefault(ln, set()).add(a)
            i = text.find(a, starts[ln + 1] if ln + 1 < len(starts) else end)
    return dict(sorted(out.items()))


def regex_anchors(rx: str) -> frozenset[str]:
    """The anchors written in a regex (its escapes undone): a line holding none of them is not tried against it.
    Empty: the regex is tried on every candidate line. A unit test checks, on every corpus line a regex matches,
    that the line holds one of its anchors."""
    plain = re.sub(r"\\(.)", r"\1", rx)
    return frozenset(a for a in ANCHORS if a in plain)


_RX_ANCHORS = {rx.pattern: regex_anchors(rx.pattern) for c in _COMPILED.values() for _, rxs in c for rx in rxs}


@functools.lru_cache(maxsize=4096)
def _plan(scope: str, held: frozenset[str]) -> list[tuple[Pattern, list[re.Pattern[str]]]]:
    """The patterns and regexes worth trying on a line that holds these anchors."""
    out = []
    for pat, regexes in _COMPILED[scope]:
        rxs = [rx for rx in regexes if not _RX_ANCHORS[rx.pattern] or _RX_ANCHORS[rx.pattern] & held]
        if rxs:
            out.append((pat, rxs))
    return out


def _window(lines: Sequence[str], i: int) -> Sequence[str]:
    return lines[max(0, i - _WINDOW_BEFORE):i + _WINDOW_AFTER + 1]


def _foreign_near(lines: Sequence[str], i: int) -> bool:
    """A download/HTTP client/package manager/web server line stands near line i."""
    return any(FOREIGN_CONTEXT.search(ln) for ln in _window(lines, i))


def _in_context(lines: Sequence[str], i: int) -> bool:
    """Line i is a distributed failure: it holds a distributed-communication marker itself, or one of the lines
    around it does (NCCL INFO and `NCCL version` lines do not count: a healthy job prints them at init), and no
    download/HTTP client line stands among them."""
    if _foreign_near(lines, i):
        return False
    if DIST_CONTEXT.search(lines[i]):
        return True
    return any(DIST_CONTEXT.search(ln) and not _CHATTER.search(ln) for ln in _window(lines, i))


def _counts_agree(pat: Pattern, m: re.Match[str]) -> bool:
    """The match's `joined` and `world` counts compare as the pattern's `joined` says (true without them)."""
    groups = m.groupdict()
    if not pat.joined or groups.get("joined") is None or groups.get("world") is None:
        return True
    joined, world = int(groups["joined"]), int(groups["world"])
    return joined < world if pat.joined == "fewer" else joined > world


def diagnose(lines: Iterable[str], scope: str = "all") -> list[Diagnosis]:
    """The known failures in the log that are causes, in pattern order, each with its first matching line (see
    `explain`: the job's own failure first names none; a consequence after a cause is not named)."""
    return explain(lines, scope).diagnoses


#: rows that report what NCCL chose at init, not a failure: they do not make a network failure come first
OBSERVATION_KEYS = frozenset({"nccl-ib-fallback", "nccl-virtual-interface"})
#: how many consequence lines an explanation lists (the count says how many there were)
MAX_CONSEQUENCES = 12


def _rows(text: list[str], raw: list[str], scope: str,
          only: set[int] | None = None) -> tuple[dict[str, Diagnosis], dict[int, str]]:
    """Every table row that matches, with its first line, and the row each matching line belongs to."""
    joined = "\n".join(text)
    starts = list(itertools.accumulate((len(ln) + 1 for ln in text[:-1]), initial=0))
    found: dict[str, Diagnosis] = {}
    at: dict[int, str] = {}
    for i, held in _candidates(joined, starts).items():
        if only is not None and i not in only:
            continue
        line = text[i]
        for pat, regexes in _plan(scope, frozenset(held)):
            for rx in regexes:
                m = rx.search(line)
                if not m or not _counts_agree(pat, m):
                    continue
                if pat.needs_context and scope == "all" and not _in_context(text, i):
                    break
                if pat.unless_foreign and scope == "all" and _foreign_near(text, i):
                    break
                at.setdefault(i, pat.key)
                d = found.get(pat.key)
                if d is None:
                    found[pat.key] = Diagnosis(pat, i + 1, shown(raw[i]), tuple(shown(g, 200) for g in m.groups() if g))
                else:
                    d.count += 1
                break
    for key in [k for k, d in found.items() if d.pattern.also]:
        also = re.compile(found[key].pattern.also or "")
        if not any(also.search(ln) for ln in text):
            del found[key]
    return found, at


#: a launcher's prefix on a line: `[rank3]:`, `[3]:`, Slurm's `3: `, pdsh/DeepSpeed's `node1: `
_PREFIX = re.compile(r"^(?:\[[Rr]ank ?\d{1,6}\]: ?|\[\d{1,6}\]: ?|\d{1,6}: |[\w.-]{1,64}: )")
#: a line a terminal or launcher wrapped ends mid-phrase, and its continuation starts with a lower-case word, a
#: digit or an opening bracket
_WRAP_END = re.compile(r"[\w,(\[-]$")
_WRAP_START = re.compile(r"^[a-z0-9(\[]")
#: lines re-joined into one at most (a 300-character message wrapped at 80 columns)
MAX_WRAPPED = 5


def _continuation(prev: str, line: str) -> str | None:
    """`line` without the launcher prefix `prev` has too, when it continues `prev` (hard-wrapped), else None."""
    if len(prev) < 60 or not _WRAP_END.search(prev):
        return None
    p = _PREFIX.match(prev)
    if p and line.startswith(p.group(0)):
        line = line[p.end():]
    return line if _WRAP_START.match(line) and not _PREFIX.match(line) else None


def _add_wrapped(found: dict[str, Diagnosis], at: dict[int, str], text: list[str], raw: list[str],
                 scope: str) -> None:
    """Hard-wrapped lines re-joined and matched again: the rows only a re-joined line shows are added (on its
    first line). Lines are re-joined only where a row did not already match."""
    joined_text, joined_raw, starts = list(text), list(raw), set()
    i = 0
    while i < len(text) - 1:
        j = i
        parts, raw_parts = [text[i]], [raw[i]]
        while j + 1 < len(text) and j - i < MAX_WRAPPED - 1 and (
                rest := _continuation(text[j], text[j + 1])) is not None:
            parts.append(rest)
            raw_parts.append(raw[j + 1].strip())
            j += 1
        if j > i and not any(k in at for k in range(i, j + 1)):
            starts.add(i)
            joined_text[i] = " ".join(parts)[:MAX_LINE]
            joined_raw[i] = " ".join(raw_parts)
            for k in range(i + 1, j + 1):
                joined_text[k] = joined_raw[k] = ""
        i = j + 1
    if not starts:
        return
    more, more_at = _rows(joined_text, joined_raw, scope, only=starts)
    for key, d in more.items():
        if key not in found:
            found[key] = d
    for i, key in more_at.items():
        at.setdefault(i, key)


def _echoes(found: dict[str, Diagnosis]) -> set[str]:
    """The rows another row explains: its `explains`, the generic rows next to a specific one, a consequence row
    after a cause, a connect failure to a name whose lookup failed before it."""
    out = {k for d in found.values() for k in d.pattern.explains}
    if any(not d.pattern.generic for d in found.values()):
        out |= {k for k, d in found.items() if d.pattern.generic}
    causes = [d.line_no for k, d in found.items() if k not in CONSEQUENCE_KEYS | OBSERVATION_KEYS | out]
    if causes:
        out |= {k for k, d in found.items() if k in CONSEQUENCE_KEYS and d.line_no > min(causes)}
    name, conn = found.get("unresolvable-name"), found.get("master-unreachable")
    if name and conn and name.line_no < conn.line_no and len(conn.detail) == 2 and name.detail[:1] == conn.detail[:1]:
        out.add("master-unreachable")  # "failed to connect to any network address of (NAME, port)": no errno
    return out


def _lines_matching(anchors: Iterable[str], joined: str, starts: list[int], lo: int, hi: int) -> list[int]:
    """The indexes of lines lo..hi-1 that hold one of these literal anchors, in order (str.find over the joined
    text: a regex per line costs a call per line on a log of a million lines)."""
    return [i for i in _candidates(joined, starts, anchors) if lo <= i < hi]


def explain(lines: Iterable[str], scope: str = "all") -> Explanation:
    """The log as events: the earliest failure that is a cause, the causes named (table rows), and the failures
    after it that any failure brings (store resets, watchdog timeouts, ChildFailedError, SIGTERM). When the job's
    own failure (memory, data, code) comes before every network cause, no row is named."""
    raw = [ln.rstrip("\r\n") for ln in lines]
    text = for_matching(raw)  # each line cut at MAX_LINE, control sequences removed: linear-time regexes
    found, at = _rows(text, raw, scope)
    _add_wrapped(found, at, text, raw, scope)
    echoes = _echoes(found)
    named = [found[p.key] for p in PATTERNS if p.key in found and p.key not in echoes]
    failures = [d.line_no for d in named if d.pattern.key not in OBSERVATION_KEYS]
    first_cause = min(failures) - 1 if failures else len(text)
    joined = "\n".join(text)
    starts = list(itertools.accumulate((len(ln) + 1 for ln in text[:-1]), initial=0))
    job = next((i for i in _lines_matching(JOB_ANCHORS, joined, starts, 0, first_cause)
                if i not in at and is_job_failure(text[i])), None)
    hosts = read_hosts(text)
    if job is not None and scope == "all":
        first = event(job + 1, "job", text[job], shown(raw[job]))
        named, start = [], job
    else:
        named += _versions(hosts, raw) if scope == "all" else []
        if not named:
            return Explanation([], None, [], 0, hosts)
        d = min(named, key=lambda x: x.line_no)
        first = event(d.line_no, "cause", text[d.line_no - 1], d.line, d.pattern.key)
        start = d.line_no - 1
        for d in named:
            d.checks, d.why = narrow(d, hosts)
    marked = {i for i in _lines_matching(CONSEQUENCE_ANCHORS, joined, starts, start + 1, len(text))
              if CONSEQUENCE.search(text[i])}
    later = sorted(i for i in marked | set(at) if i > start and (
        at.get(i) in CONSEQUENCE_KEYS or (i not in at) or (at[i] in echoes and at[i] != first.key)))
    consequences = [event(i + 1, "consequence", text[i], shown(raw[i]), at.get(i, ""))
                    for i in later[:MAX_CONSEQUENCES]]
    return Explanation(named, first, consequences, len(later), hosts)


def _versions(hosts: HostFacts, raw: list[str]) -> list[Diagnosis]:
    """The versions-differ row when the nodes report different versions, on the first line that differs."""
    differ = hosts.differing()
    if not differ:
        return []
    at = min(n for (kind, _), n in hosts.at.items() if kind in differ)
    return [Diagnosis(VERSIONS_DIFFER, at + 1, shown(raw[at]), (shown(versions_line(differ), 300),))]


def finding_ids(diagnoses: Sequence[Diagnosis]) -> list[str]:
    out: list[str] = []
    for d in diagnoses:
        out += [i for i in d.pattern.finding_ids if i not in out]
    return out


def cause_line(text: str, finding_ids_here: Iterable[str] = ()) -> str:
    """verify's one-line cause of a failed launch: the first known failure in its output (the table above), with
    the checks that look at it and the audit findings on that node."""
    ds = diagnose(text.splitlines(), scope="verify")
    ids = sorted(set(finding_ids_here))
    here = f"; audit findings here: {', '.join(ids)}" if ids else ""
    if not ds:
        return f"audit findings here: {', '.join(ids)}" if ids else "unknown: see the error text"
    d = next((x for x in ds if x.pattern.scope == "verify"), ds[0])  # verify's own launch failures first
    checks = f" ({', '.join(d.pattern.finding_ids)})" if d.pattern.finding_ids else ""
    return f"{d.pattern.title}{checks}: {d.pattern.advice}{here}"


def symptoms(finding_id: str) -> list[Pattern]:
    """The recognised failures whose cause this finding's check looks at: how the finding shows in a job's log
    (the HTML report lists them under each cause)."""
    return [p for p in (*PATTERNS, VERSIONS_DIFFER) if p.scope == "all" and finding_id in p.finding_ids]


def markdown() -> str:
    """The README's list of recognised failures, generated from the table: key, title, one example line."""
    out = ["| failure | what it means | checked by | example line |", "|---|---|---|---|"]
    for p in (*PATTERNS, VERSIONS_DIFFER):
        if p.scope != "all":
            continue
        ids = ", ".join(f"`{i}`" for i in p.finding_ids) or "(no host check: not the network)"
        ex = p.example.replace("|", "\\|")
        out.append(f"| `{p.key}` | {p.title} | {ids} | `{ex}` |")
    return "\n".join(out) + "\n"


def against_inventory(diagnoses: Sequence[Diagnosis], facts: LogFacts, cluster: Any) -> list[str]:
    """What the log says that the inventory contradicts (an `inventory.Cluster`): a store address that is not the
    master's, a peer address that is no node's, an interface the inventory does not name, a world size or a rank
    beyond the inventory's world size. Sets each diagnosis's `notes`; returns the notes about the whole log."""
    master = cluster.master_node
    names = {n.name for n in cluster.nodes} | {n.address for n in cluster.nodes}
    ifnames = sorted({n.socket_ifname for n in cluster.nodes if n.socket_ifname})
    world = int(cluster.world_size)
    for d in diagnoses:
        key, det = d.pattern.key, d.detail
        if key == "master-unreachable" and len(det) >= 2 and det[1].isdigit():
            if det[0] not in (master.name, master.address):
                d.notes.append(f"the log dials {det[0]}:{det[1]}; the inventory's master is {master.name} at "
                               f"{master.address}:{cluster.master_port}: that node's MASTER_ADDR is not the "
                               "master's cluster address")
            elif int(det[1]) != cluster.master_port:
                d.notes.append(f"the log dials port {det[1]}; the inventory's master port is {cluster.master_port}")
        elif key in ("nccl-socket-connect", "gloo-peer-connect") and det and det[0][:1].isalnum():
            if re.fullmatch(r"[0-9A-Fa-f:.]+", det[0]) and det[0] not in names:
                d.notes.append(f"peer address {det[0]} is no node's cluster address in the inventory: a rank "
                               "advertised another interface (pin NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)")
        elif key in ("socket-ifname-missing", "nccl-virtual-interface") and det and ifnames:
            if det[0] not in ifnames:
                d.notes.append(f"interface {det[0]} is not the inventory's ({', '.join(ifnames)})")
        elif key in ("store-clients-missing", "store-shared") and len(det) in (3, 4) and int(det[2]) != world:
            # det[2] is the store's n: (seconds, k, n) in torch 2.x, (rank, key, world_size, joined) before
            d.notes.append(f"the store waited for {det[2]} clients; the inventory's world size is {world} "
                           "(NNODES / WORLD_SIZE differ from the inventory)")
    beyond = [r for r in facts.ranks if r >= world]
    if beyond:
        return [f"rank{'s' if len(beyond) > 1 else ''} {', '.join(map(str, beyond))} in the log "
                f"{'are' if len(beyond) > 1 else 'is'} beyond the inventory's world size {world}: a node ran with "
                "another WORLD_SIZE / NNODES or another inventory"]
    return []
