"""Duration strings (``30s``, ``10m``, ``1h``, ``1h30m`` or plain seconds), standard library only.

Shared by the job file and the checkpoint library, which must import without the CLI's dependencies.
"""

from __future__ import annotations

import math
import re

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")  # ASCII digits only: "３６h" is no duration
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest duration anything takes (a deadline, an interval): ten years. Longer is a typo, and a number of days
# with twenty digits would overflow the times computed from it.
MAX_DURATION_SECONDS = 10 * 365 * 86400


def parse_duration(value: str | int | float) -> float:
    """Return seconds for a duration; raise ValueError with an example when malformed."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 10m or 1h")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite duration; use a number with a unit such as 30s, 10m or 1h")
        if value < 0:
            raise ValueError(f"{value!r} is negative; use a duration such as 30s, 10m or 1h")
        return _in_range(value, float(value))
    text = str(value).strip().lower()
    if not text.isascii():
        raise ValueError(f"{value!r} is not a duration: write it with ASCII digits and a unit, such as 30s, 10m or 1h")
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return _in_range(value, float(text))
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{value!r} is not a duration; use a number with a unit such as 30s, 10m or 1h")
    return _in_range(value, total)


def _in_range(value, seconds: float) -> float:
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{value!r} is longer than the longest duration allowed, 3650d (ten years)")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds compactly for tables: 45s, 12m, 3h05m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"
