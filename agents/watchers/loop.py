"""The one loop: timing, deduplication, error handling and backoff for every watcher.

Each watcher runs in its own thread (so a hanging GET never delays a poll). A check that fails, for
whatever reason, is logged and retried after a jittered exponential backoff; nothing a metadata
server does (down, slow, 401, 503, garbage) is ever a notice, and nothing makes the loop exit.

Notices are delivered to the callback once per ``id``, one at a time. Only the first terminal notice
is acted on; it is written to the state file before the callback runs and is replayed (with
``replayed=True``) when the loop starts again after an agent restart on the same boot.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from .base import Notice, Watcher, WatcherError

log = structlog.get_logger(__name__)
# Its own generator: jitter drawn from the global one would move the stream of whatever else draws from it.
_JITTER = random.Random()

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id() -> str:
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return "unknown"


class WatchLoop:
    """Runs watchers until stopped and calls ``on_notice`` for each new notice."""

    def __init__(self, watchers: Sequence[Watcher], on_notice: Callable[[Notice], None], *,
                 state_path: str | os.PathLike[str] | None = None, backoff_initial: float = 0.25,
                 backoff_max: float = 5.0, min_gap: float = 0.02, boot_id: str | None = None):
        if not watchers:
            raise ValueError("WatchLoop needs at least one watcher")
        self.watchers = list(watchers)
        self.on_notice = on_notice
        self.state_path = Path(state_path) if state_path else None
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.min_gap = min_gap
        self.boot_id = boot_id or current_boot_id()
        self._stop = threading.Event()
        self._terminal_seen = threading.Event()
        self._deliver_lock = threading.Lock()
        self._seen: set[str] = set()
        self._terminal: Notice | None = None
        self._threads: list[threading.Thread] = []
        self.errors = 0  # failed checks so far, all watchers together

    # --- public -----------------------------------------------------------------
    @property
    def terminal(self) -> Notice | None:
        """The first terminal notice (seen now or remembered from before a restart)."""
        return self._terminal

    def start(self) -> "WatchLoop":
        remembered = self._load_state()
        if remembered is not None:
            log.warning("replaying terminal notice remembered from before a restart", notice=remembered.to_json())
            self._seen.add(remembered.id)
            self._terminal = remembered
            self._terminal_seen.set()
            self._call(remembered)
        for watcher in self.watchers:
            thread = threading.Thread(target=self._run, args=(watcher,), daemon=True,
                                      name=f"watch-{watcher.source}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for watcher in self.watchers:
            try:
                watcher.close()
            except Exception:  # noqa: BLE001 - closing must not fail a shutdown
                pass
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))

    def wait_terminal(self, timeout: float | None = None) -> Notice | None:
        """The first terminal notice once it has been delivered, else None after ``timeout``."""
        return self._terminal if self._terminal_seen.wait(timeout) else None

    def __enter__(self) -> "WatchLoop":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- one thread per watcher --------------------------------------------------------
    def _run(self, watcher: Watcher) -> None:
        failures = 0
        tick = time.monotonic()
        while not self._stop.is_set():
            try:
                notices = watcher.check()
            except Exception as exc:  # noqa: BLE001 - a watcher must never take the loop down
                if self._stop.is_set():
                    return
                failures += 1
                self.errors += 1
                self._log_failure(watcher, exc, failures)
                if self._stop.wait(self._backoff(failures)):
                    return
                tick = time.monotonic()
                continue
            if failures:
                log.info("metadata server answering again", source=watcher.source, failed_checks=failures)
                failures = 0
            for notice in notices:
                try:
                    self._deliver(notice)
                except Exception:  # noqa: BLE001 - one notice that cannot be handled must not end the watch
                    log.exception("notice could not be delivered", source=watcher.source, notice=notice.id)
            # fixed-rate ticks (no drift from request time), never closer than min_gap
            now = time.monotonic()
            tick = max(tick + watcher.interval, now + self.min_gap)
            self._stop.wait(tick - now)

    def _backoff(self, failures: int) -> float:
        # Doublings past the one that reaches backoff_max change nothing: a count of failures in the thousands
        # (a metadata server down for a day) must not overflow the float.
        doublings = min(failures - 1, max(0, math.ceil(math.log2(self.backoff_max) - math.log2(self.backoff_initial))) + 1)
        delay = min(self.backoff_max, self.backoff_initial * 2.0 ** max(0, doublings))
        return delay * _JITTER.uniform(0.8, 1.2)

    def _log_failure(self, watcher: Watcher, exc: Exception, failures: int) -> None:
        if failures & (failures - 1):  # log the 1st, 2nd, 4th, 8th, ... failure in a row
            return
        fields = {"source": watcher.source, "failed_checks": failures, "error": str(exc)}
        if not isinstance(exc, WatcherError):
            log.exception("watcher check crashed; retrying", **fields)
        elif exc.persistent:
            log.error("metadata server misconfigured; no notice can be seen until fixed", **fields)
        else:
            log.warning("metadata server check failed; not a notice, retrying", **fields)

    def _deliver(self, notice: Notice) -> None:
        with self._deliver_lock:
            if notice.id in self._seen:
                return
            self._seen.add(notice.id)
            if notice.terminal:
                if self._terminal is not None:
                    log.info("later terminal notice ignored; acting on the first one",
                             notice=notice.to_json(), first=self._terminal.id)
                    return
                self._terminal = notice
                self._save_state(notice)
            log.info("notice", **notice.to_json())
            self._call(notice)
            if notice.terminal:
                self._terminal_seen.set()

    def _call(self, notice: Notice) -> None:
        try:
            self.on_notice(notice)
        except Exception:  # noqa: BLE001 - the callback's failure is not the loop's
            log.exception("notice callback failed", notice=notice.id)

    # --- state file -------------------------------------------------------------------
    def _save_state(self, notice: Notice) -> None:
        if self.state_path is None:
            return
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_name(self.state_path.name + ".tmp")
            tmp.write_text(json.dumps({"boot_id": self.boot_id, "terminal": notice.to_state()}))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.error("could not remember the terminal notice; a restart will not know it",
                      path=str(self.state_path), error=str(exc))

    def _load_state(self) -> Notice | None:
        if self.state_path is None or not self.state_path.exists():
            return None
        try:
            state = json.loads(self.state_path.read_text())
            if state.get("boot_id") != self.boot_id:
                log.info("forgetting a terminal notice from an earlier boot", path=str(self.state_path))
                return None
            return Notice.from_state(state["terminal"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("state file unreadable; starting without a remembered notice",
                      path=str(self.state_path), error=str(exc))
            return None
