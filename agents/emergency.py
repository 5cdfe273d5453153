"""Notice → checkpoint → stop: the agent's side of a preemption.

On a terminal notice the agent asks the training process, through the control channel, for an
emergency checkpoint with the deadline, and waits for its acknowledgement until the deadline minus a
margin (a stop with a checkpoint: agents/stop_with_checkpoint.py). What happens around that depends on who
started the training process:

* :class:`ChildProcess` (supervise mode): the agent's own child. Without a control channel it gets
  SIGTERM (the library treats it as a notice), the training process alone, never the whole group, so
  DataLoader workers are not interrupted mid-batch; after the acknowledgement or the deadline it is
  stopped: SIGTERM, a short grace, SIGKILL. A training that is over (every rank closed after its last step) is
  neither asked nor signalled: the job ended during the notice, and its process is left to exit.
* :class:`AttachedProcesses` (sidecar mode): processes in another container, known only by their
  connection. There is nothing to signal or stop; the platform stops their container.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Callable

import structlog

from runner.protocol.messages import CheckpointRequest, StopReason

from .stop_with_checkpoint import StopPlan, StopWithCheckpoint, Trainee, split_grace
from .watchers import Notice

log = structlog.get_logger(__name__)


def safety_margin(seconds_left: float) -> float:
    """Time kept back before the deadline for stopping the process and flushing logs."""
    return min(10.0, max(0.5, 0.2 * seconds_left))


class ChildProcess:
    """The job's process, started by this agent (supervise mode)."""

    def __init__(self, supervisor: Callable[[], object], training_pid: Callable[[], int | None],
                 done_training: Callable[[], bool] = lambda: False):
        self.supervisor = supervisor        # the current Supervisor, or None
        self.training_pid = training_pid    # the pid that said hello on the control channel
        self._done_training = done_training  # every local rank closed after its last step (StopProgress)

    def running(self) -> bool:
        supervisor = self.supervisor()
        return supervisor is not None and supervisor.process.poll() is None

    def done_training(self) -> bool:
        return self._done_training()

    def unreachable(self) -> None:
        supervisor = self.supervisor()
        pid = self.training_pid() or (supervisor.pid if supervisor else None)
        if pid is None or self.done_training():  # (it closed after its last step just as the request went out)
            return
        log.warning("no control channel: sending SIGTERM to the training process", pid=pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def finish(self, own_exit: float, after_sigterm: float) -> None:
        supervisor = self.supervisor()
        if supervisor is not None:
            supervisor.wait_then_stop(own_exit, after_sigterm)


class AttachedProcesses:
    """Training processes in other containers, connected to the control channel (sidecar mode)."""

    def __init__(self, connected: Callable[[], list[dict]], socket_path: Path):
        self.connected = connected  # the hello of every training process connected now
        self.socket_path = socket_path

    def running(self) -> bool:
        return bool(self.connected())

    def done_training(self) -> bool:
        return False  # the sidecar ends the attempt itself once every process closed (agents/sidecar.py)

    def unreachable(self) -> None:
        log.warning("no training process is connected to the control channel, so nothing takes an emergency "
                    "checkpoint: a sidecar cannot signal a process in another container (unless the pod shares "
                    "its process namespace); the training container only gets the platform's SIGTERM",
                    socket=str(self.socket_path))

    def finish(self, own_exit: float, after_sigterm: float) -> None:
        pass  # it exits by itself once should_stop is set; its container is the platform's to stop


class EmergencyStop:
    """Runs the emergency path once, for the first terminal notice: a :class:`StopWithCheckpoint` for the
    notice's deadline."""

    def __init__(self, send: Callable[[dict], int], trainee: Trainee, default_grace: float = 30.0,
                 on_finished: Callable[[], None] | None = None, on_durable: Callable[[dict], None] | None = None):
        self.default_grace = default_grace
        self.on_finished = on_finished
        # The emergency checkpoint is on the durable tier: the next attempt need not wait for this process to exit.
        self.on_durable = on_durable
        self.stop = StopWithCheckpoint(send, trainee, what="emergency checkpoint", on_acknowledged=self._acknowledged)
        self.finished = threading.Event()
        self.notice: Notice | None = None
        self._started = threading.Event()

    @property
    def active(self) -> bool:
        return self._started.is_set()

    @property
    def ack(self) -> dict | None:
        return self.stop.ack

    def on_ack(self, message: dict) -> None:
        """The library's ``stopping`` message: the emergency checkpoint is committed (or given up)."""
        self.stop.on_ack(message)

    def start(self, notice: Notice) -> None:
        if self._started.is_set():
            return
        self._started.set()
        self.notice = notice
        threading.Thread(target=self._run, args=(notice,), name="emergency", daemon=True).start()

    def summary(self) -> str:
        """One line for the restart log: the checkpoint's step and tier, or that none was acknowledged."""
        return self.stop.summary("preempted")

    def _acknowledged(self, ack: dict) -> None:
        if ack.get("durable") and self.on_durable is not None:
            self.on_durable(ack)

    def _run(self, notice: Notice) -> None:
        left = notice.seconds_left()
        left = self.default_grace if left is None else max(0.0, left)
        log.warning("preemption notice", source=notice.source, action=notice.action,
                    seconds_left=round(left, 2))
        try:
            self.stop.run(notice_plan(left))
        finally:
            self.finished.set()
            if self.on_finished is not None:
                self.on_finished()


def notice_plan(seconds_left: float) -> StopPlan:
    """The emergency path's stop: the answer by the deadline less a margin; then, acknowledged, up to 10 s to exit
    by itself, else the exit report before the deadline (each within half the margin)."""
    margin = safety_margin(seconds_left)

    def exit_times(acked: bool, left: float) -> tuple[float, float]:
        grace = max(0.5, min(10.0, left - margin / 2)) if acked else max(0.2, min(2.0, left - margin / 2))
        return split_grace(grace)
    return StopPlan(StopReason.NOTICE, seconds_left, margin=margin, exit_times=exit_times,
                    spares_finished_training=True)


def rebalance_message(notice: Notice) -> dict:
    """An opportunistic checkpoint: training continues."""
    return CheckpointRequest(StopReason.REBALANCE, stop=False).to_json()
