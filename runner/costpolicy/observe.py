"""What the scheduler measures of a job for the cost policy: its speed, its restarts, the zones' preemptions.

Pure functions of a job's rows (runner/state/rows.py) and a clock.
"""

from __future__ import annotations

from ..providers.offers import Offer
from ..spec.deadline import deadline_at
from ..spec.schema import JobSpec
from ..state.rows import Attempt, Job
from .throughput import Measurement

DEFAULT_RESTART_SECONDS = 300.0  # a launch and restore before any was measured
RATE_HISTORY_SECONDS = 7 * 86400.0  # the zone history the observed preemption rates are taken over


def has_deadline(spec: JobSpec) -> bool:
    """Whether the cost policy places this job: spot_policy auto with a deadline and total_steps."""
    recovery = spec.recovery
    return spec.resources.spot_policy == "auto" and bool(recovery.deadline) and bool(recovery.total_steps)


def job_deadline(job: Job) -> float:
    """The job's deadline in unix seconds (a duration counts from its submission)."""
    return deadline_at(job.spec.recovery.deadline, job.created_at)


def steps_per_second(job: Job, attempts: list[Attempt]) -> float | None:
    """Committed steps per second of work over the job's attempts, or None before a first checkpoint."""
    steps, seconds = 0.0, 0.0
    for attempt in attempts:
        done = _committed(job, attempt)
        if done is not None:
            steps += done[0]
            seconds += done[1]
    return steps / seconds if steps > 0 and seconds > 0 else None


def _committed(job: Job, attempt: Attempt) -> tuple[float, float] | None:
    """(steps committed, seconds running) of one attempt, or None when it committed nothing measurable."""
    start = attempt.running_at
    if not start:
        return None
    checkpoint = job.checkpoint or {}
    if attempt.end_reason == "running":
        if checkpoint.get("attempt") != attempt.attempt or not checkpoint.get("time"):
            return None
        end, reached = checkpoint["time"], checkpoint.get("step", 0)
    else:
        end, reached = attempt.ended_at, attempt.checkpoint_step
    if not end or reached is None or end <= start:
        return None
    return max(0, reached - attempt.resumed_from_step), end - start


def measurements(job: Job, attempts: list[Attempt], offers: list[Offer]) -> list[Measurement]:
    """The job's speed on each instance type it ran on, newest first: an attempt's reported training
    throughput (the checkpoint library's steps/s), else its committed steps over its running time.

    ``offers`` tell each type's accelerators; a type no offer names any more is left out."""
    kinds = {(o.cloud, o.instance_type): (o.accelerator, o.accelerator_count) for o in offers}
    found: dict[tuple[str, str], Measurement] = {}
    for attempt in reversed(attempts):
        key = (attempt.cloud, attempt.instance_type)
        if key in found or key not in kinds:
            continue
        rate = attempt.steps_per_second
        if not rate:
            done = _committed(job, attempt)
            rate = done[0] / done[1] if done and done[0] > 0 else None
        if rate:
            found[key] = Measurement(key[0], key[1], *kinds[key], float(rate))
    return list(found.values())


def restart_seconds(attempts: list[Attempt]) -> float:
    """The job's mean launch-to-running time, or DEFAULT_RESTART_SECONDS before one was measured."""
    spans = [a.running_at - a.started_at for a in attempts
             if a.running_at and a.running_at > a.started_at]
    return sum(spans) / len(spans) if spans else DEFAULT_RESTART_SECONDS


def preemption_rates(history: dict[str, tuple[int, float]]) -> dict[str, float]:
    """Preemptions per hour of spot held, per zone (an hour at least, so one early preemption is not 100/h)."""
    return {zone: count / max(seconds / 3600.0, 1.0) for zone, (count, seconds) in history.items()}
