"""When a periodic save is due: the one rule every mode of the Checkpointer asks (``step()`` and ``poll()``).

A save is due at every ``every_steps``-th step, or (without ``every_steps``) once the interval has passed on
this process's clock (interval.py), and never at a step that already has a good save. The two kinds are told
apart because under torch.distributed they are agreed differently: every rank reaches the same step, so a
step-count save needs no agreement, while each rank's clock runs on its own (agreement.py).
"""

from __future__ import annotations

from time import monotonic

from .interval import IntervalPolicy

AT_STEP = "step"    # every_steps: every rank reaches this step
ON_CLOCK = "clock"  # the interval has passed on this process's clock


def check_step(step) -> None:
    """A step number is a non-negative int (ValueError naming it otherwise)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")


class SaveSchedule:
    """Says whether a periodic save is due at a step; restarted by every save and every restore."""

    def __init__(self, every_steps: int | None, policy: IntervalPolicy, saved_at) -> None:
        self.every_steps = every_steps
        self.policy = policy
        self._saved_at = saved_at  # step -> bool: that step already has a good save
        self._next_due = monotonic() + policy.period()
        # Chosen once: due() runs at every training step.
        self.due = self._due_by_clock if every_steps is None else self._due_by_step

    def _due_by_clock(self, step: int) -> str | None:
        """``ON_CLOCK`` once the interval has passed (and ``step`` has no good save yet), else None."""
        if monotonic() < self._next_due or self._saved_at(step):
            return None
        return ON_CLOCK

    def _due_by_step(self, step: int) -> str | None:
        """``AT_STEP`` at every ``every_steps``-th step without a good save yet, else None."""
        if step % self.every_steps or self._saved_at(step):
            return None
        return AT_STEP

    def restart(self) -> None:
        """The interval counts from now (a save was taken, or the training resumed)."""
        self._next_due = monotonic() + self.policy.period()

    def saved(self, cost_s: float) -> None:
        """A save blocked the training ``cost_s`` seconds: measure it, and count the interval from now."""
        self.policy.record(cost_s=cost_s)
        self.restart()
