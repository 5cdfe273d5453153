"""When the next periodic checkpoint is due.

``auto`` follows Young/Daly: T = sqrt(2 * C * M), where C is the measured cost a checkpoint puts on the
training (the time ``save`` blocks it) and M the mean time between failures that come *without* a notice
(default 6 h, ``RUNNER_MTBF_SECONDS`` overrides). T is never shorter than one save plus upload (so saves
do not queue) nor than 100 * C (at most 1 % overhead). Before the first measurement the period is
``FIRST_INTERVAL_S``.
"""

from __future__ import annotations

import math
import os

from ..durations import parse_duration as parse_any_duration
from ..protocol import environment as env

DEFAULT_MTBF_S = 6 * 3600.0
FIRST_INTERVAL_S = 300.0
MAX_OVERHEAD = 0.01


def parse_duration(value) -> float:
    """Seconds of a positive checkpoint interval: 30, "30s", "10m", "1h"; ValueError with an example otherwise."""
    seconds = parse_any_duration(value)
    if seconds <= 0 or math.isinf(seconds) or math.isnan(seconds):
        raise ValueError(f"{value!r}: a checkpoint interval must be a positive duration such as 30s, 10m or 1h")
    return seconds


def mtbf_from_env() -> float:
    raw = os.environ.get(env.MTBF_SECONDS)
    if not raw:
        return DEFAULT_MTBF_S
    try:
        return parse_duration(raw)
    except ValueError:
        return DEFAULT_MTBF_S


class IntervalPolicy:
    """The period between periodic checkpoints, fixed or derived from measurements."""

    def __init__(self, fixed_s: float | None, mtbf_s: float) -> None:
        self.fixed_s = fixed_s
        self.mtbf_s = mtbf_s
        self.cost_s: float | None = None  # smoothed blocking time of a save
        self.commit_s: float | None = None  # smoothed time from save to durable commit

    def record(self, cost_s: float | None = None, commit_s: float | None = None) -> None:
        if cost_s is not None:
            self.cost_s = cost_s if self.cost_s is None else 0.7 * self.cost_s + 0.3 * cost_s
        if commit_s is not None:
            self.commit_s = commit_s if self.commit_s is None else 0.7 * self.commit_s + 0.3 * commit_s

    def period(self) -> float:
        if self.fixed_s is not None:
            return self.fixed_s
        if self.cost_s is None:
            return FIRST_INTERVAL_S
        young_daly = math.sqrt(2.0 * self.cost_s * self.mtbf_s)
        return max(young_daly, self.commit_s or 0.0, self.cost_s / MAX_OVERHEAD)
