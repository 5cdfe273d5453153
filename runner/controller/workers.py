"""`runner server --workers N`: the controller's API served by N processes on one host:port.

One process serves about 2,000 agent requests a second before its CPU is full (docs/architecture.md, Scale).
Several controllers may share one Postgres database, each serving the whole API while one at a time leads
(runs the scheduler and reconciler), so more API is more controllers: this starts N of them on this machine,
each an ordinary `runner server` process (its own pool of connections, heartbeat buffer, commit groups and
leader election), all listening on the same port with SO_REUSEPORT, so the kernel spreads the nodes' keep-alive
connections among them. The parent serves nothing itself: it reserves the port, brings the schema up to date
once, starts the workers (runner/controller/supervisor.py), writes the controller file with its own pid once
every worker is ready (so `runner server stop` stops them all), starts again a worker that dies or stops answering
its watchdog (runner/controller/worker_watchdog.py), and stops them all on SIGTERM or SIGINT. Under systemd it
pings the unit's watchdog itself, from the supervisor's loop.

A SQLite database has one writer at a time and is one controller's alone, so there it is bad input.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import IO

import structlog

from .. import sdnotify
from ..errors import InputError
from ..home import CONTROLLER_FILE, load_config
from ..private import make_data_dir_private
from ..state import open_database, redact
from .daemon import ServerSettings, _read_controller_file, _write_controller_file, bind, serving_url
from .supervisor import Supervisor
from .worker_watchdog import watchdog_seconds

log = structlog.get_logger(__name__)


def is_shared(db_url: str | None) -> bool:
    return bool(db_url) and db_url.startswith(("postgres://", "postgresql://"))


def check_workers(count: int, db_url: str | None) -> None:
    """Several workers need a database several controllers can share (Postgres); InputError otherwise."""
    if count > 1 and not is_shared(db_url):
        raise InputError(f"--workers {count} needs Postgres: a SQLite database has one writer at a time and is served "
                         "by one controller process. Serve it with --workers 1 (the default), or keep the state in "
                         "Postgres (--db postgresql://USER@HOST:PORT/DB) to serve the API from several processes")


def reserve_port(host: str, port: int) -> socket.socket:
    """Hold ``host:port`` for the workers for as long as the parent lives: a socket bound with SO_REUSEPORT that
    does not listen (so it is given no connection). The port is first bound without SO_REUSEPORT, so one that
    anything else holds, another runner's workers included, is refused as in use (and port 0 picks a free one)."""
    with bind(host, port, listen=False) as probe:
        port = probe.getsockname()[1]
    return bind(host, port, reuse_port=True, listen=False)


def settings_payload(settings: ServerSettings, worker: int) -> bytes:
    """What a worker is told on its stdin (not its command line, which `ps` shows: the database URL may hold a
    password)."""
    fields = dataclasses.asdict(dataclasses.replace(settings, worker=worker))
    return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in fields.items()}).encode()


def read_settings(stream: IO[bytes]) -> ServerSettings:
    """A worker's settings, as its supervisor wrote them on its stdin."""
    fields = json.loads(stream.read())
    for name in ("data_dir", "config_home"):
        if fields.get(name) is not None:
            fields[name] = Path(fields[name])
    return ServerSettings(**fields)


def serve_workers(settings: ServerSettings, count: int, worker_argv: list[str]) -> int:
    """Serve the API from ``count`` processes of ``worker_argv`` (each reads its settings with
    :func:`read_settings` and runs the controller) until SIGTERM or SIGINT; the exit code: 0, or that of a
    worker that could not start."""
    check_workers(count, settings.db_url)
    data_dir = settings.data_dir.resolve()
    make_data_dir_private(data_dir)
    load_config(settings.config_home or data_dir)  # a bad config.yaml: one error (exit 2), not one per worker
    db_url = settings.db_url or f"sqlite:///{data_dir / 'runner.db'}"
    open_database(db_url).close()  # unreachable: exit 3 once; the schema is migrated once, before the workers start
    reservation = reserve_port(settings.host, settings.port)
    url = serving_url(reservation)
    worker_settings = dataclasses.replace(settings, data_dir=data_dir, port=reservation.getsockname()[1])
    manager = sdnotify.default()  # systemd's watchdog is ours to ping; its NOTIFY_SOCKET leaves os.environ
    env = {name: value for name, value in os.environ.items() if name not in sdnotify.VARIABLES}

    def ready(pids: list[int]) -> None:
        _write_controller_file(data_dir, url, workers=count)
        sdnotify.ready()
        sdnotify.status(f"{count} workers serving {url}")
        log.info("controller serving", url=url, data_dir=str(data_dir), db=redact(db_url), pid=os.getpid(),
                 workers=count, worker_pids=pids)

    supervisor = Supervisor(worker_argv, count, lambda n: settings_payload(worker_settings, n), env, on_ready=ready,
                            watchdog_seconds=watchdog_seconds(manager), on_turn=sdnotify.LoopPings(manager).tick)
    try:
        return supervisor.run()
    finally:
        reservation.close()
        if (_read_controller_file(data_dir) or {}).get("pid") == os.getpid():
            (data_dir / CONTROLLER_FILE).unlink(missing_ok=True)
        log.info("controller stopped", workers=count)
