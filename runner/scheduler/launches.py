"""Launches as request-then-poll: a tick asks for a node and goes on; a later tick collects the answer.

A cloud launch can take minutes (GCP waits up to 600 s on an insert operation). Run inside the tick, it
would hold up every other job's cancel, every lost node's detection and every other launch; here the
provider's ``launch`` runs on a worker thread and the reconciler only reads what has come back.

Launches in flight are known by node id: a node is never asked for twice at once, and a node whose
launch is still out is not released under it (its answer decides what to terminate).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Callable

LAUNCH_WORKERS = 16  # provider calls in flight at once (each mostly waits on the cloud's API)


@dataclass(frozen=True)
class LaunchAnswer:
    node_id: str
    ref: str | None = None  # the provider's reference to the node it started
    error: Exception | None = None


class InlineExecutor(Executor):
    """Runs each call at once, in the caller's thread: a tick's launches are answered by the end of the tick."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the answer
            future.set_exception(exc)
        return future


class DaemonThreadPool(Executor):
    """``workers`` daemon threads taking calls in order: a controller that stops does not wait for a slow cloud
    (the standard pool's threads are joined at exit), and the launches it left are asked for again later."""

    def __init__(self, workers: int):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"launch-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self._calls.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._calls.put(None)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args, kwargs = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the answer
                future.set_exception(exc)


class LaunchRequests:
    """Launches in flight, by node id, on ``executor``: the daemon's :meth:`threaded` pool, or by default inline
    (a tick's launches answered within the tick, as a scheduler test wants them)."""

    def __init__(self, executor: Executor | None = None, on_answer: Callable[[], None] | None = None):
        self._executor = executor or InlineExecutor()
        self._in_flight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.on_answer = on_answer  # called from the worker thread when an answer arrives (wakes the reconciler)

    @classmethod
    def threaded(cls, workers: int = LAUNCH_WORKERS) -> "LaunchRequests":
        return cls(DaemonThreadPool(workers))

    def request(self, node_id: str, launch: Callable[[], str]) -> bool:
        """Ask for the node unless its launch is already out; return whether it was asked for now."""
        with self._lock:
            if node_id in self._in_flight:
                return False
            future = self._executor.submit(launch)
            self._in_flight[node_id] = future
        if self.on_answer is not None:
            future.add_done_callback(lambda _: self.on_answer())
        return True

    def in_flight(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._in_flight

    def answers(self) -> list[LaunchAnswer]:
        """Every launch that has finished since the last call, success or error (taken out of flight)."""
        with self._lock:
            done = {node_id: f for node_id, f in self._in_flight.items() if f.done()}
            for node_id in done:
                del self._in_flight[node_id]
        answers = []
        for node_id, future in done.items():
            error = future.exception()
            answers.append(LaunchAnswer(node_id, error=error) if error else LaunchAnswer(node_id, ref=future.result()))
        return answers

    def shutdown(self) -> None:
        """Stop taking requests; calls still running finish on their threads (their nodes' rows stay
        ``launching``, and the next controller asks for them again: launch is idempotent per node id)."""
        self._executor.shutdown(wait=False)
