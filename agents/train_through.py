"""Training goes on through a notice whose deadline leaves time.

At such a notice the agent tells the controller it trains on (the notice report's ``prepare``), and the
controller launches the replacement at once (runner/scheduler/standby.py). The emergency checkpoint with
stop is then taken at the first of:

- the controller's word (heartbeat action ``checkpoint``): the replacement is ready to resume, or none is
  coming (the job does not prepare on notices, no offer fits, the replacement failed);
- the agent's own timer, at the deadline less the time an emergency checkpoint is expected to take and a
  margin, so that a slow or unreachable controller never costs the checkpoint. The checkpoint taken then
  does not stop training: if the node is reclaimed, the replacement resumes from it (nothing after it is
  lost that stopping would have saved); if the notice was false, the job has lost nothing at all. Should
  the controller still say ``checkpoint`` before the deadline, the emergency stop follows.

The expected duration is the library's own measure: the ``seconds`` of its recent durable commits (from the
start of the save to the commit on the durable tier), or a conservative default before the first.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import structlog

from .watchers import Notice

log = structlog.get_logger(__name__)

DEFAULT_CHECKPOINT_SECONDS = 10.0  # no durable commit measured yet
MARGIN_SECONDS = 5.0               # on top of twice the expected duration: saves vary, the heartbeat takes time
MIN_LEAD_SECONDS = 5.0             # less time than this to train on: stop at once, as before


class CheckpointClock:
    """How long an emergency checkpoint to the durable tier is expected to take: the slowest of the recent
    durable commits the library reported."""

    def __init__(self, keep: int = 5):
        self._seconds: deque[float] = deque(maxlen=keep)

    def observe(self, message: dict) -> None:
        seconds = message.get("seconds")
        if message.get("durable") and isinstance(seconds, (int, float)) and not isinstance(seconds, bool) \
                and seconds >= 0:
            self._seconds.append(float(seconds))

    def expected(self) -> float:
        return max(self._seconds) if self._seconds else DEFAULT_CHECKPOINT_SECONDS


def lead_seconds(seconds_left: float | None, expected: float) -> float:
    """How long training may go on before the emergency checkpoint must start (<= 0: start it now)."""
    if seconds_left is None:
        return 0.0
    return seconds_left - (2 * expected + MARGIN_SECONDS)


def trains_through(notice: Notice, expected: float) -> bool:
    """A notice from the cloud whose deadline leaves time for more than the checkpoint."""
    return notice.source != "signal" and lead_seconds(notice.seconds_left(), expected) >= MIN_LEAD_SECONDS


class TrainThrough:
    """Waits for the controller's word or the timer, whichever comes first (see the module's doc)."""

    def __init__(self, notice: Notice, expected: float, stop_now: Callable[[Notice], None],
                 send: Callable[[dict], int]):
        self.notice = notice
        self.expected = expected
        self.stop_now = stop_now  # the emergency path: checkpoint, stop, hand over
        self.send = send          # the control channel
        self._word = threading.Event()

    def start(self) -> "TrainThrough":
        threading.Thread(target=self._run, name="train-through", daemon=True).start()
        return self

    def checkpoint_now(self) -> None:
        """The controller's word: the replacement is ready (or none is coming)."""
        self._word.set()

    def _run(self) -> None:
        left = self.notice.seconds_left() or 0.0
        deadline_unix = time.time() + left
        lead = lead_seconds(left, self.expected)
        log.info("notice: training goes on while the replacement gets ready", seconds_left=round(left, 1),
                 checkpoint_in=round(lead, 1), expected_checkpoint_seconds=round(self.expected, 2))
        if self._word.wait(max(0.0, lead)):
            log.info("the replacement is ready (or none is coming): emergency checkpoint now")
            self.stop_now(self.notice)
            return
        log.warning("the deadline nears with no word from the controller: a durable checkpoint now; training "
                    "goes on until the node is reclaimed", seconds_left=round(deadline_unix - time.time(), 1))
        self.send({"op": "checkpoint", "reason": "notice", "deadline": deadline_unix, "stop": False})
        if self._word.wait(max(0.0, deadline_unix - time.time() - self.expected)):
            self.stop_now(self.notice)
