"""How nodes find the controllers of a team (several controllers on one Postgres database).

A node knows the controllers listed in its agent's config, and its agent uses whichever answers. Listing
only the controller that launched it would cut the node off when that controller dies for good: it would
train on without reporting, and the controller that takes over would hand the next attempt a stale
checkpoint. So every controller records the URL nodes reach it at (``--advertise-url``, else the URL it
serves) in the database and refreshes it every few seconds; a node is launched with this controller's URL
first and then every other controller seen serving lately. A controller alone on SQLite gives its own URL.
"""

from __future__ import annotations

import threading
import time

import structlog

from ..state import controllers
from ..state.db import Database

log = structlog.get_logger(__name__)

ANNOUNCE_SECONDS = 5.0  # how often a controller says it is serving
LIVE_SECONDS = 60.0  # a controller not seen for this long is not given to new nodes


def split_urls(urls: str) -> list[str]:
    return [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]


class ControllerDirectory:
    def __init__(self, db: Database, own_urls: str, every: float = ANNOUNCE_SECONDS, live: float = LIVE_SECONDS,
                 clock=time.time):
        self.db = db
        self.own = split_urls(own_urls) or [own_urls]
        self.every, self.live, self.clock = every, live, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def shared(self) -> bool:
        return bool(self.db.shared)

    def start(self) -> "ControllerDirectory":
        if not self.shared:
            return self
        self._announce()
        self._thread = threading.Thread(target=self._run, name="controller-directory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.shared:
            for url in self.own:
                try:
                    controllers.withdraw(self.db, url)
                except Exception as exc:  # noqa: BLE001 - the database may be away; the row then ages out
                    log.warning("could not withdraw this controller's URL", url=url, error=str(exc))

    def node_urls(self) -> str:
        """The controller URLs a node is launched with: this controller's first, then every live one."""
        urls = list(self.own)
        if self.shared:
            try:
                others = controllers.live_urls(self.db, self.clock() - self.live)
            except Exception as exc:  # noqa: BLE001 - launch with what this controller knows
                log.warning("could not read the other controllers' URLs; the node gets this controller's only",
                            error=str(exc))
                others = []
            urls += [u for listed in others for u in split_urls(listed) if u not in urls]
        return ",".join(urls)

    def _announce(self) -> None:
        now = self.clock()
        for url in self.own:
            try:
                controllers.announce(self.db, url, now)
            except Exception as exc:  # noqa: BLE001 - the database is away: try again next round
                log.warning("could not record this controller's URL", url=url, error=str(exc))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._announce()
