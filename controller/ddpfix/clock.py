"""Controller-side time stamps: when ansible-runner stamped an event (its naive-UTC ISO text) as epoch seconds."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_event_time(created: str) -> float | None:
    try:
        dt = datetime.fromisoformat(created)
    except (TypeError, ValueError):
        return None
    if dt.tzinfo is None:  # ansible-runner stamps events in naive UTC
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
