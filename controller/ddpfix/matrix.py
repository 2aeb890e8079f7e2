"""The connectivity picture: who resolves and reaches whom, from the audit's own probe results.

Rows dial columns. Every node resolves every peer's hostname (a full N x N resolution matrix) and dials the master
port and its K ring peers ((1+K)*N connects), so a cell carries the connect result where one was made and the
resolution result everywhere else.
"""

from __future__ import annotations

from typing import Any, cast

from ddpfix.rules.context import Context

#: Cell states, worst first (a cell shows its worst).
STATES = ("refused", "timeout", "unreachable", "unresolved", "mismatch", "ok", "not-probed", "self", "unknown")
SYMBOL = {"ok": ".", "refused": "R", "timeout": "T", "unreachable": "X", "unresolved": "U", "mismatch": "M",
          "not-probed": " ", "self": "\\", "unknown": "?"}
FAILED = {"refused", "timeout", "unreachable", "unresolved", "mismatch"}


def connect_state(error: str | None) -> str:
    e = (error or "").lower()
    if "refused" in e:
        return "refused"
    if "timed out" in e or "timeout" in e:
        return "timeout"
    return "unreachable"


def connectivity_matrix(ctx: Context) -> dict[str, Any]:
    """`{"nodes": [...], "cells": {row: {col: {"state", "connect", "resolve", "detail"}}}}` in rank order."""
    nodes = [n.name for n in ctx.cluster.nodes]
    hostname_of = {name: (f or {}).get("hostname") for name, f in ctx.facts.items()}
    cells: dict[str, dict[str, dict[str, str]]] = {}
    for row in nodes:
        cells[row] = {}
        facts = ctx.facts.get(row)
        host = ctx.hosts.get(row)
        probe = (host.probe if host else None) or {}
        connects = {c.get("name"): c for c in probe.get("connects") or []}
        resolve = probe.get("resolve") or {}
        unobserved = {u.get("name"): u.get("why") for u in cast(Any, probe).get("unobserved") or []
                      if isinstance(u, dict)}
        for col in nodes:
            if col == row:
                cells[row][col] = {"state": "self"}
                continue
            if not facts:
                cells[row][col] = {"state": "unknown", "detail": f"{row} was not audited"}
                continue
            cell: dict[str, str] = {}
            hn = hostname_of.get(col)
            want = ctx.plan[col].address if col in ctx.plan else None
            if hn and hn in resolve:
                addrs = resolve.get(hn) or []
                if not addrs:
                    cell["resolve"] = "unresolved"
                    cell["detail"] = f"{hn} does not resolve on {row}"
                elif want and addrs[0] != want:
                    cell["resolve"] = "mismatch"
                    cell["detail"] = f"{hn} -> {addrs[0]} on {row}, not {want}"
                else:
                    cell["resolve"] = "ok"
            elif hn and hn == col and "checked" in probe:  # the node reports deviations only: this one resolved right
                cell["resolve"] = "ok"
            c = connects.get(col)
            if c is None and col in unobserved:  # a rolling dial no listener spoke for (ddpfix.rolling)
                cell["connect"] = "unknown"
                cell["detail"] = f"not evaluated: {unobserved[col]}"
            elif c is not None:
                cell["connect"] = "ok" if c.get("ok") else connect_state(c.get("error"))
                if not c.get("ok"):
                    cell["detail"] = f"{c.get('address')}:{c.get('port')}: {c.get('error')}"
            else:
                cell["connect"] = "not-probed"
            states = [s for s in (cell.get("connect"), cell.get("resolve")) if s]
            cell["state"] = min(states, key=STATES.index) if states else "not-probed"
            if cell["state"] == "not-probed" and cell.get("resolve") == "ok":
                cell["state"] = "ok"
            if cell.get("connect") == "unknown" and cell["state"] == "ok":  # a name resolved right proves no connect
                cell["state"] = "unknown"
            cells[row][col] = cell
    return {"nodes": nodes, "cells": cells}


def failing(matrix: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """(row, col, cell) of every failed cell, in rank order."""
    out = []
    for row in matrix["nodes"]:
        for col in matrix["nodes"]:
            cell = matrix["cells"][row][col]
            if cell["state"] in FAILED:
                out.append((row, col, cell))
    return out


def render_matrix_text(matrix: dict[str, Any], max_grid: int = 32) -> str:
    """A grid of symbols up to `max_grid` nodes; above it, only the failing rows and columns."""
    nodes = matrix["nodes"]
    legend = ("legend: . ok  R refused  T timeout  X unreachable  U unresolved  M wrong address  "
              "(blank) not probed  ? not audited; rows dial columns")
    bad = failing(matrix)
    lines = [f"connectivity: {len(nodes)} nodes, {len(bad)} failing pair{'s' if len(bad) != 1 else ''}"]
    if len(nodes) <= max_grid:
        width = max(len(n) for n in nodes) if nodes else 0
        lines.append(" " * (width + 1) + " ".join(str(i % 10) for i in range(len(nodes))))
        for i, row in enumerate(nodes):
            syms = " ".join(SYMBOL[matrix["cells"][row][c]["state"]] for c in nodes)
            lines.append(f"{row:<{width}} {syms}  {i}")
        lines.append(legend)
    rows: dict[str, list[str]] = {}
    for row, col, cell in bad:
        rows.setdefault(row, []).append(f"{col} ({cell['state']})")
    for row, cols in rows.items():
        shown = ", ".join(cols[:8]) + (f", and {len(cols) - 8} more" if len(cols) > 8 else "")
        lines.append(f"{row} -> {shown}")
    if len(nodes) > max_grid:
        cols_bad: dict[str, int] = {}
        for _, col, _cell in bad:
            cols_bad[col] = cols_bad.get(col, 0) + 1
        for col, n in sorted(cols_bad.items(), key=lambda kv: -kv[1])[:20]:
            lines.append(f"{col}: failed from {n} node{'s' if n != 1 else ''}")
    return "\n".join(lines)
