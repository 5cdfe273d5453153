"""Sidecar mode: the agent beside a training process it did not start (a pod's native sidecar, a compose service).

The agent runs no setup and no run command. It serves the control channel in the folder it shares with the
training container, watches the cloud's notices, and on a terminal one asks every connected training process
for an emergency checkpoint with the deadline, then waits for the ``stopping`` acknowledgement until the
deadline less a margin. A rebalance or maintenance notice asks for an opportunistic checkpoint. It cannot
signal or stop a process in another container: the training container exits by itself once ``should_stop``
is set, or is stopped by its platform.

With ``controller_url`` and ``token`` it registers in the background (the control channel does not wait for
the controller), heartbeats, and reports notices, checkpoints and restores. The exit status of the training
container is not visible from here, so it reports the ends it can see: a preemption it handled, as soon as the
emergency path is over, and the training's end, once every connected training process has closed its
``Checkpointer`` (the library's ``closed`` message; the attempt ends ``succeeded``, exit code unknown). Of any
other end (a training process that predates ``closed``, or dies without closing) the controller learns only
when its provider says the node is gone. Without a controller it runs standalone and its log is the record.

It runs until SIGTERM (a native sidecar is stopped after the main container has exited) or SIGINT, and then
exits 0.
"""

from __future__ import annotations

import signal
import threading
import time

import structlog

from runner import sdnotify
from runner.protocol.actions import Action
from runner.protocol.events import EndReason
from runner.protocol.messages import Op

from .config import AgentConfig
from .core import AgentCore
from .emergency import AttachedProcesses, EmergencyStop
from .reporter import Reporter

log = structlog.get_logger(__name__)
REPORT_WAIT_SECONDS = 10.0  # at a stop signal, how long a preemption report under way may still take
ACTION_LOGS = {
    Action.CANCEL: "the controller asks to cancel the job: stop the training container (delete the pod); a sidecar "
              "does not stop a process it did not start",
    Action.SHUTDOWN: "the controller has ended this node's attempt; the sidecar keeps serving until it is stopped",
    Action.MOVE_TO_SPOT: "the controller moves the job from on-demand to spot; a sidecar does not stop a process "
                       "it did not start, so the node is released after the move's grace",
}


class Sidecar(AgentCore):
    def __init__(self, config: AgentConfig, reporter: Reporter | None = None):
        super().__init__(config, reporter)
        self.stopping = threading.Event()
        self._signalled = False  # set by the signal handler, which must take no lock
        self._last_action = Action.CONTINUE
        self._reported = threading.Event()
        self._ended = threading.Event()  # the training closed its Checkpointer: the attempt's end is reported
        self.on_op(Op.CLOSED, self._on_closed)

    def run(self) -> int:
        sdnotify.start_watchdog()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        path = self.config.control_socket
        try:
            self.control = self.open_control_channel()
        except OSError as exc:
            log.error("cannot serve the control channel; check that the shared volume is mounted and writable",
                      path=str(path), error=str(exc))
            return 1
        trainees = AttachedProcesses(self.control.trainees, path)
        self.emergency = EmergencyStop(self.send_control, trainees, on_finished=self._report_preemption)
        self.watch_loop = self.start_watchers()
        log.info("sidecar serving the control channel", path=str(path),
                 controller=None if self.reporter.standalone else self.config.controller_url)
        if not self.reporter.standalone:
            threading.Thread(target=self._register, name="register", daemon=True).start()
        sdnotify.ready()
        try:
            while not self._signalled:
                time.sleep(0.2)
            log.info("stop signal: the sidecar exits", connected=len(self.control.trainees()))
            if self.emergency.active or self._ended.is_set():
                self._reported.wait(REPORT_WAIT_SECONDS)  # a preemption or end report under way
        finally:
            self.stopping.set()
            sdnotify.stopping()
            self.stop_background()
        return 0

    def _on_signal(self, signum, frame) -> None:
        self._signalled = True

    def _register(self) -> None:
        assignment = self.reporter.register()
        if assignment is None:
            log.error("not registered with the controller: notices and checkpoints are only logged here")
            self.reporter = Reporter(None)
            return
        log.info("registered", job=assignment["job_id"], attempt=assignment["attempt"])
        self.reporter.heartbeats(self.config.heartbeat_seconds, self._status, self._on_action, self.stopping)

    def _status(self) -> dict:
        return {"phase": "running" if self.control.trainees() else "waiting", "progress": self.progress}

    def _on_action(self, action: str) -> None:
        if action != self._last_action and action in ACTION_LOGS:
            log.warning(ACTION_LOGS[action])
        self._last_action = action

    def _on_closed(self, message: dict) -> None:
        if message.get("error"):
            self._failed_close = True
        still = len(self.control.training())
        if still:
            log.info("a training process closed its Checkpointer; waiting for the others", still_training=still)
        else:
            self._training_ended()

    def _training_ended(self) -> None:
        """Every connected training process has closed its Checkpointer: unless a notice stopped it, the training
        is over, and the attempt ends (a preemption is reported by the emergency path instead)."""
        emergency = getattr(self, "emergency", None)
        if (emergency is not None and emergency.active) or self._ended.is_set():
            return
        self._ended.set()
        log.info("the training process closed its Checkpointer: the training has ended")
        threading.Thread(target=self._report_end, name="report-end", daemon=True).start()

    def _report_end(self) -> None:
        failed = getattr(self, "_failed_close", False)
        try:
            self.reporter.report_exit(EndReason.FAILED if failed else EndReason.SUCCEEDED, None,
                                      "the training process closed its Checkpointer "
                                      + ("after an exception " if failed else "")
                                      + "(a sidecar does not see its exit code)")
        finally:
            self._reported.set()

    def _report_preemption(self) -> None:
        """The emergency path is over: end the attempt as preempted (exit code unknown to a sidecar)."""
        try:
            self.reporter.report_exit(EndReason.PREEMPTED, None, self.emergency.summary())
        finally:
            self._reported.set()
