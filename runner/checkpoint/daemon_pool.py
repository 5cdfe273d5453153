"""Thread pools that never hold up the process's exit.

``concurrent.futures.ThreadPoolExecutor`` joins every one of its threads when the interpreter exits. A thread
stuck in a durable store that never answers (a hung mount, a connection that stalls without an error) would then
keep the training process from ever exiting, although ``Checkpointer.close()`` gave up on that upload in bounded
time and said so. The checkpoint library's pools are :class:`DaemonPool`: the same ``submit`` and ``Future`` (and
``with``), on daemon threads. What is still running when the process exits is abandoned, and named in one warning
(:func:`abandoned`): which file, to where.
"""

from __future__ import annotations

import atexit
import itertools
import queue
import threading
from concurrent.futures import Executor, Future
from typing import Callable

from .log import get_logger

log = get_logger()

_running: dict[int, str] = {}  # task number -> what it does, of every pool, while it runs
_running_lock = threading.Lock()
_numbers = itertools.count(1)


def abandoned() -> list[str]:
    """What the pools' threads are doing now (at exit: what the process abandons)."""
    with _running_lock:
        return sorted(_running.values())


@atexit.register
def _name_what_exit_abandons() -> None:
    left = abandoned()
    if left:
        log.warning("the process exits with checkpoint transfers still under way; they are abandoned (the store did "
                    "not answer)", abandoned=left)


class DaemonPool(Executor):
    """Up to ``workers`` daemon threads; each task is started on an idle one, or a new one up to the limit."""

    def __init__(self, workers: int, name: str = "runner-checkpoint-pool"):
        if workers < 1:
            raise ValueError(f"DaemonPool(workers={workers}): use 1 or more")
        self._workers, self._name = workers, name
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)``; ``what=`` (keyword, not passed on) names it should the process exit first."""
        what = kwargs.pop("what", None) or getattr(fn, "__name__", repr(fn))
        future: Future = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot submit to a DaemonPool after shutdown")
            self._tasks.put((future, fn, args, kwargs, what))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    task[0].cancel()
        for _ in threads:
            self._tasks.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, fn, args, kwargs, what = task
            if future.set_running_or_notify_cancel():
                number = next(_numbers)
                with _running_lock:
                    _running[number] = what
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - the caller reads it from the future
                    future.set_exception(exc)
                finally:
                    with _running_lock:
                        _running.pop(number, None)
                del future, fn, args, kwargs
            self._idle.release()
