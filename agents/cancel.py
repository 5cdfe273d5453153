"""A cancel, agent side: a stop with a checkpoint, like a notice, then the process group's end.

The same stop serves a move to spot (runner/scheduler/spot_return.py): the request's reason is ``move`` and the
exit reason ``moved``.
The user cancelled the job: the training process is asked over the control channel for a checkpoint and a
stop (``reason: cancel``, the same request as a notice's), and gets the grace to commit it and exit by itself.
Then, or at once when no training process is connected, the whole process group gets SIGTERM (a job that
traps it can save and wind down), the rest of the grace, and SIGKILL (agents/stop_with_checkpoint.py).
"""

from __future__ import annotations

from runner.protocol.actions import Action
from runner.protocol.messages import StopReason

from .stop_with_checkpoint import StopPlan

CANCEL_STOP_SECONDS = 10.0  # from hearing of the cancel to SIGKILL (the agent config's stop_grace_seconds)
SIGTERM_GRACE_SECONDS = 5.0  # at least this much of it is left for a SIGTERM handler


def cancel_plan(why: str, grace: float = CANCEL_STOP_SECONDS) -> StopPlan:
    """The stop for what the controller asked (cancel, shutdown, move): the answer by the grace less the part kept
    for a SIGTERM handler, then the time left to exit by itself, then SIGTERM to the process group."""

    def exit_times(acked: bool, left: float) -> tuple[float, float]:
        own_exit = max(0.0, left - SIGTERM_GRACE_SECONDS) if acked else 0.0
        return own_exit, max(SIGTERM_GRACE_SECONDS, left - own_exit)
    reason = StopReason.MOVE if why == Action.MOVE_TO_SPOT else StopReason.CANCEL  # the script's ckpt.stop_reason
    return StopPlan(reason, grace, margin=SIGTERM_GRACE_SECONDS, wait_when_unreachable=False, exit_times=exit_times)

