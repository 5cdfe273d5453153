"""Notice → checkpoint → stop: the agent's side of a preemption.

On a terminal notice the agent asks the training process, through the control channel, for an
emergency checkpoint with the deadline; waits for its acknowledgement until the deadline minus a
margin; then SIGTERM, a short grace, SIGKILL. Without a control channel it sends SIGTERM to the
training process alone (the library treats it as a notice), never to the whole group, so DataLoader
workers are not interrupted mid-batch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

import structlog

from .watchers import Notice

log = structlog.get_logger(__name__)


def safety_margin(seconds_left: float) -> float:
    """Time kept back before the deadline for stopping the process and flushing logs."""
    return min(10.0, max(0.5, 0.2 * seconds_left))


class EmergencyStop:
    """Runs the emergency path once, for the first terminal notice."""

    def __init__(self, send: Callable[[dict], int], supervisor: Callable[[], object], training_pid: Callable[[], int | None],
                 default_grace: float = 30.0):
        self.send = send                    # control channel: returns how many processes got the message
        self.supervisor = supervisor        # the current Supervisor, or None
        self.training_pid = training_pid    # the pid that said hello on the control channel
        self.default_grace = default_grace
        self.acknowledged = threading.Event()
        self.ack: dict | None = None
        self.notice: Notice | None = None
        self._started = threading.Event()

    @property
    def active(self) -> bool:
        return self._started.is_set()

    def on_ack(self, message: dict) -> None:
        """The library's ``stopping`` message: the emergency checkpoint is committed (or given up)."""
        self.ack = message
        self.acknowledged.set()

    def start(self, notice: Notice) -> None:
        if self._started.is_set():
            return
        self._started.set()
        self.notice = notice
        threading.Thread(target=self._run, args=(notice,), name="emergency", daemon=True).start()

    def _run(self, notice: Notice) -> None:
        left = notice.seconds_left()
        left = self.default_grace if left is None else max(0.0, left)
        deadline = time.monotonic() + left
        deadline_unix = time.time() + left
        margin = safety_margin(left)
        message = {"op": "checkpoint", "reason": "notice", "deadline": deadline_unix, "stop": True}
        if self.send(message) == 0:
            self._signal_training_process()
        log.warning("preemption notice: emergency checkpoint requested", source=notice.source,
                    action=notice.action, seconds_left=round(left, 2))
        supervisor = self.supervisor()
        while time.monotonic() < deadline - margin:
            if self.acknowledged.is_set() or supervisor is None or supervisor.process.poll() is not None:
                break
            time.sleep(0.02)
        if self.acknowledged.is_set():
            log.info("emergency checkpoint acknowledged", ack=self.ack)
            grace = max(0.5, min(10.0, deadline - margin / 2 - time.monotonic()))  # let it exit by itself
        else:
            log.error("no acknowledgement before the deadline margin; stopping the job", margin=margin)
            grace = max(0.2, min(2.0, deadline - time.monotonic()))
        if supervisor is not None:
            supervisor.wait_or_stop(grace)

    def _signal_training_process(self) -> None:
        supervisor = self.supervisor()
        pid = self.training_pid() or (supervisor.pid if supervisor else None)
        if pid is None:
            return
        log.warning("no control channel: sending SIGTERM to the training process", pid=pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def rebalance_message(notice: Notice) -> dict:
    """An opportunistic checkpoint: training continues."""
    return {"op": "checkpoint", "reason": "rebalance", "deadline": None, "stop": False}
