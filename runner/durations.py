"""Duration strings (``30s``, ``10m``, ``1h``, ``1h30m`` or plain seconds), standard library only.

Shared by the job file and the checkpoint library, which must import without the CLI's dependencies.
"""

from __future__ import annotations

import math
import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | int | float) -> float:
    """Return seconds for a duration; raise ValueError with an example when malformed."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 10m or 1h")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite duration; use a number with a unit such as 30s, 10m or 1h")
        if value < 0:
            raise ValueError(f"{value!r} is negative; use a duration such as 30s, 10m or 1h")
        return float(value)
    text = str(value).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{value!r} is not a duration; use a number with a unit such as 30s, 10m or 1h")
    return total


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
