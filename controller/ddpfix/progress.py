"""Live per-host progress on a terminal (rich); silent when not a TTY or when output is JSON."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

_STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "red", "running": "cyan",
          "waiting": "dim"}


class Progress:
    """Feeds on ansible-runner events; shows one row per host: state, current task, task count."""

    def __init__(self, hosts: Sequence[str] | None, title: str, enabled: bool | None = None) -> None:
        """`hosts` None: not known yet (the run derives them); a row is added for each host when it first starts."""
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.title = title
        self.open = hosts is None
        self.rows: dict[str, dict[str, Any]] = {h: {"state": "waiting", "task": "", "done": 0} for h in hosts or ()}
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self.enabled:  # rich only when there is a terminal to draw on
            # rich loads slowly (CLI start): only when there is a terminal to draw on
            from rich.console import Console
            from rich.live import Live

            # the table is drawn at the refresh rate (get_renderable), not rebuilt at every event: an event costs a
            # row update, whatever the number of hosts (a rebuild per event is quadratic in a fleet's events)
            self._live = Live(console=Console(stderr=True), refresh_per_second=8, transient=True,
                              get_renderable=self._table)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def on_event(self, event: dict[str, Any]) -> None:
        if not self.enabled:
            return
        data = event.get("event_data") or {}
        host = data.get("host")
        kind = event.get("event", "")
        if not host or (host not in self.rows and not (self.open and kind == "runner_on_start")):
            return
        with self._lock:
            self.rows.setdefault(host, {"state": "waiting", "task": "", "done": 0})
            row = self.rows[host]
            if kind == "runner_on_start":
                row.update(state="running", task=data.get("task", ""))
            elif kind == "runner_on_ok":
                row["done"] += 1
                row["state"] = "changed" if (data.get("res") or {}).get("changed") else "ok"
            elif kind == "runner_on_failed":
                row.update(state="failed", task=data.get("task", ""))
            elif kind == "runner_on_unreachable":
                row.update(state="unreachable", task=data.get("task", ""))

    def _table(self) -> Table:
        from rich.table import Table  # rich: only when drawing (see __enter__)

        t = Table(title=self.title, title_justify="left", show_edge=False, pad_edge=False)
        t.add_column("host")
        t.add_column("state")
        t.add_column("tasks", justify="right")
        t.add_column("current task", overflow="ellipsis", max_width=60)
        with self._lock:  # the refresh thread draws while events update the rows
            rows = [(h, dict(row)) for h, row in self.rows.items()]
        for h, row in rows:
            style = _STYLE.get(row["state"], "")
            t.add_row(h, f"[{style}]{row['state']}[/]", str(row["done"]), row["task"])
        return t
