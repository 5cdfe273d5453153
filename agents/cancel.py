"""A cancel, agent side: a stop with a checkpoint, like a notice, then the process group's end.

The same stop serves a move to spot (runner/scheduler/spot_return.py): the request's reason is ``move`` and the
exit reason ``moved``.
The user cancelled the job: the training process is asked over the control channel for a checkpoint and a
stop (``reason: cancel``, the same request as a notice's), and gets the grace to commit it and exit by itself.
Then, or at once when no training process is connected, the whole process group gets SIGTERM (a job that
traps it can save and wind down), the rest of the grace, and SIGKILL.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import structlog

log = structlog.get_logger(__name__)
CANCEL_STOP_SECONDS = 10.0  # from hearing of the cancel to SIGKILL (the agent config's stop_grace_seconds)
SIGTERM_GRACE_SECONDS = 5.0  # at least this much of it is left for a SIGTERM handler


class CancelStop:
    """Stops the agent's current process for a cancel; ``run()`` returns once it has exited."""

    def __init__(self, send: Callable[[dict], int], supervisor: Callable[[], object],
                 grace: float = CANCEL_STOP_SECONDS, why: str = "cancel"):
        self.send = send              # control channel: how many training processes got the message
        self.why = why                # what the controller asked for (cancel, shutdown, move): for the logs
        self.supervisor = supervisor  # the current Supervisor
        self.grace = grace
        self.ack: dict | None = None
        self._acked = threading.Event()

    def on_ack(self, message: dict) -> None:
        """The library's ``stopping``: the checkpoint asked for is committed (or given up)."""
        self.ack = message
        self._acked.set()

    def run(self) -> None:
        supervisor = self.supervisor()
        if supervisor is None:
            return
        deadline = time.monotonic() + self.grace
        reason = "move" if self.why == "move" else "cancel"  # the training script reads it (ckpt.stop_reason)
        request = {"op": "checkpoint", "reason": reason, "deadline": time.time() + self.grace, "stop": True}
        delivered = self.send(request)
        log.info("stopping the job with a checkpoint", why=self.why, checkpoint_requested_from=delivered,
                 grace_seconds=self.grace)
        if delivered:
            self._wait(lambda: self._acked.is_set(), supervisor, deadline - SIGTERM_GRACE_SECONDS)
            if self._acked.is_set():
                log.info("stop: checkpoint committed", why=self.why, step=self.ack.get("step"),
                         durable=self.ack.get("durable"))
                self._wait(lambda: False, supervisor, deadline - SIGTERM_GRACE_SECONDS)  # let it exit by itself
        if supervisor.process.poll() is None:
            supervisor.stop(max(SIGTERM_GRACE_SECONDS, deadline - time.monotonic()))

    @staticmethod
    def _wait(done: Callable[[], bool], supervisor, until: float) -> None:
        while time.monotonic() < until and not done() and supervisor.process.poll() is None:
            time.sleep(0.02)
