"""Schema migrations, applied in order and recorded in ``schema_migrations``.

Append new migrations; never edit one that has shipped.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            ended_at REAL,
            preemptions INTEGER NOT NULL DEFAULT 0,
            failures INTEGER NOT NULL DEFAULT 0,
            step INTEGER NOT NULL DEFAULT 0,
            checkpoint TEXT,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            message TEXT
        );
        CREATE INDEX jobs_state ON jobs(state);

        CREATE TABLE attempts (
            job_id TEXT NOT NULL REFERENCES jobs(id),
            attempt INTEGER NOT NULL,
            node_id TEXT,
            cloud TEXT, region TEXT, zone TEXT, instance_type TEXT,
            spot INTEGER NOT NULL DEFAULT 1,
            price_per_hour REAL NOT NULL DEFAULT 0,
            started_at REAL NOT NULL,
            running_at REAL,
            ended_at REAL,
            end_reason TEXT NOT NULL DEFAULT 'running',
            notice TEXT,
            checkpoint_step INTEGER,
            resumed_from_step INTEGER NOT NULL DEFAULT 0,
            lost_seconds REAL,
            exit_code INTEGER,
            drill TEXT,
            message TEXT,
            PRIMARY KEY (job_id, attempt)
        );

        CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            job_id TEXT NOT NULL REFERENCES jobs(id),
            attempt INTEGER NOT NULL,
            provider TEXT NOT NULL,
            state TEXT NOT NULL,
            token_hash TEXT NOT NULL,
            offer TEXT NOT NULL,
            spot INTEGER NOT NULL,
            provider_ref TEXT,
            created_at REAL NOT NULL,
            registered_at REAL,
            last_heartbeat REAL,
            progress TEXT,
            terminate_at REAL,
            terminated_at REAL
        );
        CREATE INDEX nodes_job ON nodes(job_id);
        CREATE INDEX nodes_state ON nodes(state);

        CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL,
            attempt INTEGER,
            time REAL NOT NULL,
            kind TEXT NOT NULL,
            from_state TEXT,
            to_state TEXT,
            message TEXT
        );
        CREATE INDEX events_job ON events(job_id, id);

        CREATE TABLE log_offsets (
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            size INTEGER NOT NULL,
            PRIMARY KEY (job_id, attempt)
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE measurements (
            key TEXT PRIMARY KEY,
            job_id TEXT NOT NULL,
            attempt INTEGER,
            time REAL NOT NULL,
            name TEXT NOT NULL,
            labels TEXT NOT NULL,
            value REAL NOT NULL
        );
        CREATE INDEX measurements_name ON measurements(name);
        """,
    ),
    (
        3,
        """
        ALTER TABLE attempts ADD COLUMN num_nodes INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE attempts ADD COLUMN master_port INTEGER;
        ALTER TABLE nodes ADD COLUMN rank INTEGER NOT NULL DEFAULT 0;
        CREATE TABLE attempt_nodes (
            job_id TEXT NOT NULL REFERENCES jobs(id),
            attempt INTEGER NOT NULL,
            rank INTEGER NOT NULL,
            node_id TEXT NOT NULL,
            zone TEXT, instance_type TEXT,
            spot INTEGER NOT NULL DEFAULT 1,
            price_per_hour REAL NOT NULL DEFAULT 0,
            address TEXT,
            registered_at REAL,
            exit_reason TEXT,
            exit_code INTEGER,
            end_reason TEXT NOT NULL DEFAULT 'running',
            PRIMARY KEY (job_id, attempt, rank)
        );
        CREATE INDEX attempt_nodes_node ON attempt_nodes(node_id, attempt)
        """,
    ),
    (
        4,
        """
        CREATE TABLE measurement_rollup (
            name TEXT NOT NULL,
            labels TEXT NOT NULL,
            le TEXT NOT NULL,
            n INTEGER NOT NULL DEFAULT 0,
            total REAL NOT NULL DEFAULT 0,
            PRIMARY KEY (name, labels, le)
        );
        CREATE INDEX measurements_time ON measurements(time)
        """,
    ),
    (
        5,
        # Job telemetry (CONTRACT §9): what each attempt trained, and the run manifest it reported.
        """
        ALTER TABLE attempts ADD COLUMN steps INTEGER;
        ALTER TABLE attempts ADD COLUMN steps_per_second REAL;
        ALTER TABLE attempts ADD COLUMN peak_memory_gb REAL;
        ALTER TABLE attempts ADD COLUMN nan_steps INTEGER;
        CREATE TABLE attempt_manifests (
            job_id TEXT NOT NULL REFERENCES jobs(id),
            attempt INTEGER NOT NULL,
            manifest TEXT NOT NULL,
            PRIMARY KEY (job_id, attempt)
        )
        """,
    ),
    (
        7,
        # The web page's sign-in: one-time links and browser sessions, by the sha256 of their secret. In the
        # database, not in signed cookies, so that a link works once even when several controllers serve it.
        """
        CREATE TABLE web_sessions (
            token_hash TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL
        );
        CREATE INDEX web_sessions_expiry ON web_sessions(expires_at)
        """,
    ),
]


def apply_migrations(conn) -> list[int]:
    """Bring a connection's schema up to date; return the versions applied now."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    applied = []
    for version, script in MIGRATIONS:
        if version in done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations VALUES (?, strftime('%s','now'))", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(version)
    return applied


def schema_version(conn) -> int:
    row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return row[0] or 0
