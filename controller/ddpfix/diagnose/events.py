"""A log read as events: each failure line with its place (line, rank, node), its layer (launcher, store /
rendezvous, Gloo, NCCL bootstrap, NCCL transport, user code), its errno and its peer. `explain` names the earliest
failure that is a cause; what follows it and is known to follow any failure (a store reset, a watchdog timeout,
`ChildFailedError`, SIGTERM to the other ranks, a lost peer) is shown as its consequence, not as a second cause.

A failure in the job itself (CUDA or host out-of-memory, a missing data file, an exception in the training code)
that comes before every network cause means the hosts are not the cause: nothing that follows it names a host
check. Every regex here is linear (alternations of literals, bounded classes) and runs on lines already cut by
`bounded.for_matching`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: the layer a line belongs to, tried in this order (the first that matches)
LAYERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gloo", re.compile(r"[Gg]loo|pair\.cc|connectFullMesh|unbound_buffer")),
    ("nccl-bootstrap", re.compile(r"[Bb]ootstrap|ncclUniqueId|NCCL_SOCKET_IFNAME|bootstrap\.cc")),
    ("nccl-transport", re.compile(r"socketStartConnect|socketProgress|socketPoll|NET/IB|NET/OFI|NET/Socket|ibv_|"
                                  r"transport/|proxy\.cc|socket\.cc|NCCL WARN|"
                                  r"WorkNCCL|[Ww]atchdog|NCCL|ncclSystemError|ncclRemoteError")),
    ("store", re.compile(r"TCPStore|[Ss]tore|[Rr]endezvous|MASTER_ADDR|MASTER_PORT|socket\.cpp|client socket|"
                         r"server socket|network address|c10d")),
    ("launcher", re.compile(r"torchrun|torch[./]distributed[./](?:run|launch|elastic)|ChildFailedError|"
                            r"closing signal|exitcode|srun: |mpirun|deepspeed[./]launcher|accelerate[./]")),
)

#: a failure of the job itself: memory, data, the training code (unless the line is a distributed one)
USER_FAILURE = re.compile(
    r"(?:CUDA|HIP|XPU) out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
    r"\b(?:FileNotFoundError|IsADirectoryError|NotADirectoryError|KeyError|IndexError|TypeError|AttributeError|"
    r"NameError|ZeroDivisionError|AssertionError|ImportError|ModuleNotFoundError|NotImplementedError|"
    r"UnboundLocalError|RecursionError|JSONDecodeError|UnicodeDecodeError|ValueError|EOFError|UnpicklingError|"
    r"FloatingPointError|SyntaxError|IndentationError)\b|"
    r"CUDA error: (?:device-side assert|an illegal memory access|misaligned address|invalid device ordinal|"
    r"out of memory)|"
    r"shapes cannot be multiplied|size mismatch for |Error\(s\) in loading state_dict|[Ll]oss is (?:NaN|nan|inf)")
#: the host killed a rank (the OOM killer): not the network, whatever the launcher line around it says
KILLED = re.compile(r"exitcode\s{0,4}:?\s{0,4}-9\b|Signal 9 \(SIGKILL\)|Out of memory: Killed process|oom-kill")
#: literals one of which every line `is_job_failure` accepts holds (a unit test checks it on every branch)
JOB_ANCHORS = ("Error", "CUDA error", "out of memory", "CUBLAS_", "shapes cannot", "size mismatch", "oss is ",
               "exitcode", "SIGKILL", "Killed process", "oom-kill")
#: lines that follow any failure: the launcher tearing the job down, the other ranks' timeouts and lost peers
CONSEQUENCE = re.compile(
    r"ChildFailedError|closing signal SIG|SignalException|Received \d{1,3} death signal|WorkerGroup failed|"
    r"failed \(exitcode|Some NCCL operations have failed|taking the entire process down|"
    r"Connection closed by localRank|watchdog thread terminated")
CONSEQUENCE_ANCHORS = ("ChildFailedError", "closing signal SIG", "SignalException", "death signal",
                       "WorkerGroup failed", "failed (exitcode", "Some NCCL operations have failed",
                       "taking the entire process down", "Connection closed by localRank", "watchdog thread terminated")
#: distributed-communication words: a line holding one is not a failure of the job itself
_DIST = re.compile(r"c10d|[Gg]loo|NCCL|TCPStore|ProcessGroup|torch[./]distributed|torchrun|elastic|"
                   r"init_process_group|[Rr]endezvous|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|LOCAL_RANK|socket\.cpp")
#: table rows that follow another failure: named only when no cause comes before them
CONSEQUENCE_KEYS = frozenset({"connection-reset", "nccl-remote-error", "collective-timeout-later",
                              "gloo-collective-timeout", "nccl-unique-id-closed", "nccl-unique-id-timeout"})

_RANK = re.compile(r"\[[Rr]ank ?(\d{1,6})\]|^\[(\d{1,6})\]:|\brank:? (\d{1,6}) ")
_NODE = re.compile(r"^(?:\[\d{1,6}\]:? )?([\w.-]{1,64}):\d{1,9}:\d{1,9} \[\d{1,4}\]")
_ERRNO = re.compile(r"errno:? (-?\d{1,4})|\[Errno (\d{1,4})\]|gai error: (-?\d{1,5})")
#: a peer as NCCL (`addr<port>`), torch (`(host, port)`) or Gloo (`[addr]:port`) writes it; each alternative starts
#: at a token boundary (the lookbehind), so a long run of word characters is scanned once, not from every position
_PEER = re.compile(r"(?<![\w.:-])([0-9A-Fa-f:.]{3,64}|[\w.-]{1,128})<(\d{1,5})>|"
                   r"\(\s{0,4}\[?([0-9A-Za-z:._-]{1,128})\]?, (\d{1,5})\)|"
                   r"(?<![\w.:-])\[?([0-9A-Fa-f:.]{3,64}|[\w-]{1,64}(?:\.[\w-]{1,64}){0,8})\]?:(\d{2,5})\b")

#: errnos and what they say about the path (Linux numbers; negative: getaddrinfo's EAI codes)
ERRNO_MEANING: dict[int, str] = {
    1: "operation not permitted (this node's own firewall refused the outgoing connect)",
    13: "permission denied (a local firewall or a privileged port)",
    22: "invalid argument (an IPv6 link-local address without a scope)",
    24: "too many open files (the nofile limit)",
    97: "address family not supported (IPv6 disabled)",
    98: "address already in use (another process holds the port)",
    99: "cannot assign requested address (no local address of that family)",
    101: "network unreachable (no route to that network)",
    104: "connection reset by peer (the peer exited or a firewall reset it)",
    110: "timed out (a DROP rule, a wrong route or an address that leads nowhere)",
    111: "refused (nothing listens on the port, or a REJECT rule)",
    113: "no route to host (an ICMP reject from a firewall, or a wrong route)",
    -2: "name unknown (the name does not resolve on this node)",
    -3: "name resolution failed for now (no DNS server answered)",
    -5: "the name has no address of that family",
}
_ERRNO_WORDS = {"Connection refused": 111, "Connection timed out": 110, "No route to host": 113,
                "Network is unreachable": 101, "Address already in use": 98, "Connection reset by peer": 104,
                "Name or service not known": -2, "Temporary failure in name resolution": -3,
                "Cannot assign requested address": 99, "Address family not supported": 97,
                "Too many open files": 24}
_ERRNO_TEXT = re.compile("|".join(re.escape(w) for w in _ERRNO_WORDS))


@dataclass(frozen=True)
class Event:
    line_no: int  # 1-based
    kind: str  # "cause" (a table row), "consequence", "job" (the job's own failure: memory, data, code)
    layer: str
    text: str  # shown text (control characters escaped)
    key: str = ""  # the table row, for a row's line
    rank: int | None = None
    node: str = ""
    errno: int | None = None
    peer: str = ""

    @property
    def meaning(self) -> str:
        return ERRNO_MEANING.get(self.errno, "") if self.errno is not None else ""

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line_no, "kind": self.kind, "layer": self.layer, "key": self.key, "rank": self.rank,
                "node": self.node, "errno": self.errno, "errno_meaning": self.meaning, "peer": self.peer,
                "excerpt": self.text}


def layer_of(line: str) -> str:
    return next((name for name, rx in LAYERS if rx.search(line)), "user")


def is_job_failure(line: str) -> bool:
    """The job's own failure (memory, data, code), not a distributed one."""
    if KILLED.search(line):
        return True
    return bool(USER_FAILURE.search(line)) and not _DIST.search(line)


def errno_of(line: str) -> int | None:
    if m := _ERRNO.search(line):
        return int(next(g for g in m.groups() if g is not None))
    if m := _ERRNO_TEXT.search(line):
        return _ERRNO_WORDS[m.group(0)]
    return None


def event(line_no: int, kind: str, line: str, shown_text: str, key: str = "") -> Event:
    rank = None
    if m := _RANK.search(line):
        rank = int(next(g for g in m.groups() if g is not None))
    node = m.group(1) if (m := _NODE.search(line)) else ""
    peer = ""
    if m := _PEER.search(line):
        g = [x for x in m.groups() if x is not None]
        peer = f"{g[0]}:{g[1]}" if len(g) >= 2 else ""
    layer = "user" if kind == "job" else layer_of(line)
    return Event(line_no, kind, layer, shown_text, key, rank, node, errno_of(line), peer)
