"""One stop with a checkpoint: ask the training process for a checkpoint and a stop, wait for its answer, then see
that it is gone. Every stop the agent makes goes this way; the callers choose a :class:`StopPlan` (the reason and
the deadline, and how the process ends):

- a terminal notice (agents/emergency.py): ``notice``, the notice's deadline less a margin;
- a cancel, a shutdown, a move to spot (agents/cancel.py): ``cancel`` or ``move``, the agent's stop grace;
- the resume drill (agents/drill.py): ``drill``, the drill's timeout;
- a gang whose attempt ended on another node (agents/main.py): no checkpoint (its ranks stopped at the gang's own).

The steps:

1. the request: a ``checkpoint`` message with ``stop`` and the deadline, to every connected training process. When
   none got it, the trainee hears of it another way (:meth:`Trainee.unreachable`: SIGTERM to the training process,
   which the library takes as a notice), or, where the plan says so, the wait is skipped;
2. the wait for the library's ``stopping`` (the checkpoint is committed, or given up), until the deadline less the
   plan's margin, or until the process is gone;
3. the end: the process gets some time to exit by itself, then SIGTERM to its process tree, then SIGKILL
   (:meth:`Trainee.finish`; a process in another container is the platform's to stop);
4. the summary: what was acknowledged (the step, whether it is durable), for the logs and the exit report.

A notice's stop spares a training that is over (``spares_finished_training``): when every local rank has closed its
Checkpointer after its last step, before the request or without answering it, there is nothing to save and no rank
is signalled; the process is left to exit by itself until the deadline less the margin, and only what still runs
then is ended. The job succeeded (agents/main.py reports it so).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import structlog

from runner.protocol.messages import CheckpointRequest

log = structlog.get_logger(__name__)
POLL_SECONDS = 0.02


class Trainee(Protocol):
    """The training process a stop is for, as far as the agent can reach it."""

    def running(self) -> bool:
        """Is there still a process that may acknowledge?"""

    def unreachable(self) -> None:
        """Nobody received the checkpoint request over the control channel."""

    def finish(self, own_exit: float, after_sigterm: float) -> None:
        """Let it exit by itself within ``own_exit`` seconds; then SIGTERM, and SIGKILL ``after_sigterm`` later."""

    def done_training(self) -> bool:
        """Has every training process closed after its last step, none stopped for a request?"""


def split_grace(grace: float) -> tuple[float, float]:
    """``grace`` seconds in all: to exit by itself, then (the last part of it, up to 2 s) after SIGTERM."""
    after_sigterm = min(2.0, grace / 2)
    return grace - after_sigterm, after_sigterm


@dataclass(frozen=True)
class StopPlan:
    """What a caller chooses: why, by when, and how the process ends once answered (or not)."""

    reason: str | None  # the request's reason (the training script reads it); None: no checkpoint is asked for
    seconds: float      # from now to the deadline the training process is told
    margin: float = 0.0  # the answer must have come this long before the deadline
    # Nobody got the request: wait all the same (the process may stop by its signal), or stop it at once.
    wait_when_unreachable: bool = True
    # (acknowledged, seconds to the deadline now) -> (seconds to exit by itself, seconds from SIGTERM to SIGKILL)
    exit_times: Callable[[bool, float], tuple[float, float]] = lambda acked, left: split_grace(max(0.5, left))
    # A training that is over (Trainee.done_training) is not asked, signalled or waited on: a notice's stop only.
    spares_finished_training: bool = False

    def request(self) -> CheckpointRequest:
        return CheckpointRequest(self.reason, stop=True, deadline=time.time() + self.seconds)


class StopWithCheckpoint:
    """Runs one stop; ``on_ack`` takes the library's ``stopping`` messages meant for it (agents/core.py routes them)."""

    def __init__(self, send: Callable[[dict], int], trainee: Trainee, what: str = "checkpoint and stop",
                 on_acknowledged: Callable[[dict], None] | None = None):
        self.send = send          # control channel: returns how many training processes got the message
        self.trainee = trainee
        self.what = what          # for the logs ("emergency checkpoint" logs "emergency checkpoint acknowledged")
        self.on_acknowledged = on_acknowledged
        self.acknowledged = threading.Event()
        self.ack: dict | None = None
        self.delivered = 0
        self.answer_seconds = 0.0  # from the request to the answer (or to the end of the wait)
        self.training_was_over = False  # the plan spared a training that had ended by itself

    def on_ack(self, message: dict) -> None:
        """The library's ``stopping``: the checkpoint asked for is committed (or given up)."""
        self.ack = message
        self.acknowledged.set()

    @property
    def durable(self) -> bool:
        return bool(self.ack and self.ack.get("durable"))

    def run(self, plan: StopPlan) -> None:
        """Request, wait, end; returns once the process has been made to end (or is the platform's to end)."""
        started = time.monotonic()
        deadline = started + plan.seconds
        spare = plan.spares_finished_training and plan.reason is not None
        if spare and self.trainee.done_training():
            log.info(f"{self.what} not requested: every training process had closed after its last step; the job's "
                     "process is left to exit by itself")
            self._wait(deadline - plan.margin)
        elif plan.reason is not None:
            self.delivered = self.send(plan.request().to_json())
            log.info(f"{self.what} requested", reason=plan.reason,
                     seconds_left=round(plan.seconds, 2), delivered_to=self.delivered)
            if self.delivered == 0 and plan.wait_when_unreachable:
                self.trainee.unreachable()
            if self.delivered or plan.wait_when_unreachable:
                self._wait(deadline - plan.margin)
        self.answer_seconds = time.monotonic() - started
        acked = self.acknowledged.is_set()
        self.training_was_over = spare and not acked and self.trainee.done_training()
        if self.training_was_over:
            if self.trainee.running():
                log.warning("the training is over, but its process still runs at the deadline's margin; ending it")
        elif acked:
            log.info(f"{self.what} acknowledged", step=self.ack.get("step"), durable=self.durable)
            if self.on_acknowledged is not None:
                self.on_acknowledged(self.ack)
        elif plan.reason is not None and self.trainee.running():
            log.error(f"{self.what}: no acknowledgement before the deadline margin", margin=round(plan.margin, 2))
        elif plan.reason is not None and self.delivered:
            log.warning(f"{self.what}: the training process went away without acknowledging the checkpoint")
        self.trainee.finish(*plan.exit_times(acked, deadline - time.monotonic()))

    def summary(self, what_happened: str) -> str:
        """One line for the restart log: the checkpoint's step and tier, or that none was acknowledged."""
        if self.ack is None:
            return f"{what_happened}: the job did not acknowledge the emergency checkpoint before the deadline"
        where = "durable" if self.durable else "local only (not durable before the deadline)"
        return f"{what_happened}: emergency checkpoint at step {self.ack.get('step')}, {where}"

    def _wait(self, until: float) -> None:
        while time.monotonic() < until and not self.acknowledged.is_set() and self.trainee.running():
            time.sleep(POLL_SECONDS)
