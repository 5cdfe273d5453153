"""Hand the job over to its next attempt as soon as the emergency checkpoint is durable.

After a notice the training process commits its emergency checkpoint, says ``stopping``, and then still
needs a second or so to exit (``close()``, interpreter teardown, log flush). Nothing of the next attempt
depends on that exit, so the agent tells the controller at once and the replacement node starts while
this process winds down; the controller keeps this node (``draining``) until its exit report, so no log
line is lost.

Two messages must both have arrived, in either order: the ``stopping`` acknowledgement saying the
checkpoint is durable, and the library's ``committed`` report of that step on the durable tier (under
``torchrun`` another rank may acknowledge before rank 0 reports the commit). The handover is queued
after that commit's report, so the controller always knows the checkpoint it hands to the next attempt.
"""

from __future__ import annotations

import threading
from typing import Callable


class Handover:
    """Sends one handover report, once the acknowledged emergency step is known to be durable."""

    def __init__(self, report: Callable[[dict], None]):
        self._report = report  # queues the report behind the checkpoint reports already sent (in order)
        self._lock = threading.Lock()
        self._acknowledged: dict | None = None
        self._durable_step = -1
        self._sent = False

    def on_committed(self, message: dict) -> None:
        """The library's ``committed`` message (any tier); only durable commits count."""
        step = message.get("step")
        if not message.get("durable") or not isinstance(step, int):
            return
        with self._lock:
            self._durable_step = max(self._durable_step, step)
            self._send_when_ready()

    def on_durable(self, ack: dict) -> None:
        """The ``stopping`` acknowledgement of the emergency checkpoint, which says it is durable."""
        with self._lock:
            self._acknowledged = ack
            self._send_when_ready()

    def _send_when_ready(self) -> None:
        ack = self._acknowledged
        if self._sent or ack is None or not isinstance(ack.get("step"), int) or self._durable_step < ack["step"]:
            return
        self._sent = True
        self._report({"step": ack["step"], "reason": ack.get("reason")})
