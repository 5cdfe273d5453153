"""What follows the end of an attempt: a pure decision over the job's counters and limits."""

from __future__ import annotations

from .states import CANCELLED, FAILED, RECOVERING, SUCCEEDED


def next_state(end_reason: str, *, preemptions: int, failures: int, max_preemptions: int,
               max_failures: int) -> tuple[str, str]:
    """The job's next state and a one-line why, given counters *before* this attempt is counted."""
    if end_reason == "succeeded":
        return SUCCEEDED, "the job exited 0"
    if end_reason == "cancelled":
        return CANCELLED, "cancelled by the user"
    if end_reason == "drill":
        return RECOVERING, "resume drill: restarting from the drill checkpoint"
    if end_reason == "failed":
        if failures + 1 > max_failures:
            return FAILED, f"the job failed {failures + 1} time(s); recovery.max_failures is {max_failures}"
        return RECOVERING, f"the job failed; relaunching ({failures + 1} of {max_failures} allowed failures)"
    if end_reason in ("preempted", "lost"):
        what = "preempted" if end_reason == "preempted" else "lost its node without a notice"
        if preemptions + 1 > max_preemptions:
            return FAILED, f"the job was {what}; recovery.max_preemptions ({max_preemptions}) is used up"
        return RECOVERING, f"the job was {what}; relaunching from the last committed checkpoint"
    raise ValueError(f"unknown end reason {end_reason!r}")


def lost_seconds(end_reason: str, ended_at: float, running_at: float | None,
                 last_commit_at: float | None) -> float | None:
    """Seconds of work this attempt did that the next one must redo."""
    if end_reason in ("succeeded", "cancelled") or running_at is None:
        return 0.0 if end_reason == "succeeded" else None
    since = max(running_at, last_commit_at or running_at)
    return round(max(0.0, ended_at - since), 3)
