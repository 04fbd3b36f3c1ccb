"""The one clock: naive UTC, how every timestamp is stored."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["now"]


def now(*, whole_seconds: bool = False) -> datetime:
    """The current time as naive UTC (microseconds dropped with ``whole_seconds``)."""
    t = datetime.now(UTC).replace(tzinfo=None)
    return t.replace(microsecond=0) if whole_seconds else t
