"""``recovery.deadline``: a duration from submission (``36h``) or an RFC 3339 time, and what it allows.

Kept out of the schema's validation for the time-dependent part: a stored job is validated again later,
when a deadline in the past is no mistake of its file any more.
"""

from __future__ import annotations

from datetime import datetime, timezone

from ..durations import format_duration, parse_duration

# No cloud node boots, unpacks the workdir and starts training faster than this; a deadline closer than
# it cannot be met by any launch. (With no throughput known at submit, that is all that can be refused.)
MIN_LAUNCH_SECONDS = 120.0
# A deadline given as a time must fall in these years (UTC): the year 1 or 99999 is a typo, not a plan, and
# times outside them cannot even be converted to unix seconds on every platform.
EARLIEST_YEAR, LATEST_YEAR = 2000, 9999
_TIME_EXAMPLE = "2026-11-25T18:00:00Z"


def parse_deadline(value) -> tuple[str, float]:
    """("duration", seconds) or ("time", unix seconds); ValueError with an example when neither."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value.isoformat()} has no time zone; write it as RFC 3339, e.g. "
                             "2026-11-25T18:00:00Z")
        return "time", _unix_seconds(value, value.isoformat())
    text = str(value).strip()
    if "T" in text.upper() or text.count("-") >= 2:
        try:
            moment = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise ValueError(f"{value!r} is neither a duration (36h) nor an RFC 3339 time "
                             "(2026-11-25T18:00:00Z)") from None
        if moment.tzinfo is None:
            raise ValueError(f"{value!r} has no time zone; add Z or an offset, e.g. 2026-11-25T18:00:00Z")
        return "time", _unix_seconds(moment, text)
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        if "is not a duration;" not in str(exc):  # a duration, but too long or not in ASCII digits: say that
            raise
        raise ValueError(f"{value!r} is neither a duration (36h) nor an RFC 3339 time "
                         "(2026-11-25T18:00:00Z)") from None
    if seconds <= 0:
        raise ValueError("must be a positive duration such as 36h, or an RFC 3339 time")
    return "duration", seconds


def _unix_seconds(moment: datetime, text: str) -> float:
    try:
        utc = moment.astimezone(timezone.utc)
    except (OverflowError, ValueError):  # 0001-01-01T00:00:00+14:00 is before the year 1 in UTC
        utc = None
    if utc is None or not EARLIEST_YEAR <= utc.year <= LATEST_YEAR:
        raise ValueError(f"{text!r} is outside the years {EARLIEST_YEAR} to {LATEST_YEAR}; write a time such as "
                         f"{_TIME_EXAMPLE} or a duration such as 36h")
    return utc.timestamp()


def deadline_at(deadline, submitted_at: float) -> float:
    """The deadline in unix seconds for a job submitted at ``submitted_at``."""
    kind, value = parse_deadline(deadline)
    return submitted_at + value if kind == "duration" else value


def deadline_problem(deadline, now: float) -> str | None:
    """Why a deadline cannot be met by a job submitted ``now`` (one line naming the key), or None."""
    if deadline is None:
        return None
    at = deadline_at(deadline, now)
    earliest = now + MIN_LAUNCH_SECONDS
    if at >= earliest:
        return None
    when = "is in the past" if at <= now else f"is only {format_duration(at - now)} away"
    return (f"recovery.deadline: {_iso(at)} {when}; even all on-demand, the earliest finish is after a "
            f"{format_duration(MIN_LAUNCH_SECONDS)} launch, at {_iso(earliest)} plus the job's own run time; "
            "set a later deadline")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
