"""One decision for every rank at every step: save now, stop now, or go on.

A notice reaches one node (or SIGTERM one rank), a periodic save falls due on each rank's own clock, yet
every rank must save and stop at the same step. At each ``step()`` every rank contributes what it knows
to a one-number all-reduce on a gloo side group, started with ``async_op=True`` and read at the *next*
step, by which time it has long finished. So agreeing costs the training one non-blocking collective
launch per step and no wait; the price is that a request is acted on one step after the step in which it
arrived, on every rank alike.

The number is one int64, reduced with bitwise OR (``Word`` below): a stop flag, a save-due flag, one bit
per request reason (the strongest set bit wins), one bit per proposed round spacing (the widest wins),
and the step's low 24 bits beside their complement. OR gives "any rank wants it" for the flags and
reasons; for the step, every rank agreeing on it is exactly "no bit set in both halves", so ranks that
call ``step()`` at different steps are told so. Why one word: gloo's ring all-reduce costs about four times
as much for six elements as for one at four ranks (benchmarks/distributed_checkpoint.py), and that is paid
on every round. The one thing OR cannot give, the earliest deadline of a stop request, is agreed by a
second, blocking all-reduce (MAX of the negated deadline) in the round that carries a request, which every
rank enters at the same step since every rank decoded the same word: a few times per job, not per step.

**Rounds are spaced.** A round costs a collective launch and a wait for the previous one even when it is
long done (hundreds of microseconds on a busy CPU), so short steps would pay a few percent for it. Each
rank proposes how many steps a round should span so that rounds come about every ``ROUND_SPACING_S``
(from its own step times, a power of two up to ``MAX_STEPS_PER_ROUND``); the widest proposal wins, and
every rank, having decoded the same word, starts the next round at the same step. Steps of 50 ms or more
keep a round per step; shorter ones act on a request a few tens of milliseconds later than they would
otherwise, far inside any notice's deadline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .control import CheckpointRequest
from .errors import CheckpointError

# Weakest first: when ranks have different reasons, the strongest one is reported. "interval" is the
# absence of a request (a periodic save is the save-due flag), so it has no bit.
REASONS = ("interval", "rebalance", "drill", "cancel", "SIGUSR1", "SIGTERM", "notice")


ROUND_SPACING_S = 0.05     # aim for a round about this often
MAX_STEPS_PER_ROUND = 16   # bounds how late a request is acted on if steps suddenly become slow


def reason_code(reason: str | None) -> int:
    return REASONS.index(reason) if reason in REASONS else REASONS.index("notice")


def steps_per_round(step_seconds: float | None) -> int:
    """A power of two, so that a round spans about ROUND_SPACING_S of steps (1 while the step time is unknown)."""
    if not step_seconds or step_seconds <= 0:
        return 1
    every = 1
    while every < MAX_STEPS_PER_ROUND and every * step_seconds < ROUND_SPACING_S:
        every *= 2
    return every


class Word:
    """The bit layout of a round's int64 (bit 63, the sign, is left clear). Steps are compared on their low
    24 bits: ranks out of step by a multiple of 2**24 would pass, ranks out by a few never do."""

    STOP = 1 << 0
    SAVE = 1 << 1
    REASON_SHIFT = 1                      # reason i (1..6) is bit REASON_SHIFT + i: bits 2..7
    SPACING_SHIFT = 8                     # 2**k steps per round is bit SPACING_SHIFT + k: bits 8..14
    SPACING_BITS = 7
    STEP_BITS = 24
    STEP_MASK = (1 << STEP_BITS) - 1
    STEP_SHIFT = SPACING_SHIFT + SPACING_BITS  # bits 15..38: the step's low bits
    NOT_STEP_SHIFT = STEP_SHIFT + STEP_BITS    # bits 39..62: their complement

    @classmethod
    def encode(cls, step: int, stop: bool, due: bool, reason: int, every: int = 1) -> int:
        low = step & cls.STEP_MASK
        word = (cls.STOP if stop else 0) | (cls.SAVE if due else 0)
        if reason > 0:
            word |= 1 << (cls.REASON_SHIFT + reason)
        word |= 1 << (cls.SPACING_SHIFT + every.bit_length() - 1)
        return word | (low << cls.STEP_SHIFT) | ((~low & cls.STEP_MASK) << cls.NOT_STEP_SHIFT)

    @classmethod
    def every(cls, word: int) -> int:
        """The widest round spacing any rank proposed, in steps."""
        bits = (word >> cls.SPACING_SHIFT) & ((1 << cls.SPACING_BITS) - 1)
        return 1 << max(0, bits.bit_length() - 1)

    @classmethod
    def reason(cls, word: int) -> int:
        """The strongest reason any rank gave (0: none)."""
        bits = (word >> (cls.REASON_SHIFT + 1)) & ((1 << (len(REASONS) - 1)) - 1)
        return bits.bit_length()

    @classmethod
    def steps_agree(cls, word: int) -> bool:
        low = (word >> cls.STEP_SHIFT) & cls.STEP_MASK
        not_low = (word >> cls.NOT_STEP_SHIFT) & cls.STEP_MASK
        return low & not_low == 0


@dataclass(frozen=True)
class Decision:
    """What every rank does at this step."""

    save: bool
    request: CheckpointRequest | None  # a notice-style request (stop or not), None for a periodic save
    origin: str                        # "self": this rank asked; "peer": another rank did


class StepAgreement:
    """Runs the pipelined all-reduce. At a round step (``is_round``) ``collect`` decodes the previous round
    and ``start`` begins this one; ``exchange`` does both."""

    def __init__(self, comm, clock=time.monotonic) -> None:
        self.comm = comm
        self._clock = clock
        self._work = None
        self._word = torch.zeros(1, dtype=torch.int64)  # reused: a round starts only after the last was collected
        self._step = 0
        self._deadline = math.inf
        self._mine: tuple[bool, bool] = (False, False)  # what this rank itself put in: (request, save)
        self._every = 1               # steps per round, as last agreed
        self._next_round: int | None = None  # None: the next step() is a round
        self._last_call: float | None = None
        self._step_seconds: float | None = None  # this rank's recent step time (moving average)

    def is_round(self, step: int) -> bool:
        """Is ``step`` a round step? Every rank answers alike (the spacing was agreed). Call once per step."""
        now = self._clock()
        if self._last_call is not None:
            took = now - self._last_call
            self._step_seconds = took if self._step_seconds is None else 0.8 * self._step_seconds + 0.2 * took
        self._last_call = now
        return self._next_round is None or step >= self._next_round

    def exchange(self, step: int, request: CheckpointRequest | None, due: bool) -> Decision | None:
        """Collect the previous round's result and start this step's round."""
        decision = self.collect()
        self.start(step, request, due)
        return decision

    def collect(self) -> Decision | None:
        """Wait for the round in flight (normally long done) and decode it."""
        if self._work is None:
            return None
        self._work.wait()
        self._work = None
        word = int(self._word.item())
        self._every = Word.every(word)
        if not Word.steps_agree(word):
            raise CheckpointError(f"ranks called Checkpointer.step() at different steps (this rank at {self._step}, "
                                  "another at a different one); every rank must call step() with the same step number")
        stop, save, reason = bool(word & Word.STOP), bool(word & Word.SAVE), Word.reason(word)
        asked, due = self._mine
        if not stop and reason <= 0 and not save:
            return None
        request = None
        if stop or reason > 0:
            deadline = self._earliest_deadline()
            request = CheckpointRequest(REASONS[reason], stop, deadline)
        origin = "self" if asked or (request is None and due) else "peer"
        return Decision(save=save or request is not None, request=request, origin=origin)

    def start(self, step: int, request: CheckpointRequest | None, due: bool) -> None:
        import torch.distributed as dist

        self._deadline = request.deadline if request is not None and request.deadline is not None else math.inf
        reason = reason_code(request.reason) if request is not None else 0
        self._step = step
        self._next_round = step + self._every
        self._word.fill_(Word.encode(step, bool(request and request.stop), due, reason,
                                     steps_per_round(self._step_seconds)))
        self._mine = (request is not None, due)
        self._work = dist.all_reduce(self._word, op=dist.ReduceOp.BOR, group=self.comm.group, async_op=True)

    def _earliest_deadline(self) -> float | None:
        """Every rank is here at the same step (they decoded the same word): agree on the earliest deadline."""
        import torch.distributed as dist

        value = torch.tensor([-self._deadline], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.comm.group)
        neg_deadline = value.item()
        return None if math.isinf(neg_deadline) else -neg_deadline

    def drain(self) -> None:
        """Finish the round in flight without acting on it (close, restore); the next step is a round."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        self._next_round = None
