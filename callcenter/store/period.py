"""Periods as operators say them, for every command that reads the store (`calls list`, and the
reports after it): `today`, `yesterday` (the start of that day), `7d`, `24h`, `30m` (that long ago),
or an ISO date (`2026-12-01`: its start) or time (`2026-12-01T09:30`, `2026-12-01 09:30`), in the
server's time zone (the machine's local time unless an offset is given)."""

from __future__ import annotations

import datetime as dt
import re

from callcenter.errors import CallcenterError

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([dhm])$")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60}


class PeriodError(CallcenterError, ValueError):
    pass


def moment(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """The moment `text` names, as an aware datetime."""
    now = (now or dt.datetime.now().astimezone())
    t = text.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if t == "now":
        return now
    if t == "today":
        return midnight
    if t == "yesterday":
        return _day_start(midnight.date() - dt.timedelta(days=1), now.tzinfo)
    m = _AGO.match(t)
    if m:
        return now - dt.timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", t):
            return _day_start(dt.date.fromisoformat(t), now.tzinfo)
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise PeriodError(f"{text!r}: say today, yesterday, 7d, 24h, 30m, or a date or time "
                          "(2026-12-01, 2026-12-01T09:30)") from None
    return when if when.tzinfo else when.replace(tzinfo=now.tzinfo)


def _day_start(day: dt.date, tz) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=tz)


def period(since: str, until: str | None = None, now: dt.datetime | None = None) -> tuple[float, float]:
    """[since, until) as Unix times; until defaults to now."""
    start = moment(since, now)
    end = moment(until, now) if until else (now or dt.datetime.now().astimezone())
    if end <= start:
        raise PeriodError(f"--until {until or 'now'} is not after --since {since}")
    return start.timestamp(), end.timestamp()
