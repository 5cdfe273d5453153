"""SQLite specifics (the migrations on both databases: tests/state/test_databases.py)."""

from __future__ import annotations

from runner.state import open_database

SQLITE_ONLY = "WAL mode is a SQLite pragma"


def test_wal_mode_is_on(tmp_path):
    """The database runs in WAL mode so readers never block the reconciler's writes."""
    db = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    assert db.query("PRAGMA journal_mode")[0]["journal_mode"] == "wal"
