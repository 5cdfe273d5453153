"""The controllers serving one database, as nodes reach them: each records its advertised URL and refreshes
when it was last seen serving (runner/controller/discovery.py)."""

from __future__ import annotations

from .db import Database


def announce(db: Database, url: str, now: float) -> None:
    """Record (or refresh) that the controller nodes reach at ``url`` is serving now."""
    with db.transaction() as tx:
        tx.execute("INSERT INTO controllers (url, seen_at) VALUES (?, ?) "
                   "ON CONFLICT (url) DO UPDATE SET seen_at = excluded.seen_at", (url, now))


def withdraw(db: Database, url: str) -> None:
    """A controller stopping: nodes launched from now on are not sent to it."""
    with db.transaction() as tx:
        tx.execute("DELETE FROM controllers WHERE url = ?", (url,))


def live_urls(db: Database, since: float) -> list[str]:
    """The URLs of the controllers seen serving at or after ``since``, the most recently seen first."""
    return [row["url"] for row in db.query("SELECT url FROM controllers WHERE seen_at >= ? ORDER BY seen_at DESC, url",
                                            (since,))]
