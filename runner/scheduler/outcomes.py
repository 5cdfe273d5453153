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
    if end_reason == "moved":  # the cost policy's choice: neither a preemption nor a failure
        return RECOVERING, "moved by the cost policy; relaunching from the last committed checkpoint"
    if end_reason == "drill":
        return RECOVERING, "resume drill: restarting from the drill checkpoint"
    if end_reason == "failed":
        if failures + 1 > max_failures:
            return FAILED, f"the job failed {failures + 1} time(s); recovery.max_failures is {max_failures}"
        return RECOVERING, f"the job failed; relaunching ({failures + 1} of {max_failures} allowed failures)"
    if end_reason in ("preempted", "lost"):
        what = "the job was preempted" if end_reason == "preempted" else "the job lost its node without a notice"
        if preemptions + 1 > max_preemptions:
            return FAILED, f"{what}; recovery.max_preemptions ({max_preemptions}) is used up"
        return RECOVERING, f"{what}; relaunching from the last committed checkpoint"
    raise ValueError(f"unknown end reason {end_reason!r}")


def lost_seconds(end_reason: str, ended_at: float, working_since: float | None,
                 last_commit_at: float | None, stopped_at_commit: bool = False) -> float | None:
    """Seconds of training this attempt did that the next one must redo.

    ``working_since``: when training began (the job's restore report, else the agent's registration);
    ``stopped_at_commit``: the attempt's last durable checkpoint was its emergency one, after which the
    loop stopped, so nothing after it is lost (the process's exit is not training).
    """
    if end_reason in ("succeeded", "cancelled") or working_since is None:
        return 0.0 if end_reason == "succeeded" else None
    if stopped_at_commit and last_commit_at is not None:
        return 0.0
    since = max(working_since, last_commit_at or working_since)
    return round(max(0.0, ended_at - since), 3)
