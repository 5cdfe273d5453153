"""What the group commit (group_commit.py) and the batched heartbeat reads (heartbeat_reads.py) share: requests
that arrive while one batch is out wait together, and one thread hands each batch to the work that serves it
at once, then answers every request of it on the event loop it came from."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class Batcher:
    """``await self._submit(item)``: ``item`` joins the next batch; ``_serve_batch`` answers the batch's requests
    (``(item, future, loop)`` each) through :func:`hand_back`."""

    def __init__(self, name: str, max_batch: int, join_seconds: float):
        self._name = name
        self._max_batch = max_batch
        self._join_seconds = join_seconds
        self._waiting: list[tuple[Any, asyncio.Future, asyncio.AbstractEventLoop]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _serve_batch(self, batch: list[tuple[Any, asyncio.Future, asyncio.AbstractEventLoop]]) -> None:
        raise NotImplementedError

    async def _submit(self, item: Any, start: bool = False) -> Any:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        with self._lock:
            if self._stopping:
                raise RuntimeError("the controller is stopping")
            if start:
                self._start_locked()
            self._waiting.append((item, answer, loop))
        self._wake.set()
        return await answer

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()

    def start(self) -> None:
        with self._lock:
            self._start_locked()

    def stop(self) -> None:
        """Serve what is waiting, then end the thread."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(self._join_seconds)

    def _serve(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                with self._lock:
                    batch, self._waiting = self._waiting[:self._max_batch], self._waiting[self._max_batch:]
                    stopping = self._stopping
                if not batch:
                    break
                self._serve_batch(batch)
            if stopping:
                return


def hand_back(loop: asyncio.AbstractEventLoop, answer: asyncio.Future, value, failed: bool = False) -> None:
    """Settle ``answer`` on its own loop with ``value`` (an exception when ``failed``)."""
    try:
        loop.call_soon_threadsafe(_fail if failed else _settle, answer, value)
    except RuntimeError:  # that loop has closed (the server stopped): nobody waits for this answer any more
        pass


def _settle(answer: asyncio.Future, value) -> None:
    if not answer.done():  # the request may have been abandoned (its client went away)
        answer.set_result(value)


def _fail(answer: asyncio.Future, exc: Exception) -> None:
    if not answer.done():
        answer.set_exception(exc)
