"""A watch that acts once, on a thread of its own, when a condition has held for a while (polled twice a second):
the launcher's early end (agents/elastic.py's LauncherWatch) and node 0's report that its part is done
(agents/launcher_exit.py's RanksFinished)."""

from __future__ import annotations

import threading
import time
from typing import Callable

POLL_SECONDS = 0.5


class HeldWatch:
    """Calls ``act`` once ``held()`` has been true without a break for ``linger`` seconds (a number, or a callable
    read at each poll); ``acted`` is set just before. :meth:`close` stops the watch, and an ``act`` not begun by then
    never begins."""

    def __init__(self, held: Callable[[], bool], act: Callable[[], None], linger: float | Callable[[], float],
                 name: str):
        self.held, self.act, self.linger, self.name = held, act, linger, name
        self.acted = False
        self._done = threading.Event()

    def start(self):
        threading.Thread(target=self._run, name=self.name, daemon=True).start()
        return self

    def close(self) -> None:
        self._done.set()

    def _run(self) -> None:
        since = None
        while not self._done.wait(POLL_SECONDS):
            if not self.held():
                since = None
                continue
            since = since or time.monotonic()
            linger = self.linger() if callable(self.linger) else self.linger
            if time.monotonic() - since >= linger and not self._done.is_set():
                self.acted = True
                self.act()
                return
