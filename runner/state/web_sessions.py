"""Reads and writes behind the web page: its one-time sign-in links and browser sessions, and the
committed checkpoints it marks on a job's timeline.

Links and sessions are stored by the sha256 of their secret, never the secret itself. A link is spent by
deleting its row, so of two controllers sharing the database (or two tabs) only one can redeem it.
"""

from __future__ import annotations

import re

from .db import Database, Tx

LINK = "link"        # a one-time sign-in link
SESSION = "session"  # a signed-in browser


def add(tx: Tx, token_hash: str, kind: str, now: float, expires_at: float) -> None:
    """Store a link or session; expired ones are dropped on the way (there are only ever a few)."""
    tx.execute("DELETE FROM web_sessions WHERE expires_at <= ?", (now,))
    tx.execute("INSERT INTO web_sessions (token_hash, kind, created_at, expires_at) VALUES (?,?,?,?)",
               (token_hash, kind, now, expires_at))


def spend_link(tx: Tx, token_hash: str, now: float) -> bool:
    """Use up a sign-in link: True only for the first use of one that has not expired."""
    return tx.execute("DELETE FROM web_sessions WHERE token_hash = ? AND kind = ? AND expires_at > ?",
                      (token_hash, LINK, now)) == 1


def session_expires_at(db: Database, token_hash: str, now: float) -> float | None:
    """When a live session ends, or None when there is no such session (or it has expired)."""
    rows = db.query("SELECT expires_at FROM web_sessions WHERE token_hash = ? AND kind = ? AND expires_at > ?",
                    (token_hash, SESSION, now))
    return rows[0]["expires_at"] if rows else None


def remove(tx: Tx, token_hash: str) -> None:
    tx.execute("DELETE FROM web_sessions WHERE token_hash = ?", (token_hash,))


# The controller stores one measurement per committed checkpoint under this name and key (metrics.py).
_COMMIT_KEY = re.compile(r"/(\d+)/step-(\d+)/commit$")


def checkpoint_commits(db: Database, job_id: str) -> list[dict]:
    """The job's committed checkpoints still kept one by one: ``{"attempt", "step", "time"}``, oldest first.

    The newest 10 000 measurements of the whole controller are kept one by one; an older commit is gone from
    here, and the page then shows only the step each attempt saved last.
    """
    rows = db.query("SELECT key, attempt, time FROM measurements WHERE job_id = ? AND name = ? ORDER BY time",
                    (job_id, "checkpoint_commit_seconds"))
    commits = []
    for row in rows:
        match = _COMMIT_KEY.search(row["key"])
        if match:
            commits.append({"attempt": int(match.group(1)), "step": int(match.group(2)), "time": row["time"]})
    return commits
