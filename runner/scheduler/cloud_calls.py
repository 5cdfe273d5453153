"""Cloud calls as request-then-poll: a tick asks the provider and goes on; a later tick applies the answer.

A cloud API can take minutes (GCP waits up to 600 s on an insert operation, a describe can hang on a
throttled API). Made inside the tick, one such call would hold up every other job's cancel, every lost
node's detection and every other launch; here the provider's ``launch``, ``describe`` and ``terminate``
run on worker threads, one :class:`CloudCalls` per kind of call, and the reconciler only reads what has
come back.

Calls in flight are known by key (a node id): one node never has two calls of one kind out at once, and a
worker skips a node whose call is still out. An answer carries what the worker noted when it asked (the
node's attempt, say), so an answer that comes back after the node has moved on can be told and ignored.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Callable, NamedTuple

LAUNCH_WORKERS = 16  # provider calls in flight at once, per kind (each mostly waits on the cloud's API)
DESCRIBE_WORKERS = 16
TERMINATE_WORKERS = 8


class Answer(NamedTuple):
    key: str  # the node id the call was for
    value: Any = None  # what the call returned (a launch's provider ref, a describe's NodeStatus)
    error: BaseException | None = None
    asked: Any = None  # what the caller noted when it asked, to tell an answer that has gone stale
    started_at: float | None = None  # when the call began (unix time): a launch's node exists from then


class InlineExecutor(Executor):
    """Runs each call at once, in the caller's thread: a tick's calls are answered by the end of the tick."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the answer
            future.set_exception(exc)
        return future


class DaemonThreadPool(Executor):
    """``workers`` daemon threads taking calls in order: a controller that stops does not wait for a slow cloud
    (the standard pool's threads are joined at exit), and the calls it left are made again later."""

    def __init__(self, workers: int, name: str = "cloud"):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
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


class CloudCalls:
    """Calls of one kind in flight, by key, on ``executor``: daemon threads (:meth:`threaded`), or by default
    inline (a tick's calls answered within the tick, as a scheduler test wants them).

    A key stays in flight until its answer has been read by :meth:`answers`. ``on_answer`` is called from the
    worker thread when an answer for which ``wakes(answer)`` holds arrives (the reconciler sets it to its
    nudge: that answer is work for the next tick)."""

    def __init__(self, executor: Executor | None = None, on_answer: Callable[[], None] | None = None,
                 wakes: Callable[[Answer], bool] | None = None):
        self._executor = executor or InlineExecutor()
        self._in_flight: dict[str, Future] = {}
        self._done: list[Answer] = []  # answered, not read yet
        self._lock = threading.Lock()
        self.on_answer = on_answer
        self.wakes = wakes or (lambda answer: True)

    @classmethod
    def threaded(cls, workers: int, name: str = "cloud", wakes: Callable[[Answer], bool] | None = None) -> "CloudCalls":
        return cls(DaemonThreadPool(workers, name), wakes=wakes)

    def request(self, key: str, call: Callable[[], Any], asked: Any = None) -> bool:
        """Make ``call`` for ``key`` unless one is already out; return whether it was made now."""
        with self._lock:
            if key in self._in_flight:
                return False
            started: dict[str, float] = {}
            future = self._executor.submit(_timed, call, started)
            self._in_flight[key] = future
        future.add_done_callback(partial(self._finished, {key: asked}, False, started))
        return True

    def request_batch(self, asked: dict[str, Any], call: Callable[[list[str]], dict[str, Any]]) -> list[str]:
        """One call for many keys (a provider that describes many nodes at once): ``call(keys)`` returns each
        key's answer by key. Keys already out are left out; return the keys asked for now."""
        with self._lock:
            keys = [key for key in asked if key not in self._in_flight]
            if not keys:
                return []
            started: dict[str, float] = {}
            future = self._executor.submit(_timed, call, started, keys)
            for key in keys:
                self._in_flight[key] = future
        future.add_done_callback(partial(self._finished, {key: asked[key] for key in keys}, True, started))
        return keys

    def in_flight(self, key: str) -> bool:
        with self._lock:
            return key in self._in_flight

    def keys_in_flight(self) -> frozenset[str]:
        """Every key with a call out now (one look for a worker that skips thousands of nodes)."""
        with self._lock:
            return frozenset(self._in_flight)

    def answers(self) -> list[Answer]:
        """Every call that has finished since the last look, success or error (taken out of flight)."""
        with self._lock:
            done, self._done = self._done, []
            for answer in done:
                del self._in_flight[answer.key]
        return done

    def shutdown(self) -> None:
        """Stop taking calls; calls still running finish on their threads, unheard (their nodes' rows are as
        they were, and the next controller makes the calls again: launch and terminate are idempotent)."""
        self._executor.shutdown(wait=False)

    def _finished(self, asked: dict[str, Any], batch: bool, started: dict[str, float], future: Future) -> None:
        error = future.exception()
        at = started.get("at")
        if error is not None:
            answers = [Answer(key, None, error, note, at) for key, note in asked.items()]
        elif not batch:
            answers = [Answer(key, future.result(), None, note, at) for key, note in asked.items()]
        else:
            values = future.result()
            answers = [Answer(key, values[key], None, note, at) if key in values else
                       Answer(key, None, LookupError(f"the batch call returned no answer for {key}"), note, at)
                       for key, note in asked.items()]
        with self._lock:
            self._done.extend(answers)
        if self.on_answer is not None and any(self.wakes(answer) for answer in answers):
            self.on_answer()


def _timed(call: Callable, started: dict[str, float], *args):
    """Make ``call``, noting in ``started`` when it began (an executor may queue it for a while first)."""
    started["at"] = time.time()
    return call(*args)
