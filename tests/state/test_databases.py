"""The state layer on both databases: one set of migrations, refusals that name what is wrong, output
kept in the database, shared secrets and the leader's lock."""

from __future__ import annotations

import time

from concurrent.futures import ThreadPoolExecutor

import pytest

from runner.state import DatabaseError, DatabaseUnreachable, SchemaTooNew, open_database
from runner.state.db import PostgresDatabase
from runner.state import migrations
from runner.state.dialect import to_postgres
from runner.state.leader import Leadership
from runner.state.logs import Chunk, DatabaseLogStore
from runner.state.migrations import MIGRATIONS, apply_migrations, schema_version
from runner.state.secrets import shared_secret
from runner.state.workdirs import DatabaseWorkdirs
from database_probes import round_trips
from stored import job_spec, offer as make_offer


def test_every_migration_applies_and_reopening_applies_none(empty_db_url):
    """A new database gets every migration; a second open (a restart, another controller) applies nothing."""
    db = open_database(empty_db_url)
    assert schema_version(db) == max(version for version, _ in MIGRATIONS)
    assert apply_migrations(db) == []
    assert open_database(empty_db_url).query("SELECT COUNT(*) AS n FROM schema_migrations")[0]["n"] == len(MIGRATIONS)


def test_epoch_seconds_keep_their_fraction(db_url):
    """REAL columns hold a full double on both (a Postgres REAL would round 1.7e9 to 128 s steps)."""
    db = open_database(db_url)
    with db.transaction() as tx:
        tx.execute("INSERT INTO jobs (id, name, spec, state, created_at, updated_at) VALUES (?,?,?,?,?,?)",
                   ("j", "j", "{}", "PENDING", 1763900000.125, 1763900000.125))
    assert db.query("SELECT created_at FROM jobs")[0]["created_at"] == 1763900000.125


def test_a_database_migrated_by_a_newer_runner_is_refused_naming_both_versions(db_url):
    db = open_database(db_url)
    with db.transaction() as tx:
        tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (999, 0.0))
    newest = max(version for version, _ in MIGRATIONS)
    with pytest.raises(SchemaTooNew, match=rf"schema version 999, newer than this runner's {newest}"):
        open_database(db_url)


def test_a_failing_migration_leaves_nothing_half_applied(db_url, monkeypatch):
    """Its first statement is rolled back with it, and its version is not recorded."""
    open_database(db_url)
    broken = (10_000, "CREATE TABLE half_done (x INTEGER); CREATE TABLE jobs (x INTEGER)")
    monkeypatch.setattr(migrations, "MIGRATIONS", [*MIGRATIONS, broken])
    with pytest.raises(Exception):
        open_database(db_url)
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS)
    db = open_database(db_url)
    assert schema_version(db) == max(version for version, _ in MIGRATIONS)
    with pytest.raises(Exception):
        db.query("SELECT * FROM half_done")


def test_an_unreachable_postgres_is_named_by_host_and_port_without_the_password(postgres):
    url = postgres.url(password="hunter2-secret", port=1)
    with pytest.raises(DatabaseUnreachable) as raised:
        open_database(url)
    assert "127.0.0.1:1" in str(raised.value) and "hunter2-secret" not in str(raised.value)


def test_a_wrong_password_is_refused_without_showing_it(postgres):
    with pytest.raises(DatabaseUnreachable) as raised:
        open_database(postgres.url(password="wrong-pw-1234"))
    assert f"127.0.0.1:{postgres.port}" in str(raised.value) and "wrong-pw-1234" not in str(raised.value)


def test_output_stored_in_the_database_keeps_exact_offsets(db_url):
    """A resent chunk is stored once, a gap is refused with the offset to resend from, reads slice exactly."""
    logs = DatabaseLogStore(open_database(db_url))
    assert logs.append("j", 1, 0, b"hello ") == 6
    assert logs.append("j", 1, 3, b"lo world\n") == 12  # overlaps what is stored: only the new part lands
    assert logs.append("j", 1, 40, b"late") == 12  # a gap: resend from 12
    assert logs.append("j", 1, 0, b"\x00\xff", node=1) == 2  # another rank's stream, binary kept as is
    assert logs.read("j", 1) == b"hello world\n"
    assert logs.read("j", 1, offset=4, limit=3) == b"o w"
    assert logs.read("j", 1, offset=12) == b"" and logs.read("j", 2) == b""
    assert logs.read("j", 1, node=1) == b"\x00\xff" and logs.size("j", 1, node=1) == 2


def test_racing_resends_of_one_stream_store_every_byte_once(db_url):
    """Log appends are not serialized with other writers: a chunk and its retry racing from several threads
    (a reply lost, the agent sends again) still leave the stream exactly as the agent wrote it."""
    logs = DatabaseLogStore(open_database(db_url))
    text = b"".join(b"line %d\n" % i for i in range(200))
    pieces = [text[i:i + 37] for i in range(0, len(text), 37)]

    def send_all(_):
        offset = 0
        for piece in pieces:  # each sender sends the whole stream, piece by piece, as one agent and its retry
            assert logs.append("j", 1, offset, piece) >= offset + len(piece)
            offset += len(piece)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send_all, range(4)))
    assert logs.read("j", 1) == text and logs.size("j", 1) == len(text)


def test_a_batch_of_chunks_answers_each_as_one_append_would(db_url):
    """Many streams' chunks in one batch (one read of the sizes, one INSERT): a new chunk, a resend, an overlap,
    a gap, an empty chunk and a stream's second chunk each get the offset to send next and store what is new."""
    logs = DatabaseLogStore(open_database(db_url))
    logs.append("j", 1, 0, b"hello ")
    logs.append("j", 1, 0, b"rank one\n", node=1)
    batch = [Chunk("j", 1, 0, 6, b"world\n"),        # the next bytes of a stream
             Chunk("j", 1, 1, 0, b"rank one\n"),     # a resend of what is stored: nothing new
             Chunk("j", 2, 0, 0, b"attempt two\n"),  # a new stream
             Chunk("j", 2, 0, 12, b"and more\n"),    # its second chunk in the same batch (a fast agent's next one)
             Chunk("j", 3, 0, 5, b"late"),            # a gap: resend from 0
             Chunk("k", 1, 0, 0, b""),                # nothing at all
             Chunk("j", 1, 1, 4, b" one\nrank two\n")]  # overlaps the stored end: only the new part lands
    with logs.db.transaction(serialized=False) as tx:
        answers = logs.append_many_in(tx, batch)
    assert answers == [12, 9, 12, 21, 0, 0, 18]
    assert logs.read("j", 1) == b"hello world\n"
    assert logs.read("j", 1, node=1) == b"rank one\nrank two\n"
    assert logs.read("j", 2) == b"attempt two\nand more\n"
    assert logs.read("j", 3) == b"" and logs.read("k", 1) == b""


def test_a_batched_chunk_whose_start_another_writer_took_stores_only_what_is_new(db_url, backend, monkeypatch):
    """Another controller committed the same stream's next chunk between the batch's read and its INSERT: the
    INSERT skips that chunk, which is then appended after what the other stored, nothing twice."""
    import runner.state.logs as logs_module

    if backend == "sqlite":
        pytest.skip("SQLite has one writer at a time: no other can commit inside this transaction")

    logs = DatabaseLogStore(open_database(db_url))
    other = DatabaseLogStore(open_database(db_url))
    logs.append("j", 1, 0, b"one\n")
    read_sizes = logs_module._sizes

    def sizes_then_a_racing_commit(tx, streams):
        found = read_sizes(tx, streams)
        other.append("j", 1, 4, b"two\n")  # committed by another connection after the read
        return found

    monkeypatch.setattr(logs_module, "_sizes", sizes_then_a_racing_commit)
    with logs.db.transaction(serialized=False) as tx:
        assert logs.append_many_in(tx, [Chunk("j", 1, 0, 4, b"two\nthree\n")]) == [14]
    assert logs.read("j", 1) == b"one\ntwo\nthree\n"


_REFUSE_LATER_CHUNKS_OF_BAD = {
    "sqlite": ["CREATE TRIGGER refuse_bad BEFORE INSERT ON log_chunks WHEN NEW.job_id = 'bad' AND NEW.start > 0 "
               "BEGIN SELECT RAISE(ABORT, 'refused'); END"],
    "postgres": ["CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF NEW.job_id = 'bad' AND NEW.start > 0 THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$",
                 "CREATE TRIGGER refuse_bad BEFORE INSERT ON log_chunks FOR EACH ROW EXECUTE FUNCTION refuse_bad()"],
}


def test_a_chunk_appended_after_the_batch_that_fails_loses_only_its_own_write(db_url, backend):
    """A stream's second chunk in a batch is appended after the batch's INSERT: where the database refuses it, that
    chunk is answered with the error, and the batch and every other chunk are kept."""
    logs = DatabaseLogStore(open_database(db_url))
    with logs.db.transaction() as tx:
        for statement in _REFUSE_LATER_CHUNKS_OF_BAD[backend]:
            tx.execute(statement)
    with logs.db.transaction(serialized=False) as tx:
        answers = logs.append_many_in(tx, [Chunk("bad", 1, 0, 0, b"first\n"), Chunk("ok", 1, 0, 0, b"fine\n"),
                                           Chunk("bad", 1, 0, 6, b"second\n"), Chunk("ok", 1, 1, 0, b"too\n")])
    assert answers[:2] == [6, 5] and isinstance(answers[2], Exception) and answers[3] == 4
    assert (logs.read("bad", 1), logs.read("ok", 1), logs.read("ok", 1, node=1)) == (b"first\n", b"fine\n", b"too\n")


_MEASURE = ("INSERT INTO measurements (key, job_id, attempt, time, name, labels, value) VALUES (?, 'j', 1, 0, 'n', "
            "'{}', 1.0) RETURNING key")


def test_a_statement_in_a_savepoint_of_its_own_fails_alone_and_a_failed_transaction_keeps_nothing(db_url):
    """``all_in_savepoint`` (on Postgres the savepoint, the statement and the release in one round trip): its rows,
    or its error with only its own write undone. A transaction whose work raises keeps nothing and leaves the
    write lock to the next writer."""
    db, other = open_database(db_url), open_database(db_url)
    with db.transaction() as tx:
        assert tx.all_in_savepoint(_MEASURE, ("a",)) == [{"key": "a"}]
        with pytest.raises(Exception):
            tx.all_in_savepoint(_MEASURE, ("a",))  # the key is taken
        assert tx.all_in_savepoint(_MEASURE, ("b",)) == [{"key": "b"}]
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            tx.execute(_MEASURE, ("c",))
            raise RuntimeError("the work failed")
    with ThreadPoolExecutor(1) as pool:  # another controller's serialized write is not kept waiting
        assert pool.submit(lambda: _keys_in_a_write(other)).result(timeout=30) == ["a", "b"]
    db.close()
    other.close()


def _keys_in_a_write(db) -> list[str]:
    with db.transaction() as tx:
        return [row["key"] for row in tx.all("SELECT key FROM measurements ORDER BY key")]


def test_a_postgres_write_begins_with_its_first_statement_in_one_round_trip(postgres):
    """Every round trip of a write waits for the server and, under load, for the interpreter: BEGIN and the write lock
    go out with the first statement, so a one-statement write is two round trips (three before), and a transaction
    that sends nothing costs none."""
    url = postgres.new_database()
    open_database(url).close()  # migrated
    db = PostgresDatabase(url, pool_size=1)

    def one_statement(db):
        with db.transaction() as tx:
            tx.execute(_MEASURE, ("a",))

    def nothing(db):
        with db.transaction():
            pass

    assert round_trips(db, one_statement) == 2
    assert round_trips(db, nothing) == 0
    assert [row["key"] for row in db.query("SELECT key FROM measurements")] == ["a"]
    db.close()


def test_a_failed_statement_whose_error_was_caught_fails_the_commit_instead_of_losing_the_writes_in_silence(postgres):
    """On Postgres a statement's error aborts the whole transaction, and COMMIT then rolls back without an error: a
    caller that caught the error without undoing a savepoint would take its earlier writes for stored. The commit
    says so instead, and nothing is kept."""
    db = open_database(postgres.new_database())
    with pytest.raises(DatabaseError, match="failed and nothing of it was stored"):
        with db.transaction() as tx:
            tx.execute(_MEASURE, ("a",))
            try:
                tx.execute(_MEASURE, ("a",))  # the key is taken
            except Exception:  # noqa: BLE001 - the mistake under test
                pass
    assert db.query("SELECT key FROM measurements") == []
    with db.transaction() as tx:  # the connection went back to the pool usable
        tx.execute(_MEASURE, ("b",))
    assert [row["key"] for row in db.query("SELECT key FROM measurements")] == ["b"]
    db.close()


def test_a_workdir_archive_is_stored_once_and_streamed_back_whole(db_url, monkeypatch):
    monkeypatch.setattr("runner.state.workdirs.CHUNK_BYTES", 4)
    archives = DatabaseWorkdirs(open_database(db_url))
    assert not archives.has("d1")
    archives.put("d1", b"0123456789")
    archives.put("d1", b"a second upload of the same digest changes nothing")
    assert archives.has("d1") and b"".join(archives.stream("d1")) == b"0123456789"


def test_the_first_controller_creates_a_shared_secret_and_the_others_read_it(db_url):
    db = open_database(db_url)
    first = shared_secret(db, "admin-token")
    assert shared_secret(open_database(db_url), "admin-token", adopt="from-another-data-dir") == first
    assert shared_secret(db, "node-secret", adopt="kept-from-before") == "kept-from-before"


def test_one_leader_at_a_time_and_the_next_takes_over_when_it_goes(postgres):
    url = postgres.new_database()
    first, second = Leadership(open_database(url)), Leadership(open_database(url))
    assert first.try_acquire() and first.held()
    assert not second.try_acquire()
    first.release()  # what a dead leader's closed connection does
    # The server frees the lock once it has ended the closed session, a moment after the close: the follower, trying
    # on the connection it keeps, takes over at one of its next tries (each second, in a controller).
    deadline = time.monotonic() + 60
    while not second.try_acquire():
        assert time.monotonic() < deadline, "the follower never took the lock over"
        time.sleep(0.05)
    assert not first.held()


@pytest.mark.parametrize("portable, postgres_sql", [
    ("SELECT * FROM t WHERE a = ? AND b = ?", "SELECT * FROM t WHERE a = %s AND b = %s"),
    ("CREATE TABLE t (a REAL, b INTEGER NOT NULL, c BLOB)", "CREATE TABLE t (a DOUBLE PRECISION, b BIGINT NOT NULL, c BYTEA)"),
    ("CREATE TABLE e (id INTEGER PRIMARY KEY AUTOINCREMENT)", "CREATE TABLE e (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY)"),
    ("INSERT OR IGNORE INTO m (k) VALUES (?)", "INSERT INTO m (k) VALUES (%s) ON CONFLICT DO NOTHING"),
    ("SELECT k FROM m ORDER BY k LIMIT -1 OFFSET ?", "SELECT k FROM m ORDER BY k LIMIT ALL OFFSET %s"),
    ("SELECT 'REAL ?' AS s, a % 2 FROM t", "SELECT 'REAL ?' AS s, a %% 2 FROM t"),
])
def test_portable_sql_becomes_postgres_sql(portable, postgres_sql):
    """The dialect's rewrites, and nothing inside a string literal."""
    assert to_postgres(portable) == postgres_sql


def test_a_leader_whose_session_dies_knows_it_and_the_lock_is_free(postgres):
    """The database ending the leader's session (a restart, a network cut) frees the lock at once."""
    import psycopg

    url = postgres.new_database()
    leader, other = Leadership(open_database(url)), Leadership(open_database(url))
    assert leader.try_acquire()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
    assert not leader.held()
    assert other.try_acquire()


def test_rows_decode_to_their_declared_types(db_url):
    """A cancel request is a timestamp (never a bool), flags are bools and times floats, on either database."""
    import time as clock

    from runner.state import Store

    store = Store(open_database(db_url))
    offer = make_offer(region="r", zone="z", instance_type="t")
    with store.db.transaction() as tx:
        store.insert_job(tx, "j", "j", job_spec("j"), "PENDING", 1000)
        store.insert_attempt(tx, "j", "n1", offer, True, 0, 1000)
        store.insert_node(tx, "n1", "j", 1, "local", "hash", offer, False, 1000)
    job = store.job("j")
    assert job.cancel_requested is None and isinstance(job.created_at, float)
    with store.db.transaction() as tx:
        store.request_cancel(tx, "j", 1763900000.0)
        store.request_cancel(tx, "j", clock.time() + 99)  # a second request keeps the first
    assert store.job("j").cancel_requested == 1763900000.0
    attempt, node = store.attempts("j")[0], store.node("n1")
    assert attempt.spot is True and isinstance(attempt.started_at, float) and attempt.end_reason == "running"
    assert node.spot is False and node.offer == offer and isinstance(node.attempt, int)

