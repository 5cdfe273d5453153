"""Checkpoint, then hold: the last moment of a notice trained through while the replacement is not ready.

When a notice's deadline leaves just the time an emergency checkpoint needs and the replacement is still
booting, the agent asks for a checkpoint with ``hold``: the library saves the current step as an emergency
checkpoint, waits until it is durable, says ``holding`` and blocks the training loop in ``step()``. Training
on would only make steps the replacement must redo (the node is reclaimed at the deadline); exiting would
lose the node should the notice turn out false. The hold ends with one of:

- a stop request (the replacement is ready): the same step is the emergency checkpoint, already durable, so
  ``stopping`` is answered at once and the handover follows;
- ``release`` (the deadline passed and the node still runs: a false notice): training goes on here;
- the node's reclaim, which ends the process; the next attempt resumes from the held step;
- the hold's own limit (the agent's word never came): training goes on.
"""

from __future__ import annotations

import time

HOLD_LIMIT_S = 60.0  # past the deadline, a hold nobody ends is released (a lost agent: see agent_loss.py)


POLL_S = 0.02


class Hold:
    """Wakes the training thread, blocked in a hold, on ``release`` or on a stop request.

    Plain flags polled by the waiting thread, no lock: a signal handler (SIGTERM, a stop) may set them while
    that same thread is interrupted inside the wait."""

    def __init__(self) -> None:
        self._woken = False
        self.released = False

    def wake(self, release: bool = False) -> None:
        if release:
            self.released = True
        self._woken = True

    def wait(self, deadline_unix: float | None, stop_pending=lambda: False) -> None:
        """Block until woken (or ``stop_pending()``), or until the deadline plus the hold's limit."""
        limit = (deadline_unix if deadline_unix is not None else time.time()) + HOLD_LIMIT_S
        while not (self._woken or stop_pending()) and time.time() < limit:
            time.sleep(POLL_S)

    def reset(self) -> None:
        self._woken = False
        self.released = False
