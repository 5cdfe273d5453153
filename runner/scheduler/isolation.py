"""Fault isolation inside a reconciler tick: one job's failure never stops the work of the others.

Every unit of per-job work (one job's launch, one launch answer, one cancel, one describe answer...) runs
through :meth:`UnitGuard.run`. An exception there is logged with the unit and the job id, counted, and the
rest of the tick goes on; the same unit of the same job is then skipped for a backoff that doubles with each
failure in a row (capped), so a job that keeps failing is not retried in a hot loop. A success clears it.
:meth:`UnitGuard.step` does the same for a whole worker of the tick (node watch, cancels, releases, launches):
a bug in one never keeps the others from running.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import structlog

log = structlog.get_logger(__name__)

UNIT_BACKOFF_BASE_SECONDS = 1.0
UNIT_BACKOFF_CAP_SECONDS = 300.0


def capped_doubling(base: float, failures: int, cap: float) -> float:
    """``base * 2 ** (failures - 1)``, at most ``cap``, for any count of failures (no float overflow)."""
    if failures <= 1:
        return min(base, cap)
    # Doublings past the one that reaches the cap change nothing: stop counting them before 2.0 ** n overflows.
    enough = max(0, math.ceil(math.log2(cap) - math.log2(base))) if base > 0 else 0
    return min(math.ldexp(base, min(failures - 1, enough)), cap)


@dataclass
class _Failing:
    failures: int
    until: float


@dataclass
class UnitGuard:
    base: float = UNIT_BACKOFF_BASE_SECONDS
    cap: float = UNIT_BACKOFF_CAP_SECONDS
    clock: Callable[[], float] = time.monotonic
    failures: int = 0  # every unit and step that raised, since the controller started
    _failing: dict[tuple[str, str], _Failing] = field(default_factory=dict)

    def run(self, unit: str, job_id: str, work: Callable[..., object], *args) -> bool:
        """Run ``work(*args)`` for ``job_id``; False when it raised or is backed off after raising before."""
        key = (unit, job_id)
        failing = self._failing.get(key)
        now = self.clock()
        if failing is not None and now < failing.until:
            return False
        try:
            work(*args)
        except Exception:  # noqa: BLE001 - one job's bug must not stop the tick for every other job
            count = failing.failures + 1 if failing is not None else 1
            delay = capped_doubling(self.base, count, self.cap)
            self._failing[key] = _Failing(count, now + delay)
            self.failures += 1
            log.exception("reconciler work failed for one job; the rest of the tick goes on", unit=unit,
                          job=job_id, failures_in_a_row=count, retry_in_seconds=round(delay, 1))
            return False
        self.succeeded(unit, job_id)
        return True

    def succeeded(self, unit: str, job_id: str) -> None:
        """``unit`` of ``job_id`` was done (by ``run``, or with other jobs' in one transaction): its backoff ends."""
        failing = self._failing.pop((unit, job_id), None)
        if failing is not None:
            log.info("reconciler work succeeded again", unit=unit, job=job_id, failures_in_a_row=failing.failures)

    def step(self, name: str, work: Callable[[], object]) -> None:
        """Run one worker of the tick; an exception is logged and counted, and the next worker runs."""
        try:
            work()
        except Exception:  # noqa: BLE001 - a bug in one worker must not keep the others from running
            self.failures += 1
            log.exception("reconciler worker failed; the other workers go on", worker=name)

    def backed_off(self, unit: str, job_id: str) -> bool:
        """Whether ``unit`` of ``job_id`` is skipped now after failing."""
        failing = self._failing.get((unit, job_id))
        return failing is not None and self.clock() < failing.until
