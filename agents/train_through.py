"""Training goes on through a notice whose deadline leaves time.

At such a notice the agent tells the controller it trains on (the notice report's ``prepare``), and the
controller launches the replacement at once (runner/scheduler/standby.py). The emergency checkpoint with
stop is then taken at the first of:

- the controller's word (heartbeat action ``checkpoint``): the replacement is ready to resume, or none is
  coming (the job does not prepare on notices, no offer fits, the replacement failed);
- the agent's own timer, at the deadline less the time an emergency checkpoint is expected to take once
  and a margin (max(3 s, 25 %)): only its upload must be over before the reclaim, the replacement's
  download comes after. The agent then asks for a checkpoint with *hold* (runner/checkpoint/hold.py): the
  library commits the step, durable, and holds the training loop there. Training on would only make steps
  the replacement redoes; exiting would lose the node should the notice be false. The controller's word
  before the deadline stops the held job at once (its emergency checkpoint is that step, already durable);
  the reclaim ends it and the replacement resumes from that step; a node still running a few seconds
  after the deadline had a false notice, and the agent releases the hold: training goes on here and the
  controller releases the replacement.

The expected duration is the library's own measure: the ``seconds`` of its recent durable commits (from the
start of the save to the commit on the durable tier), or a default before the first. A notice before any
timed commit asks for a checkpoint (training on) to time one, two seconds in unless the controller's word came,
and the timer re-reads the expected duration while it waits.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import structlog

from runner.protocol.messages import CheckpointRequest, Release, StopReason

from .watchers import Notice

log = structlog.get_logger(__name__)

DEFAULT_CHECKPOINT_SECONDS = 10.0  # no durable commit measured yet
MARGIN_SECONDS = 3.0               # on top of the expected duration: saves vary, the request takes time
MARGIN_SHARE = 0.25                # ... or this share of it, when larger
MIN_LEAD_SECONDS = 5.0             # less time than this to train on: stop at once, as before
FALSE_NOTICE_GRACE_SECONDS = 5.0   # still running this long after the deadline: the notice was false
RECHECK_SECONDS = 0.5              # how often the timer re-reads the expected checkpoint time
MEASURE_AFTER_SECONDS = 2.0        # no word from the controller by then: time a checkpoint (see TrainThrough)


class CheckpointClock:
    """How long an emergency checkpoint to the durable tier is expected to take: the slowest of the recent
    durable commits the library reported. A commit on the local tier comes before the durable one, so the
    slowest recent local commit is a floor (on a slow disk it is all there is to go by before the first
    durable commit)."""

    def __init__(self, keep: int = 5):
        self._seconds: deque[float] = deque(maxlen=keep)
        self._local: deque[float] = deque(maxlen=keep)

    def observe(self, message: dict) -> None:
        seconds = message.get("seconds")
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
            return
        (self._seconds if message.get("durable") else self._local).append(float(seconds))

    def expected(self) -> float:
        durable = max(self._seconds) if self._seconds else DEFAULT_CHECKPOINT_SECONDS
        return max(durable, max(self._local, default=0.0))

    @property
    def measured(self) -> bool:
        """Has a durable commit been timed? Before one, ``expected`` is a guess that a large state outgrows."""
        return bool(self._seconds)


def lead_seconds(seconds_left: float | None, expected: float) -> float:
    """How long training may go on before the emergency checkpoint must start (<= 0: start it now)."""
    if seconds_left is None:
        return 0.0
    return seconds_left - reserve_seconds(expected)


def reserve_seconds(expected: float) -> float:
    """What the deadline must leave for the emergency checkpoint: its expected time once, plus a margin."""
    return expected + max(MARGIN_SECONDS, MARGIN_SHARE * expected)


def trains_through(notice: Notice, expected: float) -> bool:
    """A notice from the cloud whose deadline leaves time for more than the checkpoint."""
    return notice.source != "signal" and lead_seconds(notice.seconds_left(), expected) >= MIN_LEAD_SECONDS


class TrainThrough:
    """Waits for the controller's word or the timer, whichever comes first (see the module's doc)."""

    def __init__(self, notice: Notice, expected: float | Callable[[], float], stop_now: Callable[[Notice], None],
                 send: Callable[[dict], int], measure: Callable[[], None] | None = None):
        self.notice = notice
        # No durable commit timed yet: ``measure`` asks for a checkpoint (training on) to time one, unless the
        # controller's word comes first (a job that does not prepare on notices hears it at once; a save then
        # would only hold up its emergency checkpoint).
        self.measure = measure
        # Read again while training goes on: a commit measured during the notice (see AgentCore.on_notice)
        # moves the moment the emergency checkpoint must start.
        self.expected = expected if callable(expected) else (lambda: expected)
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
        log.info("notice: training goes on while the replacement gets ready", seconds_left=round(left, 1),
                 checkpoint_in=round(lead_seconds(left, self.expected()), 1),
                 expected_checkpoint_seconds=round(self.expected(), 2))
        if self.measure is not None and not self._word.wait(min(MEASURE_AFTER_SECONDS, max(0.0, left))):
            self.measure()
        if self._wait_for_word_until_the_checkpoint_must_start(deadline_unix):
            log.info("the replacement is ready (or none is coming): emergency checkpoint now")
            self.stop_now(self.notice)
            return
        log.warning("the deadline nears and the replacement is not ready: durable checkpoint, then hold",
                    seconds_left=round(deadline_unix - time.time(), 1),
                    expected_checkpoint_seconds=round(self.expected(), 2))
        self.send(CheckpointRequest(StopReason.NOTICE, stop=False, deadline=deadline_unix, hold=True).to_json())
        if self._word.wait(max(0.0, deadline_unix - time.time())):
            log.info("the replacement is ready: the held job stops")
            self.stop_now(self.notice)
            return
        time.sleep(max(0.0, deadline_unix + FALSE_NOTICE_GRACE_SECONDS - time.time()))
        log.warning("the deadline passed and this node still runs: a false notice; training goes on")
        self.send(Release().to_json())

    def _wait_for_word_until_the_checkpoint_must_start(self, deadline_unix: float) -> bool:
        """True at the controller's word; False once the deadline leaves only the checkpoint's reserve, as
        the expected duration stands at each moment (re-read every RECHECK_SECONDS)."""
        while True:
            lead = lead_seconds(deadline_unix - time.time(), self.expected())
            if lead <= 0:
                return self._word.is_set()
            if self._word.wait(min(lead, RECHECK_SECONDS)):
                return True
