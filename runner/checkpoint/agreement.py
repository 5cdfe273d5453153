"""One decision for every rank at every step: save now, stop now, or go on.

A notice reaches one node (or SIGTERM one rank), a periodic save falls due on each rank's own clock, yet
every rank must save and stop at the same step. At each ``step()`` every rank contributes what it knows
to a tiny all-reduce (MAX over a few float64s) on a gloo side group, started with ``async_op=True`` and
read at the *next* step, by which time it has long finished. So agreeing costs the training one
non-blocking collective launch per step and no wait; the price is that a request is acted on one step
after the step in which it arrived, on every rank alike.

The vector: ``[stop, save, reason, -deadline, step, -step]``. MAX gives "any rank wants it" for the flags,
the strongest reason (its index in ``REASONS``), the earliest deadline, and both the largest and the
smallest step, which must be equal: ranks that call ``step()`` at different steps are told so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .control import CheckpointRequest
from .errors import CheckpointError

# Weakest first: when ranks have different reasons, the strongest one is reported.
REASONS = ("interval", "rebalance", "drill", "cancel", "SIGUSR1", "SIGTERM", "notice")


def reason_code(reason: str | None) -> int:
    return REASONS.index(reason) if reason in REASONS else REASONS.index("notice")


@dataclass(frozen=True)
class Decision:
    """What every rank does at this step."""

    save: bool
    request: CheckpointRequest | None  # a notice-style request (stop or not), None for a periodic save
    origin: str                        # "self": this rank asked; "peer": another rank did


class StepAgreement:
    """Runs the pipelined all-reduce; ``exchange`` returns the decision of the previous round."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self._work = None
        self._vector: torch.Tensor | None = None
        self._mine: tuple[bool, bool] = (False, False)  # what this rank itself put in: (request, save)

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
        self._work, vector = None, self._vector
        stop, save, reason, neg_deadline, high, neg_low = vector.tolist()
        if high != -neg_low:
            raise CheckpointError(f"ranks called Checkpointer.step() at different steps ({int(-neg_low)} and "
                                  f"{int(high)}); every rank must call step() with the same step number")
        asked, due = self._mine
        if not stop and reason <= 0 and not save:
            return None
        request = None
        if stop or reason > 0:
            deadline = None if math.isinf(neg_deadline) else -neg_deadline
            request = CheckpointRequest(REASONS[int(reason)], bool(stop), deadline)
        origin = "self" if asked or (request is None and due) else "peer"
        return Decision(save=bool(save) or request is not None, request=request, origin=origin)

    def start(self, step: int, request: CheckpointRequest | None, due: bool) -> None:
        import torch.distributed as dist

        deadline = request.deadline if request is not None and request.deadline is not None else math.inf
        reason = reason_code(request.reason) if request is not None else 0
        self._vector = torch.tensor(
            [float(bool(request and request.stop)), float(due), float(reason), -deadline, float(step), -float(step)],
            dtype=torch.float64)
        self._mine = (request is not None, due)
        self._work = dist.all_reduce(self._vector, op=dist.ReduceOp.MAX, group=self.comm.group, async_op=True)

    def drain(self) -> None:
        """Finish the round in flight without acting on it (close, restore)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
