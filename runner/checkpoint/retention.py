"""What retention (``keep``) must never delete, and which checkpoints a superseded attempt left behind.

Besides the ``keep`` newest checkpoints, an attempt under the runner keeps:

- the step the controller handed it (``RUNNER_RESUME_STEP``): while this attempt has not had a newer one
  recorded by the controller, that is the step the controller hands the next attempt;
- the newest step the controller has recorded for this attempt (the agent says so: the control channel's
  ``recorded``): a node cut off from every controller may go on committing, but the step the controller
  knows stays restorable;
- the step it resumed from, and its own emergency checkpoint (what its handover names).

A checkpoint newer than where this attempt resumed, written by an *earlier* attempt, is a superseded
attempt's (it went on after the job had moved on): it is never the newest for retention and is removed.
A checkpoint written by a *later* attempt is never touched, and an attempt that is superseded prunes nothing
(durable.py's attempt markers tell it).
"""

from __future__ import annotations

import threading


class Retention:
    def __init__(self, attempt: int | None, handed_over: int | None) -> None:
        self.attempt = attempt
        self.handed_over = handed_over
        self._lock = threading.Lock()
        self._restored: int | None = None
        self._recorded: int | None = None
        self._emergency: int | None = None

    def restored(self, step: int | None) -> None:
        with self._lock:
            self._restored = step

    def recorded(self, step: int) -> None:
        """The controller recorded this durable checkpoint of ours (the agent forwards its answer)."""
        with self._lock:
            self._recorded = step if self._recorded is None else max(self._recorded, step)

    def emergency(self, step: int) -> None:
        with self._lock:
            self._emergency = step

    def protected(self) -> frozenset[int]:
        """Steps retention keeps whatever ``keep`` says."""
        with self._lock:
            return frozenset(s for s in (self.handed_over, self._recorded, self._restored, self._emergency)
                             if s)

    def stale_above(self) -> int | None:
        """An earlier attempt's checkpoints above this step are a superseded attempt's; None: nothing is
        known to be stale (outside the runner, or a first attempt handed nothing)."""
        if self.attempt is None or self.handed_over is None:
            return None
        with self._lock:
            return max(self.handed_over, self._restored or 0)
