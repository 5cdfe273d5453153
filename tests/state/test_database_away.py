"""A Postgres database that is known to be out of reach (a proxy in front of the real server closes every
connection) is said so at once: a request does not wait out the connection pool's whole timeout (here far longer
than any wait of the test) before its DatabaseUnreachable; the message names the server and the first cause, and
the database is used again as soon as it is back."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

from polling import eventually
from runner.state import DatabaseUnreachable
from runner.state.db import PostgresDatabase

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
from tcp_proxy import StallingProxy  # noqa: E402

POOL_WAIT = 600.0  # the pool's wait for a connection: a request that waits it out fails the test's waits


def _outcome_of(db: PostgresDatabase) -> dict:
    """A query run on a thread of its own, as a request's; its result or error lands in the dict."""
    outcome: dict = {}

    def ask():
        try:
            outcome["rows"] = db.query("SELECT 1 AS one")
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcome["error"] = exc

    threading.Thread(target=ask, daemon=True).start()
    return outcome


def test_a_database_known_to_be_away_is_said_so_at_once_and_used_again_once_it_is_back(postgres):
    url = urlparse(postgres.new_database(migrated=True))
    proxy = StallingProxy(("127.0.0.1", url.port))
    db = PostgresDatabase(url._replace(netloc=f"{url.username}:{url.password}@127.0.0.1:{proxy.port}").geturl(),
                          pool_timeout=POOL_WAIT)
    try:
        assert db.query("SELECT 1 AS one") == [{"one": 1}]
        proxy.cut()
        with pytest.raises(DatabaseUnreachable):  # the pooled connection was closed under it
            db.query("SELECT 1 AS one")
        for _ in range(3):  # the pool has no connection now and makes none: each request is answered all the same
            outcome = _outcome_of(db)
            eventually(lambda: outcome, "the request to be answered", timeout=120.0, every=0.05)
            error = outcome.get("error")
            assert isinstance(error, DatabaseUnreachable), outcome
            assert f"the database at 127.0.0.1:{proxy.port}/" in str(error) and "cannot be reached" in str(error)
            assert "couldn't get a connection" not in str(error), error  # the cause, not the pool's wait
        proxy.mend()
        eventually(lambda: _outcome_of_now(db), "the database to be used again", timeout=120.0, every=0.05)
    finally:
        db.close()
        proxy.close()
        postgres.drop_database(url.geturl())


def _outcome_of_now(db: PostgresDatabase) -> bool:
    try:
        return db.query("SELECT 1 AS one") == [{"one": 1}]
    except DatabaseUnreachable:
        return False
