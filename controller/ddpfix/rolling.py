"""The rolling probe's dials that only a listener saw (forks below the number of nodes).

With Ansible's forks below the number of nodes, each node's prober outlives its facts task (plugins/module_utils/
ddpfix_probe.py `fork_rolling`): a node dials, within its task, the targets that started before it (their listeners
are up), and leaves its dials to later targets to the prober (`deferred`); a later target's listener records which
planned dialers' connects it saw, and from which address (`inbound_from`), and every source address it saw
(`inbound_sources`). Here those records become the dialers' connect results, as if each dialer had returned them:
one round trip per node, no second task to collect the probers.

Node data is hostile: a node's record speaks only for connects TO itself, only for the dialers that planned to dial
it (the dialer's own `deferred` names it), only from an address of that dialer (its cluster address or its probe
address); a record that is missing or unusable makes the connect "not evaluated", never a pass or a block: it is listed
in the dialer's `probe.unobserved` ({name, kind, why}), not among its connects, so no check reads it as one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ddpfix.rules.context import HostFacts

#: Said in a connect the listener's record stands for (the dialer's own result never came back).
OBSERVED = "listener"


def _m(value: Any) -> Mapping[str, Any]:
    """A node's mapping as untyped data (node data: every value is checked where it is read)."""
    return cast(Mapping[str, Any], value) if isinstance(value, Mapping) else {}


def _addresses_of(h: HostFacts) -> set[str]:
    """The addresses a node's connects come from: its cluster address and its probe listener's address."""
    node = _m(h.node)
    out = {_m(node.get("cluster")).get("address"), _m(node.get("probe")).get("address"), _m(h.probe).get("address")}
    return {a for a in out if isinstance(a, str) and a}


def _record(h: HostFacts | None) -> Mapping[str, Any] | None:
    """A node's listener record (`inbound_from`), or None where it has none (not audited, no rolling prober)."""
    if h is None or not h.reachable:
        return None
    rec = _m(h.probe).get("inbound_from")
    return rec if isinstance(rec, Mapping) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def observed_connect(dialer: str, d: HostFacts, t: Mapping[str, Any], target: HostFacts | None) -> dict[str, Any]:
    """The connect result of `dialer`'s deferred dial `t` ({name, address, port, kind}), from the target's record."""
    name, kind = str(t.get("name")), str(t.get("kind") or "peer")
    base: dict[str, Any] = {"name": name, "address": t.get("address"), "port": t.get("port"), "kind": kind,
                            "observed": OBSERVED, "attempts": None, "first_try": None, "last_try": None,
                            "seconds": None}
    rec = _record(target)
    if rec is None:
        return {**base, "ok": False, "error": f"not observed: {name} returned no listener record",
                "unobserved": f"{name} returned no record of its listener's connects"}
    tp = _m(target.probe if target is not None else None)
    planned = tp.get("inbound_planned") or {}
    if not isinstance(planned, Mapping) or dialer not in (planned.get(kind) or []):
        return {**base, "ok": False, "error": f"not observed: {name} did not plan a {kind} connect from {dialer}",
                "unobserved": f"{name}'s listener did not expect a {kind} connect from {dialer}"}
    seen = rec.get(kind)
    src = seen.get(dialer) if isinstance(seen, Mapping) else None
    if isinstance(src, str) and src in _addresses_of(d):
        return {**base, "ok": True, "error": None, "source": src}
    up, until = _num(tp.get("up_at")), _num(_m(d.probe).get("dial_until"))
    if up is not None and until is not None and up > until:
        return {**base, "ok": False, "error": f"not observed: {dialer}'s prober stopped dialling before {name}'s "
                                              "listener was up",
                "unobserved": f"{dialer}'s prober had stopped dialling before {name}'s listener was up"}
    if kind not in (tp.get("expected_inbound") or {}):
        return {**base, "ok": False, "error": f"not observed: {name} had no {kind} listener",
                "unobserved": f"{name} had no {kind} listener"}
    why = "from an address that is not the dialer's" if isinstance(src, str) else "within its window"
    return {**base, "ok": False,
            "error": f"timed out: no connect from {dialer} arrived at {name}'s listener {why} (observed at the "
                     "listener: the dialer's own error is not known)"}


def _reach(reach: Any, d: HostFacts, dialer: str, t: Mapping[str, Any], c: Mapping[str, Any],
           target: HostFacts | None) -> None:
    """Add the deferred peer `t` to the dialer's interface reach evidence: its own interface reached it where the
    listener saw the connect, failed where it saw none (and the connect is evaluated); each other interface reached
    it where the listener saw a connect from that interface's address (nothing said otherwise: not evaluated)."""
    if not isinstance(reach, dict) or t.get("kind") != "peer" or c.get("unobserved"):
        return
    main = _m(_m(d.node).get("cluster")).get("ifname")
    seen = _m(target.probe if target is not None else None).get("inbound_sources") or {}
    sources = set(seen.get("peer") or []) if isinstance(seen, Mapping) else set()
    peer = str(t.get("name"))
    for ifname, e in reach.items():
        if not isinstance(e, dict):
            continue
        if ifname == main:
            if c.get("ok"):
                e["reached"] = [*(e.get("reached") or []), peer]
            else:
                e["failed"] = {**(e.get("failed") or {}), peer: str(c.get("error"))}
        elif e.get("address") in sources:
            e["reached"] = [*(e.get("reached") or []), peer]


def fold_rolling(hosts: Mapping[str, HostFacts]) -> dict[str, HostFacts]:
    """`hosts` with each rolling dialer's deferred dials turned into connects from its targets' listener records
    (`observed_connect`); hosts without deferred dials are returned as they are."""
    out = dict(hosts)
    for name, h in hosts.items():
        pr = _m(h.probe) if h.reachable else {}
        deferred = pr.get("deferred")
        if not isinstance(deferred, list) or not deferred:
            continue
        connects: list[Any] = [c for c in pr.get("connects") or [] if isinstance(c, Mapping)]
        done = {(c.get("name"), c.get("kind")) for c in connects}
        unobserved: list[dict[str, Any]] = []
        reach = {k: dict(v) for k, v in pr["reach"].items()} if isinstance(pr.get("reach"), Mapping) else None
        for t in deferred[:64]:  # a plan has 1 + peers targets
            if not isinstance(t, Mapping) or (t.get("name"), t.get("kind")) in done or t.get("name") == name:
                continue
            target = hosts.get(str(t.get("name")))
            c = observed_connect(name, h, t, target)
            if c.get("unobserved"):  # not a connect result: no check reads it as one (the matrix shows it)
                unobserved.append({"name": c["name"], "kind": c["kind"], "why": c["unobserved"]})
            else:
                connects.append(c)
            done.add((t.get("name"), t.get("kind")))
            _reach(reach, h, name, t, c, target)
        probe = {**pr, "connects": connects, "unobserved": unobserved,
                 **({"reach": reach} if reach is not None else {})}
        node: Any = h.node
        if "connects" in _m(_m(node).get("probe")):
            node = {**node, "probe": {**node["probe"], **probe}}
        out[name] = dataclasses.replace(h, probe=cast(Any, probe), node=node)
    return out
