"""The ledger: where a job's paid time went. Pure arithmetic over the restart log's rows and the job's nodes.

- **Gap** of an attempt: from the last training step before it (of the previous attempt, or an earlier one
  when the previous never trained) to its own first training step; None for the first attempt and while a
  step is unknown. Both times are the training's own wall clock, reported by the checkpoint library.
- **Goodput** of a job: ``paid_seconds`` sums every node's billed time, from its launch to its release (or
  now), standbys and draining nodes included; ``training_seconds`` the node-seconds spent on steps that were
  kept, ``redone_seconds`` those spent on steps that were lost (a later attempt resumed from an older step)
  and trained again; ``ratio`` = training / paid.

An attempt trains the steps after its first reported step up to its last, ``(first_step, last_step]``, over
``last_step_at - first_step_at`` seconds on each of its nodes (the first step's own compute is part of the
gap before it, so no second is counted twice); an elastic gang's steps count the nodes of the world that trained
them (its ``world_sizes``), not the nodes it started with. A step ``s`` of attempt ``a`` is lost when a later attempt
resumed from a step below ``s``; it counts as redone once a later attempt has trained past it again, and as
neither kept nor redone when none has (the job ended first). The seconds a step took are the attempt's
average: its span over the steps in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


class AttemptTimes(Protocol):
    """What the ledger reads of a restart-log row (runner/state/rows.py ``Attempt`` has it)."""

    attempt: int
    num_nodes: int
    resumed_from_step: int
    first_step: int | None
    first_step_at: float | None
    last_step: int | None
    last_step_at: float | None
    world_sizes: list | None  # an elastic gang's [{"step", "world_size"}, ...] (in ranks); None for any other


def boot_seconds(launched_at: float, registered_before: bool, now: float) -> float | None:
    """A node's boot: its launch to now, its first registration; None for a node that was already up (an agent
    registering again, a gang's node kept from the previous attempt), which booted 0 s for this attempt."""
    return None if registered_before else round(max(0.0, now - launched_at), 3)


def gaps(attempts: Sequence[AttemptTimes]) -> dict[int, float | None]:
    """Each attempt's gap in seconds (by attempt number); ``attempts`` in order."""
    result: dict[int, float | None] = {}
    last_at: float | None = None
    for index, row in enumerate(attempts):
        known = index > 0 and last_at is not None and row.first_step_at is not None
        result[row.attempt] = round(row.first_step_at - last_at, 3) if known else None
        if row.last_step_at is not None:
            last_at = row.last_step_at if last_at is None else max(last_at, row.last_step_at)
    return result


@dataclass(frozen=True)
class Goodput:
    paid_seconds: float
    training_seconds: float
    redone_seconds: float

    @property
    def ratio(self) -> float | None:
        return round(self.training_seconds / self.paid_seconds, 4) if self.paid_seconds > 0 else None

    def to_json(self) -> dict:
        return {"paid_seconds": round(self.paid_seconds, 3), "training_seconds": round(self.training_seconds, 3),
                "redone_seconds": round(self.redone_seconds, 3), "ratio": self.ratio}


def steps_kept_and_redone(attempts: Sequence[AttemptTimes]) -> dict[int, tuple[int, int]]:
    """Per attempt that trained: (steps kept, steps lost and trained again), in step units."""
    result: dict[int, tuple[int, int]] = {}
    for index, row in enumerate(attempts):
        if row.first_step is None or row.last_step is None or row.last_step <= row.first_step:
            continue
        first, last = row.first_step, row.last_step
        later = attempts[index + 1:]
        resumed = min((b.resumed_from_step for b in later), default=None)
        if resumed is None or resumed >= last:
            result[row.attempt] = (last - first, 0)
            continue
        lost_from = max(first, resumed)  # steps (lost_from, last] were lost
        trained_again = max((b.last_step for b in later if b.last_step is not None), default=resumed)
        result[row.attempt] = (lost_from - first, max(0, min(last, trained_again) - lost_from))
    return result


def goodput(attempts: Sequence[AttemptTimes], node_spans: Sequence[tuple[float, float | None]],
            now: float) -> Goodput:
    """The job's goodput from its attempts (in order) and every node's (launched, released or None)."""
    paid = sum(max(0.0, (released if released is not None else now) - launched) for launched, released in node_spans)
    training = redone = 0.0
    split = steps_kept_and_redone(attempts)
    for row in attempts:
        if row.attempt not in split:
            continue
        kept, again = split[row.attempt]
        per_step = max(0.0, row.last_step_at - row.first_step_at) / (row.last_step - row.first_step)
        kept_to = row.first_step + kept  # steps (first, kept_to] were kept; the next ``again`` were redone
        training += node_steps(row, row.first_step, kept_to) * per_step
        redone += node_steps(row, kept_to, kept_to + again) * per_step
    return Goodput(paid, training, redone)


def node_steps(row: AttemptTimes, low: int, high: int) -> float:
    """Steps ``(low, high]`` of an attempt times the nodes that trained each: all of its nodes, or for an elastic
    gang the nodes of the world each step was trained in (its first world holds every node)."""
    sizes = row.world_sizes or []
    if high <= low or len(sizes) < 2 or not sizes[0].get("world_size"):
        return max(0, high - low) * row.num_nodes
    ranks_per_node = sizes[0]["world_size"] / row.num_nodes
    total = 0.0
    for index, entry in enumerate(sizes):  # each world holds from its step to the next change
        start = low if index == 0 else max(low, entry["step"])
        end = min(high, sizes[index + 1]["step"]) if index + 1 < len(sizes) else high
        if end > start:
            total += (end - start) * entry["world_size"] / ranks_per_node
    return total
