"""Time-aware queries: the ``since`` / ``until`` / ``last_turns`` window of a search or context."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cce_duck.errors import ValidationError
from cce_duck.messages import parse_time

__all__ = ["Window"]


@dataclass(frozen=True)
class Window:
    """A validated window: turns at or after ``since``, at or before ``until`` (naive UTC), and
    among the session's last ``last_turns`` turns."""

    since: datetime | None = None
    until: datetime | None = None
    last_turns: int | None = None

    @classmethod
    def parse(cls, since: object = None, until: object = None, last_turns: object = None
              ) -> Window:
        """Validate ISO-8601 strings (or datetimes) and a positive turn count."""
        s = None if since is None else parse_time(since, "since")
        u = None if until is None else parse_time(until, "until")
        if s is not None and u is not None and s > u:
            raise ValidationError(f"since ({s.isoformat()}) is after until ({u.isoformat()})")
        if last_turns is not None and (isinstance(last_turns, bool) or not isinstance(last_turns, int)
                                       or last_turns <= 0):
            raise ValidationError(f"last_turns must be a positive integer, got {last_turns!r}")
        return cls(s, u, last_turns)
