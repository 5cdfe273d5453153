"""Schema migrations, applied in order and recorded in ``schema_migrations``.

Append new migrations; never edit one that has shipped.
"""

from __future__ import annotations

import time

from .errors import SchemaTooNew
from ..protocol.urls import redact

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
        # Job telemetry (docs/restart-log.md): what each attempt trained, and the run manifest it reported.
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
    (
        8,
        # Teams (docs/operations.md): the secrets every controller of one database shares (the admin token, the
        # node secret), and job output and uploaded workdirs, kept in the database when several controllers
        # serve it.
        """
        CREATE TABLE controller_secrets (
            name TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        CREATE TABLE log_chunks (
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            node INTEGER NOT NULL,
            start INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (job_id, attempt, node, start)
        );
        CREATE TABLE workdir_chunks (
            digest TEXT NOT NULL,
            seq INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (digest, seq)
        )
        """,
    ),
    (
        9,
        # Every agent request finds its node by the token's hash: an index, not a scan of every node ever launched.
        """
        CREATE INDEX nodes_token_hash ON nodes(token_hash)
        """,
    ),
    (
        10,
        # `runner jobs` lists the active jobs and those ended lately, newest first, at most N: at 10,000 jobs an
        # index on each, not a scan and a sort of every job.
        """
        CREATE INDEX jobs_ended_at ON jobs(ended_at);
        CREATE INDEX jobs_created_at ON jobs(created_at)
        """,
    ),
    (
        11,
        # What each preemption costs, node by node: when the provider was asked for the node (billed from then),
        # when its agent first registered (boot: launched_at to first_registered_at; registered_at moves with
        # each attempt of a kept gang node), and when the job's `setup` ran on it.
        """
        ALTER TABLE nodes ADD COLUMN launched_at REAL;
        ALTER TABLE nodes ADD COLUMN first_registered_at REAL;
        ALTER TABLE nodes ADD COLUMN setup_started_at REAL;
        ALTER TABLE nodes ADD COLUMN setup_ended_at REAL
        """,
    ),
    (
        12,
        # The ledger: where an attempt's time went. Its first and last training step and when (unix seconds,
        # the training's own clock), and how long its start took on its node(s): the boot (launch to the agent's
        # first registration), the job's setup, the training's restore(). A gang's per node rank as well.
        """
        ALTER TABLE attempts ADD COLUMN first_step INTEGER;
        ALTER TABLE attempts ADD COLUMN first_step_at REAL;
        ALTER TABLE attempts ADD COLUMN last_step INTEGER;
        ALTER TABLE attempts ADD COLUMN last_step_at REAL;
        ALTER TABLE attempts ADD COLUMN boot_seconds REAL;
        ALTER TABLE attempts ADD COLUMN setup_seconds REAL;
        ALTER TABLE attempts ADD COLUMN restore_seconds REAL;
        ALTER TABLE attempt_nodes ADD COLUMN boot_seconds REAL;
        ALTER TABLE attempt_nodes ADD COLUMN setup_seconds REAL;
        ALTER TABLE attempt_nodes ADD COLUMN restore_seconds REAL
        """,
    ),
    (
        13,
        # Controllers sharing a database: the URL nodes reach each at, and when it last said it was serving,
        # so a node is launched knowing every live controller, not only the one that launched it.
        """
        CREATE TABLE controllers (
            url TEXT PRIMARY KEY,
            seen_at REAL NOT NULL
        )
        """,
    ),
    (
        14,
        # A replacement prepared while the job still trains (runner/state/standbys.py): a node launched for the
        # job's next attempt before that attempt exists (attempt 0, ``prepared_for`` the attempt it may replace),
        # ready once its agent has run setup; the attempt it stood by for keeps the record in ``standby``.
        """
        ALTER TABLE nodes ADD COLUMN prepared_for INTEGER;
        ALTER TABLE nodes ADD COLUMN ready_at REAL;
        ALTER TABLE attempts ADD COLUMN standby TEXT
        """,
    ),
    (
        15,
        # Elastic gangs (runner/state/elastic.py): the worlds an attempt trained in (each generation's node ranks
        # and rendezvous), when each node joined or left it, and the world sizes the training side reported.
        """
        ALTER TABLE attempts ADD COLUMN world_sizes TEXT;
        ALTER TABLE attempts ADD COLUMN world_generation INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE attempt_nodes ADD COLUMN joined_at REAL;
        ALTER TABLE attempt_nodes ADD COLUMN left_at REAL;
        CREATE TABLE elastic_worlds (
            job_id TEXT NOT NULL REFERENCES jobs(id),
            attempt INTEGER NOT NULL,
            generation INTEGER NOT NULL,
            ranks TEXT NOT NULL,
            master_addr TEXT NOT NULL,
            master_port INTEGER NOT NULL,
            reason TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (job_id, attempt, generation)
        )
        """,
    ),
    (
        16,
        # A gang node whose training processes all finished and exited while its launcher still ran (node 0's hosts
        # the store the other launchers wait on): when it said so. Its part of the attempt succeeded from then on,
        # whatever its launcher's exit (reported later, in exit_reason) says.
        """
        ALTER TABLE attempt_nodes ADD COLUMN ranks_finished_at REAL
        """,
    ),
]


def apply_migrations(db, apply: bool = True) -> list[int]:
    """Bring a database's schema up to date; return the versions applied now.

    Each migration runs in its own transaction with its ``schema_migrations`` row (on Postgres DDL is
    transactional too), so a failure leaves the schema at the last whole version. A database migrated by a
    newer runner is refused before anything is applied. ``apply=False`` only checks."""
    newest_known = max(version for version, _ in MIGRATIONS)
    applied = []
    with db.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        current = _version(tx)
    if current > newest_known:
        raise SchemaTooNew(f"the database {_name(db)} is at schema version {current}, newer than this runner's "
                           f"{newest_known}: it was migrated by a newer runner; upgrade runner to use it")
    for version, script in sorted(MIGRATIONS):
        if not apply:
            break
        with db.transaction() as tx:  # serialised with every other writer: two controllers starting migrate once
            if tx.one("SELECT version FROM schema_migrations WHERE version = ?", (version,)):
                continue
            for statement in filter(str.strip, script.split(";")):
                tx.execute(statement)
            tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (version, time.time()))
        applied.append(version)
    return applied


def schema_version(db) -> int:
    """The newest migration the database has (0 for an empty one)."""
    with db.transaction() as tx:
        return _version(tx)


def _version(tx) -> int:
    return int(tx.one("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations")["v"])


def _name(db) -> str:
    return redact(getattr(db, "url", "?"))
