"""Schema migrations: applied once, recorded, and safe to re-run at every start."""

from __future__ import annotations

from runner.state import open_database
from runner.state.migrations import MIGRATIONS, apply_migrations, schema_version


def test_a_new_database_gets_every_migration_and_reopening_applies_none(tmp_path):
    """Opening twice leaves the schema at the newest version with nothing applied the second time."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    db = open_database(url)
    conn = db._connection()
    assert schema_version(conn) == MIGRATIONS[-1][0]
    assert apply_migrations(conn) == []
    open_database(url)  # a controller restart
    assert db.query("SELECT COUNT(*) AS n FROM schema_migrations")[0]["n"] == len(MIGRATIONS)


def test_wal_mode_is_on(tmp_path):
    """The database runs in WAL mode so readers never block the reconciler's writes."""
    db = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    assert db.query("PRAGMA journal_mode")[0]["journal_mode"] == "wal"
