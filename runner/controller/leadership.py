"""The leader loop: every controller serves the API; the one holding the database's leader lock also runs
the reconciler (scheduler included). A follower tries for the lock every second, on one connection it keeps, so
when the leader dies another takes over within a couple of seconds of the database freeing its lock; a leader that
loses its lock (its database session died) stops its reconciler at once.

Between election steps the leader waits on its lock's connection for wakes (runner/state/leader.py): work recorded
by a controller that does not lead (a submit, a cancel, a report) sets that controller's nudge, a
:class:`SharedNudge`, which sends one, and the leader's reconciler runs its tick at once instead of at its interval.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

import structlog

from ..state import Database
from ..state.leader import Leadership, wake_leader

log = structlog.get_logger(__name__)

ELECTION_INTERVAL_SECONDS = 1.0


class Worker(Protocol):
    def start(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...


class SharedNudge(threading.Event):
    """The reconciler's nudge (``SchedulerContext.nudge``) on a database several controllers share: set in a
    controller that does not lead, it also wakes the leader's reconciler, through the database."""

    def __init__(self, db: Database, is_leader: Callable[[], bool]):
        super().__init__()
        self.db, self.is_leader = db, is_leader

    def set(self) -> None:
        super().set()
        if self.is_leader():
            return
        try:
            wake_leader(self.db)
        except Exception as exc:  # the work is recorded: the leader's next tick does it
            log.warning("could not wake the leader's reconciler", error=str(exc))


class LeaderLoop:
    """``on_wake``: called while this controller leads, when another controller wakes its reconciler."""

    def __init__(self, leadership: Leadership, make_worker: Callable[[], Worker],
                 interval: float = ELECTION_INTERVAL_SECONDS, on_wake: Callable[[], None] = lambda: None):
        self.leadership = leadership
        self.make_worker = make_worker
        self.interval = interval
        self.on_wake = on_wake
        self._worker: Worker | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def leading(self) -> bool:
        return self._worker is not None

    def start(self) -> None:
        self._step()  # a controller alone on its database leads from its first moment
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        self._stand_down("controller stopping")

    def _run(self) -> None:
        while not self._pause(self.interval):
            try:
                self._step()
            except Exception:  # never let the election thread die; try again next round
                log.exception("leader election step failed")

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` until the next step (while leading, hearing wakes meanwhile); True when stopped."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self.leading and self.leadership.listening:
                if self.leadership.wait_for_wake(left):
                    self.on_wake()
            else:
                self._stop.wait(left)
        return self._stop.is_set()

    def _step(self) -> None:
        if self._worker is None:
            if self.leadership.try_acquire():
                self._worker = self.make_worker()
                self._worker.start()
                log.info("leader: running the scheduler and reconciler", since=time.time())
        elif not self.leadership.held():
            self._stand_down("leader lock lost")

    def _stand_down(self, why: str) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()
            log.info("no longer the leader", why=why)
        self.leadership.release()
