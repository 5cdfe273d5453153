"""Notice → checkpoint → stop: the agent's side of a preemption.

On a terminal notice the agent asks the training process, through the control channel, for an
emergency checkpoint with the deadline, and waits for its acknowledgement until the deadline minus a
margin. What happens around that depends on who started the training process:

* :class:`ChildProcess` (supervise mode): the agent's own child. Without a control channel it gets
  SIGTERM (the library treats it as a notice), the training process alone, never the whole group, so
  DataLoader workers are not interrupted mid-batch; after the acknowledgement or the deadline it is
  stopped: SIGTERM, a short grace, SIGKILL.
* :class:`AttachedProcesses` (sidecar mode): processes in another container, known only by their
  connection. There is nothing to signal or stop; the platform stops their container.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Protocol

import structlog

from .watchers import Notice

log = structlog.get_logger(__name__)


def safety_margin(seconds_left: float) -> float:
    """Time kept back before the deadline for stopping the process and flushing logs."""
    return min(10.0, max(0.5, 0.2 * seconds_left))


class Trainee(Protocol):
    """The training process the emergency path is for, as far as the agent can reach it."""

    def running(self) -> bool:
        """Is there still a process that may acknowledge?"""

    def unreachable(self) -> None:
        """Nobody received the checkpoint request over the control channel."""

    def finish(self, grace: float) -> None:
        """The acknowledgement came (or the deadline margin did): let it exit within ``grace`` seconds."""


class ChildProcess:
    """The job's process, started by this agent (supervise mode)."""

    def __init__(self, supervisor: Callable[[], object], training_pid: Callable[[], int | None]):
        self.supervisor = supervisor        # the current Supervisor, or None
        self.training_pid = training_pid    # the pid that said hello on the control channel

    def running(self) -> bool:
        supervisor = self.supervisor()
        return supervisor is not None and supervisor.process.poll() is None

    def unreachable(self) -> None:
        supervisor = self.supervisor()
        pid = self.training_pid() or (supervisor.pid if supervisor else None)
        if pid is None:
            return
        log.warning("no control channel: sending SIGTERM to the training process", pid=pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def finish(self, grace: float) -> None:
        supervisor = self.supervisor()
        if supervisor is not None:
            supervisor.wait_or_stop(grace)


class AttachedProcesses:
    """Training processes in other containers, connected to the control channel (sidecar mode)."""

    def __init__(self, connected: Callable[[], list[dict]], socket_path: Path):
        self.connected = connected  # the hello of every training process connected now
        self.socket_path = socket_path

    def running(self) -> bool:
        return bool(self.connected())

    def unreachable(self) -> None:
        log.warning("no training process is connected to the control channel, so nothing takes an emergency "
                    "checkpoint: a sidecar cannot signal a process in another container (unless the pod shares "
                    "its process namespace); the training container only gets the platform's SIGTERM",
                    socket=str(self.socket_path))

    def finish(self, grace: float) -> None:
        pass  # it exits by itself once should_stop is set; its container is the platform's to stop


class EmergencyStop:
    """Runs the emergency path once, for the first terminal notice."""

    def __init__(self, send: Callable[[dict], int], trainee: Trainee, default_grace: float = 30.0,
                 on_finished: Callable[[], None] | None = None, on_durable: Callable[[dict], None] | None = None):
        self.send = send                    # control channel: returns how many training processes got the message
        self.trainee = trainee
        self.default_grace = default_grace
        self.on_finished = on_finished
        # The emergency checkpoint is on the durable tier: the next attempt need not wait for this process to exit.
        self.on_durable = on_durable
        self.acknowledged = threading.Event()
        self.finished = threading.Event()
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

    def summary(self) -> str:
        """One line for the restart log: the checkpoint's step and tier, or that none was acknowledged."""
        if self.ack is None:
            return "preempted: the job did not acknowledge the emergency checkpoint before the deadline"
        where = "durable" if self.ack.get("durable") else "local only (not durable before the deadline)"
        return f"preempted: emergency checkpoint at step {self.ack.get('step')}, {where}"

    def _run(self, notice: Notice) -> None:
        left = notice.seconds_left()
        left = self.default_grace if left is None else max(0.0, left)
        deadline = time.monotonic() + left
        deadline_unix = time.time() + left
        margin = safety_margin(left)
        message = {"op": "checkpoint", "reason": "notice", "deadline": deadline_unix, "stop": True}
        delivered = self.send(message)
        if delivered == 0:
            self.trainee.unreachable()
        log.warning("preemption notice: emergency checkpoint requested", source=notice.source,
                    action=notice.action, seconds_left=round(left, 2), delivered_to=delivered)
        while time.monotonic() < deadline - margin:
            if self.acknowledged.is_set() or not self.trainee.running():
                break
            time.sleep(0.02)
        if self.acknowledged.is_set():
            log.info("emergency checkpoint acknowledged", step=self.ack.get("step"), durable=self.ack.get("durable"))
            if self.ack.get("durable") and self.on_durable is not None:
                self.on_durable(self.ack)
            grace = max(0.5, min(10.0, deadline - margin / 2 - time.monotonic()))  # let it exit by itself
        else:
            if self.trainee.running():
                log.error("no acknowledgement before the deadline margin", margin=round(margin, 2))
            elif delivered:
                log.warning("the training process went away without acknowledging the emergency checkpoint")
            grace = max(0.2, min(2.0, deadline - margin / 2 - time.monotonic()))  # the exit report before the deadline
        try:
            self.trainee.finish(grace)
        finally:
            self.finished.set()
            if self.on_finished is not None:
                self.on_finished()


def rebalance_message(notice: Notice) -> dict:
    """An opportunistic checkpoint: training continues."""
    return {"op": "checkpoint", "reason": "rebalance", "deadline": None, "stop": False}
