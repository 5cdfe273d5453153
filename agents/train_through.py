"""Training goes on through a notice whose deadline leaves time.

At such a notice the agent tells the controller it trains on (the notice report's ``prepare``), and the
controller launches the replacement at once (runner/scheduler/standby.py). The emergency checkpoint with
stop is then taken at the first of:

- the controller's word (heartbeat action ``checkpoint``): the replacement is ready to resume, or none is
  coming (the job does not prepare on notices, no offer fits, the replacement failed);
- the agent's own timer, at the deadline less the time an emergency checkpoint is expected to take once
  and a margin (max(3 s, 25 %)), plus the emergency stop's own margin (``reserve_seconds``): only its upload
  must be over before the reclaim, the replacement's
  download comes after. The agent then asks for a checkpoint with *hold* (runner/checkpoint/hold.py): the
  library commits the step, durable, and holds the training loop there. Training on would only make steps
  the replacement redoes; exiting would lose the node should the notice be false. The controller's word
  before the deadline stops the held job at once (its emergency checkpoint is that step, already durable);
  the reclaim ends it and the replacement resumes from that step; a node still running a few seconds
  after the deadline had a false notice, and the agent releases the hold: training goes on here and the
  controller releases the replacement.

A node of a gang (every rank stops at one agreed step: docs/multinode.md) trains on the same way while the
controller prepares the replacement of that node; the controller's word reaches only the node on notice, and
its request reaches every rank through the process group. Its timer does not hold (``hold`` false): the
library's hold blocks one process's training loop, and a gang's ranks would have to hold together. It takes
the emergency checkpoint with stop instead: every rank stops at one step, and the gang's next attempt waits
for the replacement (it takes over, ready or not) and resumes from that step, nothing redone. Should the
notice then prove false, the node on notice was given up for nothing; the gang lost no step.

The expected duration is the library's own measure (:class:`CheckpointClock`): from its recent commits, the
staging and upload an emergency checkpoint takes, or a default before the first durable commit. A notice
asks for a *timing* checkpoint (training on), two seconds in unless the controller's word came: one process
saves it the emergency way (uploaded from the staged buffer beside the local write, at the training's
priority: runner/checkpoint/persist.py), under the node's load of the moment, so its time to durable is what
the emergency checkpoint will take (a periodic commit, written locally first and uploaded after, leaves out
the local write that runs beside the emergency's upload: on a loaded node that one measured 6.8 s where the
emergency checkpoint took more than 11.4 s). A gang's ranks do so only before any timed commit (their
emergency checkpoint is written locally first, like a periodic one). The timer re-reads the expected
duration while it waits.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import structlog

from runner.protocol.messages import CheckpointRequest, Release, StopReason

from .emergency import safety_margin
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
    """How long an emergency checkpoint to the durable tier is expected to take, from the library's recent commits.

    One process's emergency checkpoint is uploaded from the staged buffer, beside its local write
    (runner/checkpoint/persist.py): it takes its staging and its upload, and the local disk is out of its path.
    A commit saved that way (an emergency or a timing checkpoint: ``from_buffer``) is timed as such. A
    periodic commit is written locally first, and reports both tiers' times from the start of the save (the
    durable one also its staging): its upload is the durable time less the local one, a lower bound (the
    emergency's local write runs beside its upload). The expected time is the slowest recent one, plus how
    far the recent ones spread (the slowest less the quickest): saves on a loaded node vary, and the moment
    the emergency checkpoint must start is sized on what they do at worst. A gang's checkpoint is written
    locally first, emergency or not (``from_buffer`` false): there it is the slowest recent durable commit,
    and the slowest local commit, which comes first, a floor."""

    def __init__(self, keep: int = 5, from_buffer: bool = True):
        self.from_buffer = from_buffer
        self._durable: deque[dict] = deque(maxlen=keep)
        self._local: deque[tuple[object, float]] = deque(maxlen=keep)  # (step, seconds)

    def observe(self, message: dict) -> None:
        seconds = _seconds(message.get("seconds"))
        if seconds is None:
            return
        if message.get("durable"):
            self._durable.append({"step": message.get("step"), "seconds": seconds,
                                  "staged": _seconds(message.get("staged_seconds")),
                                  "emergency": bool(message.get("emergency") or message.get("from_buffer"))})
        else:
            self._local.append((message.get("step"), seconds))

    def expected(self) -> float:
        if not self.from_buffer:
            durable = max((c["seconds"] for c in self._durable), default=DEFAULT_CHECKPOINT_SECONDS)
            return max(durable, max((s for _, s in self._local), default=0.0))
        if not self._durable:
            return DEFAULT_CHECKPOINT_SECONDS
        local = dict(self._local)
        times = [self._from_buffer(commit, local.get(commit["step"])) for commit in self._durable]
        return max(times) + (max(times) - min(times))

    @property
    def measured(self) -> bool:
        """Has a durable commit been timed? Before one, ``expected`` is a guess that a large state outgrows."""
        return bool(self._durable)

    @staticmethod
    def _from_buffer(commit: dict, local_seconds: float | None) -> float:
        """What this commit says an emergency from the staged buffer takes: staging plus upload."""
        if commit["emergency"] or commit["staged"] is None or local_seconds is None:
            return commit["seconds"]  # measured as such, or nothing to take the local write off with
        upload = max(0.0, commit["seconds"] - local_seconds)
        return commit["staged"] + upload


def _seconds(value) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        return None
    return float(value)


def lead_seconds(seconds_left: float | None, expected: float) -> float:
    """How long training may go on before the emergency checkpoint must start (<= 0: start it now)."""
    if seconds_left is None:
        return 0.0
    return seconds_left - reserve_seconds(expected)


def reserve_seconds(expected: float) -> float:
    """What the deadline must leave for the emergency checkpoint: its expected time once, plus a margin, plus
    what the emergency stop keeps back of the time left for the process's exit (``safety_margin``: the answer
    must come that long before the deadline). Without the last, a 7.6 s checkpoint started 10.9 s before the
    deadline was given up on 2.2 s before it, with its upload nearly done."""
    needed = expected + max(MARGIN_SECONDS, MARGIN_SHARE * expected)
    reserve = needed
    for _ in range(50):  # reserve = needed + safety_margin(reserve): the margin is a share of the time left
        reserve = needed + safety_margin(reserve)
    return reserve


def trains_through(notice: Notice, expected: float) -> bool:
    """A notice from the cloud whose deadline leaves time for more than the checkpoint."""
    return notice.source != "signal" and lead_seconds(notice.seconds_left(), expected) >= MIN_LEAD_SECONDS


class TrainThrough:
    """Waits for the controller's word or the timer, whichever comes first (see the module's doc)."""

    def __init__(self, notice: Notice, expected: float | Callable[[], float], stop_now: Callable[[Notice], None],
                 send: Callable[[dict], int], measure: Callable[[], None] | None = None, hold: bool = True):
        self.notice = notice
        self.hold = hold  # False for a gang's node: at the timer, the emergency checkpoint with stop
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
        self._done = threading.Event()  # the deadline passed (a false notice): no word is awaited any more

    def start(self) -> "TrainThrough":
        threading.Thread(target=self._run, name="train-through", daemon=True).start()
        return self

    def checkpoint_now(self) -> None:
        """The controller's word: the replacement is ready (or none is coming)."""
        self._word.set()

    @property
    def awaiting_word(self) -> bool:
        """Training on (or holding) until the controller's word, which has not come yet."""
        return not self._word.is_set() and not self._done.is_set()

    def _run(self) -> None:
        try:
            self._train_on_until_word_or_deadline()
        finally:
            self._done.set()

    def _train_on_until_word_or_deadline(self) -> None:
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
        if not self.hold:  # a gang's node: every rank stops at one step, with the emergency checkpoint
            log.warning("the deadline nears and the replacement is not ready: emergency checkpoint now",
                        seconds_left=round(deadline_unix - time.time(), 1),
                        expected_checkpoint_seconds=round(self.expected(), 2))
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
