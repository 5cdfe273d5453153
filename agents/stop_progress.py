"""How far each local rank got toward a stop the agent asked for, and one line naming those that never got there.

Every rank says ``hello`` with its global rank; on a stop request each answers ``request_seen`` at once with
the last step it called ``step()`` with (its reader thread answers even while its training thread hangs),
and ``stopping`` once it has stopped. A rank that hangs outside ``step()`` holds every other rank at the next
step's agreement, so at the deadline the ranks that got furthest are waiting for the others, and a rank
behind them, or one that never answered, is the one that never reached the stop step.

A rank that closes its Checkpointer (``closed``, without error) having never said ``stopping`` ended its training
loop by itself: the job's last step. When every local rank did, a stop has nothing to save here
(:meth:`StopProgress.done_training`).
"""

from __future__ import annotations

import threading

from runner.protocol.messages import Op


class StopProgress:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ranks: set[str] = set()             # every local rank that said hello in this attempt
        self.seen: dict[str, int | None] = {}    # rank -> its last step when the stop request arrived
        self.stopped: set[str] = set()           # ranks that said ``stopping``
        self.closed: set[str] = set()            # ranks whose Checkpointer closed without error

    def reset(self) -> None:
        with self._lock:
            self.ranks, self.seen, self.stopped, self.closed = set(), {}, set(), set()

    def on_message(self, message: dict) -> None:
        rank = message.get("rank")
        key = str(rank if rank is not None else f"pid {message.get('pid')}")
        op = message.get("op")
        with self._lock:
            if op == Op.HELLO:
                self.ranks.add(key)
            elif op == Op.REQUEST_SEEN:
                self.seen[key] = message.get("step")
            elif op == Op.STOPPING:
                self.stopped.add(key)
            elif op == Op.CLOSED and not message.get("error"):
                self.closed.add(key)

    def done_training(self) -> bool:
        """Every local rank of this attempt closed its Checkpointer after its last step, none having stopped for a
        request: the training is over here, and whatever still runs (a rank's teardown, a launcher's exit barrier)
        only has to exit."""
        with self._lock:
            return bool(self.ranks) and self.ranks <= self.closed and not self.stopped

    def laggards(self) -> str | None:
        """Which local ranks never reached the stop step, as a sentence; None when every rank stopped."""
        with self._lock:
            missing = sorted(self.ranks - self.stopped, key=_order)
            if not missing:
                return None
            silent = [r for r in missing if self.seen.get(r) is None]
            steps = {r: self.seen[r] for r in missing if self.seen.get(r) is not None}
        parts = []
        furthest = max(steps.values()) if steps else None
        behind = sorted((r for r, step in steps.items() if step < furthest), key=_order)
        waiting = sorted((r for r, step in steps.items() if step == furthest), key=_order)
        for rank in behind:
            parts.append(f"rank {rank} never reached the stop step (its last step was {steps[rank]}, "
                         f"{_names(waiting)} waited at step {furthest})")
        if silent:
            parts.append(f"{_names(silent)} never answered the stop request")
        if not behind and waiting:
            parts.append(f"{_names(waiting)} waited at step {furthest} for a rank of another node")
        return "; ".join(parts)


def _order(rank: str):
    return (0, int(rank)) if rank.isdigit() else (1, rank)


def _names(ranks: list[str]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)
