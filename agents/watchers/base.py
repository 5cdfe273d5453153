"""One normalised notice type and the small interface every metadata watcher implements.

A watcher knows one protocol and nothing about timing, deduplication or backoff: those belong to the
one loop (:mod:`agents.watchers.loop`). It reports the notices that are present *now* (level, not
edge); the loop turns them into events by their deterministic ``id``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from runner.errors import RunnerError

SOURCES = ("aws", "gcp", "azure", "signal")  # signal: SIGTERM at shutdown, handled as a notice
KINDS = ("termination", "rebalance", "maintenance")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# A deadline further ahead than this is taken as this far ahead: no real notice is (maintenance is scheduled
# weeks ahead at most), and a time near the year 9999 would overflow the arithmetic on it.
MAX_DEADLINE_AHEAD = timedelta(days=366)


def to_utc(moment: datetime) -> datetime:
    """An aware UTC datetime: a naive one is taken as UTC; one past the calendar's end in UTC is its end."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:  # 9999-12-31T23:59:59-05:00 is in the year 10000 in UTC
        edge = datetime.max if moment.year == datetime.max.year else datetime.min
        return edge.replace(tzinfo=timezone.utc)


def parse_iso(text: str) -> datetime:
    """``2017-09-18T08:22:00Z`` (and other RFC 3339 forms) as an aware UTC datetime."""
    return to_utc(datetime.fromisoformat(text.strip().replace("Z", "+00:00")))


@dataclass(frozen=True)
class Notice:
    """A preemption or maintenance signal, the same shape whatever the cloud.

    ``id`` is deterministic and never contains a time (AWS's official mock recomputes ``time`` on every
    request): the same signal seen twice has the same id. ``deadline_monotonic`` is the deadline on
    this process's monotonic clock, immune to wall-clock steps.
    """

    source: str
    kind: str
    action: str
    id: str
    terminal: bool
    received_at: datetime
    deadline: datetime | None
    deadline_monotonic: float | None
    detail: dict[str, Any] = field(default_factory=dict, compare=False)
    replayed: bool = False  # restored from the loop's state file after a restart

    @classmethod
    def create(cls, source: str, kind: str, action: str, *, terminal: bool, key: str | None = None,
               deadline: datetime | None = None, grace: float | None = None,
               detail: dict[str, Any] | None = None) -> "Notice":
        """Stamp a notice seen now, on both clocks; ``grace`` (seconds from now) stands in for a deadline."""
        if source not in SOURCES or kind not in KINDS:
            raise ValueError(f"notice source {source!r} / kind {kind!r} is not one of {SOURCES} / {KINDS}")
        received, mono = utcnow(), time.monotonic()
        if grace is not None:
            deadline = received + timedelta(seconds=grace)
        if deadline is not None:
            deadline = min(to_utc(deadline), received + MAX_DEADLINE_AHEAD)
        left = None if deadline is None else mono + (deadline - received).total_seconds()
        return cls(source, kind, action, f"{source}:{kind}:{key or action}", terminal, received, deadline,
                   left, dict(detail or {}))

    def seconds_left(self, now_monotonic: float | None = None) -> float | None:
        if self.deadline_monotonic is None:
            return None
        return self.deadline_monotonic - (time.monotonic() if now_monotonic is None else now_monotonic)

    def to_json(self) -> dict[str, Any]:
        """What ``runner agent watch`` prints and what the restart log keeps."""
        return {"source": self.source, "kind": self.kind, "action": self.action, "deadline": iso(self.deadline),
                "received_at": iso(self.received_at), "terminal": self.terminal, "id": self.id}

    def timing(self) -> dict[str, float]:
        """Unix seconds for the controller's metrics: when this watcher saw the notice, its deadline and, where
        the protocol states it (``detail["issued_at"]``), when the cloud issued it. Empty for a replayed notice."""
        if self.replayed:
            return {}
        out = {"received_unix": self.received_at.timestamp()}
        if self.deadline is not None:
            out["deadline_unix"] = self.deadline.timestamp()
        try:
            if self.detail.get("issued_at"):
                out["issued_unix"] = parse_iso(str(self.detail["issued_at"])).timestamp()
        except ValueError:
            pass
        return out

    def to_state(self) -> dict[str, Any]:
        return {**self.to_json(), "detail": self.detail}

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> "Notice":
        """Rebuild a remembered notice; its monotonic deadline is recomputed from the wall clock."""
        deadline = parse_iso(data["deadline"]) if data.get("deadline") else None
        left = None if deadline is None else time.monotonic() + (deadline - utcnow()).total_seconds()
        return cls(data["source"], data["kind"], data["action"], data["id"], bool(data["terminal"]),
                   parse_iso(data["received_at"]), deadline, left, dict(data.get("detail") or {}), replayed=True)


class WatcherError(RunnerError):
    """The metadata server could not be read. Never a notice: the loop logs it, backs off and retries.

    ``persistent`` marks a configuration problem that will not go away by itself; the message says
    how to fix it.
    """

    def __init__(self, message: str, *, persistent: bool = False):
        super().__init__(message)
        self.persistent = persistent


class Watcher(ABC):
    """One source of notices (a cloud's metadata protocol, or one key of it)."""

    source: str = ""
    #: seconds between the starts of two checks; 0 when ``check`` waits by itself (a hanging GET)
    interval: float = 1.0

    @abstractmethod
    def check(self) -> list[Notice]:
        """Poll once and return the notices present now; raise :class:`WatcherError` on any failure."""

    def close(self) -> None:
        """Release connections; a check in flight may still finish."""


def http_session() -> "requests.Session":
    """A session that never goes through a proxy (metadata servers are link-local, or loopback) and puts a
    total deadline on every request, so a server that trickles its answer cannot hold a watcher."""
    from .deadline import DeadlineSession

    return DeadlineSession()
