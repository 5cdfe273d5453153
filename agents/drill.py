"""The resume drill, agent side: prove early that checkpoint and resume work on this job.

At the drill time the agent runs the emergency path for real (checkpoint, stop), the controller opens
the next attempt on this same node, and the agent checks that the restarted process restores exactly
the drill's step from a manifest that verifies (the library verifies checksums while restoring).
Three ways to fail, each named: no checkpoint taken; checkpoint not restorable; a different step.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import structlog

from runner.protocol.messages import StopReason

from .emergency import ChildProcess
from .stop_with_checkpoint import StopPlan, StopWithCheckpoint, split_grace

log = structlog.get_logger(__name__)


def drill_plan(timeout: float) -> StopPlan:
    """The drill's stop: the answer within the drill's timeout, then 10 s to exit by itself (0.5 s unanswered)."""
    return StopPlan(StopReason.DRILL, timeout, exit_times=lambda acked, left: split_grace(10.0 if acked else 0.5))


NOT_CONNECTED = ("the job does not use runner.checkpoint (nothing connected to the control channel during the "
                 "whole attempt), so there is no checkpoint to prove")


class ResumeDrill:
    def __init__(self, send: Callable[[dict], int], trainee: ChildProcess, timeout: float = 120.0,
                 restore_timeout: float | None = None):
        self.supervisor = trainee.supervisor  # the current Supervisor
        self.timeout = timeout
        self.restore_timeout = restore_timeout if restore_timeout is not None else timeout
        self.triggered = False
        self.armed = False
        self._hello = threading.Event()  # the training process has connected to the control channel
        self.stop = StopWithCheckpoint(send, trainee, what="resume drill checkpoint")
        self._restored = threading.Event()
        self._restored_message: dict | None = None
        self._cancel = threading.Event()

    # --- phase 1: the drill checkpoint -------------------------------------------
    def on_hello(self) -> None:
        """The training process connected: the drill's clock starts now (loading data first costs it nothing)."""
        self._hello.set()

    def arm(self, after_seconds: float, may_run: Callable[[], bool]) -> None:
        """Trigger the drill ``after_seconds`` after the training process connects, if ``may_run()`` holds then."""
        self.armed = True

        def wait_then_trigger():
            while not self._hello.wait(0.5):
                if self._cancel.is_set():
                    return
            if not self._cancel.wait(after_seconds) and may_run():
                self._trigger()
        threading.Thread(target=wait_then_trigger, name="resume-drill", daemon=True).start()

    def disarm(self) -> None:
        self._cancel.set()

    @property
    def skipped(self) -> str | None:
        """Why an armed drill could not run in this attempt: only a job that never connected gets a verdict."""
        if self.armed and not self.triggered and not self._hello.is_set():
            return NOT_CONNECTED
        return None

    def _trigger(self) -> None:
        self.triggered = True
        self.stop.run(drill_plan(self.timeout))

    @property
    def ack(self) -> dict | None:
        return self.stop.ack

    @property
    def checkpoint_seconds(self) -> float:
        return self.stop.answer_seconds

    def outcome(self) -> dict:
        """What to report with the drill attempt's exit: the step to resume, or why no checkpoint exists."""
        if self.ack is None:
            return {"passed": False, "message": f"no checkpoint taken: the job did not acknowledge the drill "
                                                f"checkpoint within {self.timeout:.0f}s"}
        if not self.ack.get("durable"):
            return {"passed": False, "message": f"no checkpoint taken: the checkpoint at step {self.ack.get('step')} "
                                                "did not reach the durable tier"}
        return {"checkpoint_step": self.ack["step"], "seconds": self.checkpoint_seconds}

    # --- phase 2: the resumed attempt -------------------------------------------
    def on_restored(self, message: dict) -> None:
        self._restored_message = message
        self._restored.set()

    def verify_resume(self, expected_step: int, started: float) -> dict:
        """Wait for the restarted process to restore; compare with the drill's step."""
        supervisor = self.supervisor()
        deadline = time.monotonic() + self.restore_timeout
        while time.monotonic() < deadline and not self._restored.is_set():
            if supervisor.process.poll() is not None:
                break
            time.sleep(0.02)
        base = {"checkpoint_step": expected_step, "seconds": round(time.monotonic() - started, 3)}
        message = self._restored_message
        if message is None:
            code = supervisor.process.poll()
            why = f"it exited with code {code}" if code is not None else f"nothing within {self.restore_timeout:.0f}s"
            return {**base, "passed": False, "resumed_step": None,
                    "message": f"checkpoint not restorable: the restarted job never reported a restore ({why})"}
        step = int(message.get("step") or 0)
        if step == 0:
            return {**base, "passed": False, "resumed_step": 0,
                    "message": f"checkpoint not restorable: the restarted job found no checkpoint to restore "
                               f"(expected step {expected_step})"}
        if step != expected_step:
            return {**base, "passed": False, "resumed_step": step,
                    "message": f"a different step restored: {step} instead of {expected_step}"}
        return {**base, "passed": True, "resumed_step": step, "manifest": message.get("manifest")}
