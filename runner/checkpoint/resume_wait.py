"""A process started before its attempt exists waits in ``restore()`` for the step to resume from.

On a replacement prepared during a notice, the agent starts the job's process as soon as `setup` is done
(agents/prestart.py), while the node on notice still trains: the interpreter starts, the imports run, the
model is built, all before the handover. Such a process has ``RUNNER_RESUME_WAIT=1`` and no
``RUNNER_RESUME_STEP`` (the emergency checkpoint is not taken yet). Its Checkpointer leaves no attempt
marker on the durable tier (that would fence off the node still training), and the first of ``restore()``,
``restore_folder()``, ``step()`` or ``save()`` says ``waiting`` on the control channel and blocks until the
agent's ``resume`` names the step the controller handed over. From there on it is an ordinary attempt: it
marks the durable folder, restores that step (fenced as always) and trains; the wait is not counted in its
restore time.

A signal that asks for a stop (SIGTERM, SIGUSR1) while it waits ends it: it has no attempt yet, so nothing to
save, and it exits as the signal's default would (128 + the signal's number). Else only SIGKILL could end it.
"""

from __future__ import annotations

import os
import signal
import threading

from runner.protocol import environment as env
from runner.protocol.messages import Waiting

from . import cuda_gate
from .errors import CheckpointError
from .log import get_logger

log = get_logger()

WAIT_VARIABLE = env.RESUME_WAIT
STEP_VARIABLE = env.RESUME_STEP


class ResumeWait:
    def __init__(self) -> None:
        self.pending = os.environ.get(WAIT_VARIABLE) == "1"
        self._word = threading.Event()
        self._step: int | None = None
        self._lost = False
        self._stopped_by: str | None = None  # the name of a signal that asked for a stop while waiting

    def on_resume(self, message: dict) -> None:
        """The agent's ``resume``: the attempt exists; ``step`` is what it resumes from (None: nothing)."""
        step = message.get("step")
        self._step = step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else None
        self._word.set()

    def on_lost(self) -> None:
        self._lost = True
        self._word.set()

    def on_stop_signal(self, name: str) -> None:
        """A signal's stop (from its handler: only flags here) while waiting ends the wait, and the process."""
        if self.pending:
            self._stopped_by = name
            self._word.set()

    def wait(self, send) -> int | None:
        """Say ``waiting`` and block until the word; the step handed over (None when there is none)."""
        local_ranks = os.environ.get("LOCAL_WORLD_SIZE", "")  # torchrun's: the agent waits for every local rank
        send(Waiting(os.getpid(), int(local_ranks) if local_ranks.isdigit() else None).to_json())
        self._word.wait()
        if self._stopped_by is not None:
            log.info("stopped by a signal while waiting for its attempt: nothing to save", signal=self._stopped_by)
            raise SystemExit(128 + signal.Signals[self._stopped_by])
        if self._lost and self._step is None:
            raise CheckpointError("the node agent went away before this process's attempt started; nothing to "
                                  "resume (the job runs elsewhere)")
        self.pending = False
        if self._step is not None:
            os.environ[STEP_VARIABLE] = str(self._step)
        os.environ.pop(WAIT_VARIABLE, None)
        cuda_gate.release()  # restore() came before any CUDA use: the word covers that hold too
        return self._step
