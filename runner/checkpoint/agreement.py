"""One decision for every rank at every step: save now, stop now, or go on.

A notice reaches one node (or SIGTERM one rank), a periodic save falls due on each rank's own clock, yet
every rank must save and stop at the same step. At each ``step()`` every rank contributes what it knows
to a one-number all-reduce on a gloo side group, started with ``async_op=True`` and read at the *next*
step, by which time it has long finished. So agreeing costs the training one non-blocking collective
launch per step and no wait; the price is that a request is acted on one step after the step in which it
arrived, on every rank alike.

The number is one int64, reduced with bitwise OR (``Word`` below): a stop flag, a save-due flag, one bit
per request reason (the strongest set bit wins), a world-change flag (an elastic gang leaves this group
at this step, elastic.py), a timing flag (a notice's timing checkpoint, saved the emergency's way on every rank
so that its time predicts the emergency's), and the step's low 26 bits beside their complement. OR
gives "any rank wants it" for the flags and reasons; for the step, every rank agreeing on it is exactly "no
bit set in both halves", so ranks that call ``step()`` at different steps are told so. Why one word: gloo's
ring all-reduce costs about four times as much for six elements as for one at four ranks
(benchmarks/distributed_checkpoint.py), and that is paid
on every round. The one thing OR cannot give, the earliest deadline of a stop request, is agreed by a
second, blocking all-reduce (MAX of the negated deadline) in the round that carries a request, which every
rank enters at the same step since every rank decoded the same word: a few times per job, not per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .control import CheckpointRequest
from .errors import CheckpointError

# Weakest first: when ranks have different reasons, the strongest one is reported. "interval" is the
# absence of a request (a periodic save is the save-due flag), so it has no bit.
REASONS = ("interval", "rebalance", "drill", "move", "cancel", "SIGUSR1", "SIGTERM", "notice")


def reason_code(reason: str | None) -> int:
    return REASONS.index(reason) if reason in REASONS else REASONS.index("notice")


class Word:
    """The bit layout of a round's int64 (bit 63, the sign, is left clear). Steps are compared on their low
    26 bits: ranks out of step by a multiple of 2**26 would pass, ranks out by a few never do."""

    STOP = 1 << 0
    SAVE = 1 << 1
    REASON_SHIFT = 1                      # reason i (1..7) is bit REASON_SHIFT + i: bits 2..8
    STEP_BITS = 26
    STEP_MASK = (1 << STEP_BITS) - 1
    STEP_SHIFT = 9                           # bits 9..34: the step's low bits
    NOT_STEP_SHIFT = STEP_SHIFT + STEP_BITS  # bits 35..60: their complement
    WORLD = 1 << 61                          # a rank was told of a new world: every rank leaves this group
    TIMING = 1 << 62                         # a timing checkpoint: saved the way an emergency one is (persist.py)

    @classmethod
    def encode(cls, step: int, stop: bool, due: bool, reason: int, world: bool = False, timing: bool = False) -> int:
        low = step & cls.STEP_MASK
        word = ((cls.STOP if stop else 0) | (cls.SAVE if due else 0) | (cls.WORLD if world else 0)
                | (cls.TIMING if timing else 0))
        if reason > 0:
            word |= 1 << (cls.REASON_SHIFT + reason)
        return word | (low << cls.STEP_SHIFT) | ((~low & cls.STEP_MASK) << cls.NOT_STEP_SHIFT)

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
    world: bool = False                # an elastic gang's ranks leave this process group at this step


class StepAgreement:
    """Runs the pipelined all-reduce; ``exchange`` returns the decision of the previous round."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self._work = None
        self._word = torch.zeros(1, dtype=torch.int64)  # reused: a round starts only after the last was collected
        self._step = 0
        self._deadline = math.inf
        self._mine: tuple[bool, bool] = (False, False)  # what this rank itself put in: (request, save)
        self._options = None  # the all-reduce's options, built once (see start)
        self.last_request: CheckpointRequest | None = None

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
        if not Word.steps_agree(word):
            raise CheckpointError(f"ranks called Checkpointer.step() at different steps (this rank at {self._step}, "
                                  "another at a different one); every rank must call step() with the same step number")
        stop, save, reason = bool(word & Word.STOP), bool(word & Word.SAVE), Word.reason(word)
        if word & Word.WORLD:  # the group ends here: what else was asked is for the next group to decide
            return Decision(save=False, request=None, origin="peer", world=True)
        asked, due = self._mine
        if not stop and reason <= 0 and not save:
            return None
        request = None
        if stop or reason > 0:
            deadline = self._earliest_deadline()
            request = CheckpointRequest(REASONS[reason], stop, deadline, timing=bool(word & Word.TIMING) and not stop)
        origin = "self" if asked or (request is None and due) else "peer"
        return Decision(save=save or request is not None, request=request, origin=origin)

    def start(self, step: int, request: CheckpointRequest | None, due: bool, world: bool = False) -> None:
        import torch.distributed as dist

        self._deadline = request.deadline if request is not None and request.deadline is not None else math.inf
        reason = reason_code(request.reason) if request is not None else 0
        self._step = step
        self._word.fill_(Word.encode(step, bool(request and request.stop), due, reason, world,
                                     timing=bool(request and request.timing)))
        self._mine = (request is not None, due)
        self.last_request = request  # what this rank put into the round (a rank leaving an elastic gang says why)
        # The process group's own allreduce, not dist.all_reduce: its checks and logging wrapper cost about
        # a third of the launch, every step, for a tensor and group checked once here.
        if self._options is None:
            self._group = self.comm.group if self.comm.group is not None else dist.group.WORLD
            self._options = dist.AllreduceOptions()
            self._options.reduceOp = dist.ReduceOp.BOR
        self._work = self._group.allreduce([self._word], self._options)

    def _earliest_deadline(self) -> float | None:
        """Every rank is here at the same step (they decoded the same word): agree on the earliest deadline."""
        import torch.distributed as dist

        value = torch.tensor([-self._deadline], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.comm.group)
        neg_deadline = value.item()
        return None if math.isinf(neg_deadline) else -neg_deadline

    def forget(self) -> None:
        """Drop the round in flight unread (its group is being abandoned: elastic.py)."""
        self._work = None

    def drain(self) -> None:
        """Finish the round in flight without acting on it (close, restore)."""
        if self._work is not None:
            self._work.wait()
            self._work = None

    def release(self) -> None:
        """Drop the group held for the rounds (close(): the group is being destroyed)."""
        self._work, self._group, self._options = None, None, None
