"""Group commit: the writes that arrive while one transaction is out share the next one.

At 2,000 nodes the controller takes about 200 log chunks and 70 reports a second. Made one transaction
each on a thread pool, every request paid for its own BEGIN, write lock and COMMIT (on Postgres a round trip
each, and a flush of the log at every commit), and the requests queued for the pool's threads: measured on
Postgres, their p99 was seconds. Here one thread takes every request waiting, runs each in a savepoint of one
transaction, commits once, and only then answers them: an acknowledged write is a committed write.

- A request whose own work fails (a 401, a 422, a chunk that raced) is undone alone, by a savepoint, and
  answered with its own error; the others of its group still commit. Savepoints are taken per request only
  once a request of the group failed (:func:`all_at_once`).
- A lane may write its whole group at once (``write_group``): log chunks are stored by one read of their nodes
  and streams' sizes and one multi-row INSERT, not five statements each; a group's durable checkpoints by one
  statement on Postgres (runner/state/checkpoints.py), not four each. On Postgres a statement that needs a
  savepoint of its own is sent with it in one round trip (``Tx.all_in_savepoint``), and a group's last statement
  with the COMMIT too (``Tx.all_in_savepoint_then_commit``): where that statement fails, the COMMIT is not sent and
  the group goes on in its transaction as above.
- A group whose transaction fails (the database went away, the commit was refused) fails every request of the
  group with that error, and none of their writes is kept: each agent sends its request again.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Sequence

import structlog

from ..errors import RunnerError
from ..state.errors import DatabaseUnreachable
from .batching import Batcher, hand_back

log = structlog.get_logger(__name__)

MAX_GROUP = 200  # requests in one transaction: bounds how long the write lock is held

Outcome = tuple[bool, Any]  # (True, the request's answer) or (False, the exception it is answered with)
WriteGroup = Callable[[Any, Sequence[Any]], list[Outcome]]


def all_at_once(tx, works: Sequence[Callable[[Any], Any]]) -> list[Outcome]:
    """The default ``write_group``: each request is a callable ``work(tx)``. All run in one savepoint (a savepoint
    each costs two round trips a request); where one fails, that savepoint is undone and the group runs again,
    each request in a savepoint of its own, so only the failing one's writes are lost. A work may so run twice:
    it writes to ``tx`` and nowhere else."""
    try:
        with tx.savepoint():
            return [(True, work(tx)) for work in works]
    except Exception:
        return each_in_a_savepoint(tx, works)


def each_in_a_savepoint(tx, works: Sequence[Callable[[Any], Any]]) -> list[Outcome]:
    """Each request is a callable ``work(tx)``, run in a savepoint of its own."""
    outcomes: list[Outcome] = []
    for work in works:
        try:
            with tx.savepoint():
                outcomes.append((True, work(tx)))
        except Exception as exc:  # this request's own error: its savepoint undid its writes
            outcomes.append((False, exc))
    return outcomes


class GroupCommitFailed(RunnerError, RuntimeError):
    """The transaction of a group failed: none of its requests' writes was kept."""


class GroupCommit(Batcher):
    """``await run(work)``: ``work(tx)`` runs in the next group's transaction; its result once that commits.

    With ``write_group``, a request is whatever that function takes: ``write_group(tx, requests)`` writes a
    whole group and returns one outcome per request, in order (a request's error undone alone, as above)."""

    def __init__(self, transaction: Callable[[], ContextManager[Any]], name: str, max_group: int = MAX_GROUP,
                 write_group: WriteGroup = all_at_once):
        super().__init__(name, max_group, join_seconds=30)
        self._transaction = transaction
        self._write_group = write_group

    async def run(self, work: Any) -> Any:
        """``work``'s answer (a callable ``work(tx)``, or what ``write_group`` takes), once its group committed."""
        # the thread starts on first use: a controller that takes no writes keeps no thread
        return await self._submit(work, start=True)

    def _serve_batch(self, group) -> None:
        try:
            with self._transaction() as tx:
                outcomes = self._write_group(tx, [work for work, _, _ in group])
        except Exception as exc:  # the transaction failed: nothing of the group was kept
            log.warning("group commit failed", group=self._name, requests=len(group), error=str(exc))
            failed = exc if isinstance(exc, DatabaseUnreachable) else GroupCommitFailed(  # (the cause, said plainly)
                f"{self._name}: the transaction of {len(group)} requests failed and none was stored "
                f"({type(exc).__name__}: {exc}); send again")
            for _, answer, loop in group:
                hand_back(loop, answer, failed, failed=True)
            return
        for (ok, value), (_, answer, loop) in zip(outcomes, group):
            hand_back(loop, answer, value, failed=not ok)
