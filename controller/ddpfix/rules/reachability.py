"""Reachability of the nodes themselves: SSH, the facts module, the facts it read and their grammar."""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import metadata

from ddpfix.model.finding import Finding, Severity
from ddpfix.rules.context import Context, host_faults
from ddpfix.rules.engine import blind_ids
from ddpfix.rules.registry import Rule, finding, rules

E, W = Severity.ERROR, Severity.WARNING


# ---------------------------------------------------------------- reachability


@rules(
    UNREACHABLE := Rule(
        "host.unreachable",
        E,
        "node not reachable over SSH (the others are still fully audited)",
        "Make the node reachable over SSH (sshd running, key, known_hosts, network) and re-run.",
    ),
    MODULE_FAILED := Rule(
        "host.module-failed",
        E,
        "the node answered over SSH but ddpfix's module failed there (its Python interpreter exited non-zero or is "
        "missing, a traceback): nothing was read; the evidence is the module's own error (the others are still "
        "fully audited)",
        "Fix what the module's error names on the node (a working python3, the host's ansible_python_interpreter, "
        "a full /tmp) and re-run; `ddpfix -vvv audit` shows the module's whole output.",
    ),
    PYTHON_UNSUPPORTED := Rule(
        "host.python-unsupported",
        E,
        "the node's Python (its ansible_python_interpreter) is older than the controller's ansible-core runs modules "
        "on (ansible-core 2.20 and later: Python 3.9 or newer; 2.19: 3.8): nothing was read; the evidence is "
        "ansible-core's own message (the others are still fully audited)",
        "Set this node's ansible_python_interpreter to a Python on it that is new enough (e.g. a distribution's "
        "python3.9 or later package), or run ddpfix from a venv with an ansible-core that still supports the node's "
        "Python (2.19 runs modules on Python 3.8 to 3.13), and re-run.",
    ),
)
def check_unreachable(ctx: Context) -> Iterable[Finding]:
    for n in ctx.cluster.nodes:
        h = ctx.hosts.get(n.name)
        if h is None:
            continue  # outside --limit: not read, not a finding
        too_old = unsupported_python(h.error) if h.failed and not h.node else None
        if too_old:
            current, needed = too_old
            yield finding("host.python-unsupported", n.name,
                          f"{n.name} ({n.address}) could not be audited: its Python {current} is older than "
                          f"ansible-core {ansible_core_version()} supports on a node (Python {needed} or newer)",
                          h.error)
        elif h.failed and not h.node:
            yield finding("host.module-failed", n.name,
                          f"{n.name} ({n.address}) could not be audited: a module failed on the node (SSH works)",
                          h.error or "the module returned no result")
        elif not h.reachable or not h.node:
            why = (h.error if h else "") or "no facts returned"
            yield finding("host.unreachable", n.name, f"{n.name} ({n.address}) could not be audited", why)


#: The findings that say nothing was read on a node (it was not audited at all).
NOT_AUDITED = frozenset({UNREACHABLE.id, MODULE_FAILED.id, PYTHON_UNSUPPORTED.id})

#: How ansible-core's module_utils/basic.py refuses a node's Python older than its `_PY_MIN` (a module result of its
#: own, `failed` with this `msg`), from 2.20 on (`_PY_MIN = (3, 9)`: 2.20 dropped Python 3.8 on nodes); "Current
#: version" is `sys.version` on one line: "3.8.18 (default, ...) [GCC 12.2.0]". (2.19's own wording of it is never
#: seen: on Python 3.7 its module wrapper stops at a SyntaxError first, a host.module-failed.)
_TOO_OLD = re.compile(r"Ansible requires Python (?P<needed>[0-9]+\.[0-9]+) or newer on the target\. "
                      r"Current version: (?P<current>[0-9]+\.[0-9]+\.[0-9]+)")


def unsupported_python(error: str) -> tuple[str, str] | None:
    """(the node's Python version, the oldest the controller's ansible-core runs modules on) when a module's error is
    ansible-core refusing the node's Python; None for any other error."""
    m = _TOO_OLD.search(" ".join(error.split()))
    return (m["current"], m["needed"]) if m else None


def ansible_core_version() -> str:
    """The installed ansible-core's version (its distribution's metadata: ansible itself is not imported)."""
    try:
        return metadata.version("ansible-core")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


@rules(
    INCOMPLETE := Rule(
        "facts.incomplete",
        W,
        "a fact source could not be read on the node (no permission, e.g. `iptables-save`/`nft` as a non-root SSH "
        "user; a missing tool; a timeout): names each source and the tool's error. The checks that read it are listed "
        'per host as **not evaluated** (JSON `hosts.NODE.not_evaluated: [{id, reason}]`, a "NOT EVALUATED" table), '
        "never as passed (no torch in `ddp_python` is no such fault: the torch comparison is only listed as not "
        "evaluated)",
        "Let the SSH user read them (root, or become: true with passwordless sudo) or install the missing tool, then "
        "re-run; until then the checks listed as not evaluated say nothing about this node.",
    ),
)
def check_incomplete(ctx: Context) -> Iterable[Finding]:
    for name, f in ctx.audited():
        unread = host_faults(f, ctx.unread(name))  # no torch in ddp_python: not evaluated, not the host's fault
        if not unread:
            continue
        blind = sorted(fid for fid in blind_ids(ctx, name, unread))
        yield finding(
            "facts.incomplete",
            name,
            f"could not read {', '.join(sorted(unread))} on {name}; not evaluated: {', '.join(blind) or 'nothing'}",
            "; ".join(f"{src}: {why}" for src, why in sorted(unread.items())),
        )


@rules(
    INVALID := Rule(
        "facts.invalid",
        E,
        "the node returned a value that is not of its field's grammar (a hostname, address, interface name, MAC, "
        "RDMA device, port, GID, P_Key, env-file key or value, ...): a node's text is never used as it came "
        '(see "Refused inputs" and "Security model")',
        "Fix {fact} on the node (a hostname: hostnamectl set-hostname with an RFC 1123 name; anything else: find what "
        "wrote it, since the kernel and the tools do not print such values); ddpfix leaves it out of every peer's "
        "files and refuses to remediate or write env files until it is fixed.",
    ),
)
def check_facts(ctx: Context) -> Iterable[Finding]:
    for name, problems in ctx.invalid.items():
        for fact, value, why in problems:
            yield finding(
                "facts.invalid", name, f"{name} returned {fact} {value!r}: {why}", f"{fact} = {value!r}", fact=fact
            )
