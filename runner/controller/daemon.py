"""``runner server``: one controller per data dir, serving the API and running the reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
import uvicorn

from .. import sdnotify
from ..home import ADMIN_TOKEN_FILE, ConfigError, CONTROLLER_FILE, LAST_PORT_FILE, LOCK_FILE, NODE_SECRET_FILE, load_config, scheduler_settings
from ..private import make_data_dir_private
from ..providers.local import LocalProvider
from ..providers.local.provider import DEFAULT_ZONE_CAPACITY
from ..providers.local.processes import process_start_ticks
from ..scheduler.reconciler import Reconciler, SchedulerContext, threaded_calls
from ..state import DatabaseError, Store, open_database, redact
from ..state.leader import Leadership
from ..state.logs import DatabaseLogStore
from ..state.migrations import apply_migrations, schema_version
from ..state.workdirs import DatabaseWorkdirs
from ..state.secrets import ADMIN_TOKEN, NODE_SECRET, shared_secret
from .app import ControllerState, create_app
from .auth import hash_token, node_token, write_secret
from .discovery import ControllerDirectory
from .leadership import LeaderLoop, SharedNudge
from .logstore import LogStore
from ..errors import RunnerError

log = structlog.get_logger(__name__)


class ServerError(RunnerError):
    """The controller cannot start; the message says why and what to do."""


__all__ = ["DatabaseError", "ServerError", "ServerSettings", "migrate", "serve", "stop_running"]


@dataclass
class ServerSettings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8470
    db_url: str | None = None
    config_home: Path | None = None
    advertise_url: str | None = None  # the URL nodes use to reach this controller
    # One of the processes of `runner server --workers N` (runner/controller/workers.py), numbered from 0: it
    # listens with SO_REUSEPORT beside the others, and the controller file is its supervisor's to write.
    worker: int | None = None


def acquire_lock(data_dir: Path):
    """Hold the data dir's lock for the life of the process: a second controller is refused."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        running = _read_controller_file(data_dir)
        where = f" at {running['url']} (pid {running['pid']})" if running else ""
        raise ServerError(f"another controller is already serving {data_dir}{where}; "
                          "stop it with `runner server stop` or use another --data-dir") from None
    return handle


def bind(host: str, port: int, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` (a refused port is a ServerError saying so). ``reuse_port``: other
    sockets of this user with it may bind the same port, and the kernel spreads new connections among those
    that listen (the workers of `runner server --workers N`)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServerError(f"port {port} on {host} is already in use; pick another with --port "
                              "(or stop the process using it)") from None
        raise ServerError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    if listen:
        sock.listen(128)
    return sock


def serving_url(sock: socket.socket) -> str:
    """The URL a bound socket serves at (a wildcard host as loopback: what this machine's CLI reaches)."""
    host, port = sock.getsockname()[:2]
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"


def build_providers(data_dir: Path, config: dict) -> dict:
    """One provider per cloud listed in config.yaml (just the local market when none is)."""
    clouds = config.get("clouds") or {"local": {}}
    providers = {}
    if "local" in clouds:
        local = clouds["local"] or {}
        try:
            providers["local"] = LocalProvider(data_dir, zones=local.get("zones"),
                                               time_scale=local.get("time_scale", 1.0),
                                               no_capacity=local.get("no_capacity"),
                                               zone_capacity=local.get("zone_capacity", DEFAULT_ZONE_CAPACITY),
                                               boot_seconds=local.get("boot_seconds", 0),
                                               durable_mb_per_s=local.get("durable_mb_per_s"))
        except ValueError as exc:  # a bad value: bad input (exit 2), naming the key
            raise ConfigError(f"config.yaml: {exc}") from None
    if "aws" in clouds:
        try:
            from ..providers.aws import AWSProvider
        except ImportError as exc:
            raise ServerError(f"clouds.aws is configured but boto3 is missing ({exc}); pip install 'spot-runner[aws]'")
        providers["aws"] = AWSProvider(clouds["aws"] or {})
    if "gcp" in clouds:
        try:
            from ..providers.gcp import GCPProvider
        except ImportError as exc:
            raise ServerError(f"clouds.gcp is configured but google-cloud-compute is missing ({exc}); "
                              "pip install 'spot-runner[gcp]'")
        providers["gcp"] = GCPProvider(clouds["gcp"] or {})
    unknown = set(clouds) - {"local", "aws", "gcp"}
    if unknown:
        raise ServerError(f"config.yaml: clouds.{sorted(unknown)[0]} is not a cloud runner knows (local, aws, gcp)")
    return providers


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after shutting down, which would skip our cleanup: handle it ourselves."""

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    _pings: asyncio.Task | None = None

    async def startup(self, sockets=None):
        await super().startup(sockets=sockets)
        if self.started:
            sdnotify.ready()  # the socket is accepting: systemd's Type=notify may order dependents now
            # From the event loop, not a thread: a stuck loop stops the pings, and systemd (or the supervisor of
            # `--workers N`) kills and restarts this process, which answers nothing while its loop is stuck.
            self._pings = asyncio.create_task(sdnotify.default().ping_from_event_loop())

    async def shutdown(self, sockets=None):
        sdnotify.stopping()
        await super().shutdown(sockets=sockets)
        if self._pings is not None:
            self._pings.cancel()


def serve(settings: ServerSettings, providers: dict | None = None, app_factory=create_app) -> None:
    """Run until SIGTERM or SIGINT; leave the database consistent and nodes running.

    ``providers``: the clouds to launch on, by name (default: config.yaml's; the scale benchmark passes
    the in-memory provider, whose nodes it plays itself). ``app_factory``: the ASGI app for the state (default:
    the API alone; runner/server.py adds the web page)."""
    data_dir = settings.data_dir.resolve()
    make_data_dir_private(data_dir)  # jobs' env values, output and workdirs are kept here
    db_url = settings.db_url or f"sqlite:///{data_dir / 'runner.db'}"
    shared = db_url.startswith(("postgres://", "postgresql://"))
    # Controllers sharing a Postgres database may share a data dir too; a SQLite one has it to itself.
    lock = None if shared else acquire_lock(data_dir)
    # A worker's socket listens only once uvicorn serves it (asyncio's create_server calls listen): until then the
    # kernel gives new connections to the workers already serving, not to one still opening its database.
    worker = settings.worker is not None
    sock = bind(settings.host, settings.port, reuse_port=worker, listen=not worker)
    url = serving_url(sock)
    config = load_config(settings.config_home or data_dir)
    node_url = settings.advertise_url or config.get("server") or url
    db = open_database(db_url)
    store = Store(db)
    admin_token = shared_secret(db, ADMIN_TOKEN, adopt=_read_secret(data_dir / ADMIN_TOKEN_FILE))
    write_secret(data_dir / ADMIN_TOKEN_FILE, admin_token)
    node_secret = shared_secret(db, NODE_SECRET, adopt=_read_secret(data_dir / NODE_SECRET_FILE))
    if providers is None:
        providers = build_providers(data_dir, config)
    directory = ControllerDirectory(db, node_url)  # nodes learn every live controller of the database
    # On a shared database work recorded here while another controller leads wakes that one's reconciler too
    nudge = SharedNudge(db, lambda: leader.leading) if shared else threading.Event()
    scheduler = SchedulerContext(store=store, providers=providers, controller_url=node_url, nudge=nudge,
                                 controller_urls=directory.node_urls,
                                 node_token=lambda node_id: node_token(node_secret, node_id),
                                 token_hasher=hash_token, **threaded_calls(),
                                 **scheduler_settings(config))
    leader = LeaderLoop(Leadership(db), lambda: Reconciler(scheduler), on_wake=nudge.set)
    state = ControllerState(store=store, admin_token=admin_token, data_dir=data_dir,
                            logs=DatabaseLogStore(db) if shared else LogStore(data_dir / "logs"), scheduler=scheduler,
                            is_leader=lambda: leader.leading,
                            workdir_archives=DatabaseWorkdirs(db) if shared else None)
    server = _Server(uvicorn.Config(app_factory(state), log_config=None, access_log=False,
                                           timeout_graceful_shutdown=5))
    if settings.worker is None:  # a worker's supervisor writes it, with its own pid (`runner server stop` stops it)
        _write_controller_file(data_dir, url)
    sdnotify.default()  # takes NOTIFY_SOCKET out of the environment nodes inherit (the loop pings: _Server.startup)
    directory.start()
    leader.start()
    log.info("controller serving", url=url, data_dir=str(data_dir), db=redact(db_url), pid=os.getpid(),
             leader=leader.leading, worker=settings.worker)
    try:
        server.run(sockets=[sock])
    finally:
        leader.stop()
        directory.stop()
        if (_read_controller_file(data_dir) or {}).get("pid") == os.getpid():  # a shared data dir: only our own
            (data_dir / CONTROLLER_FILE).unlink(missing_ok=True)
        db.close()
        if lock is not None:
            lock.close()
        log.info("controller stopped")


def migrate(db_url: str) -> str:
    """``runner server migrate``: bring the database's schema up to date without serving; say what was done.
    Raises DatabaseError (its ``exit_code``: 3 unreachable, 1 otherwise)."""
    db = open_database(db_url, migrate=False)  # refuses a schema newer than this runner's
    try:
        applied = apply_migrations(db)
        version = schema_version(db)
    finally:
        db.close()
    done = f"applied {', '.join(map(str, applied))}" if applied else "nothing to apply"
    return f"{redact(db_url)}: schema at version {version} ({done})"


def _read_secret(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _write_controller_file(data_dir: Path, url: str, **more) -> None:
    (data_dir / LAST_PORT_FILE).write_text(url.rsplit(":", 1)[1])
    tmp = data_dir / (CONTROLLER_FILE + ".tmp")
    # "started" tells this process from a later one that happens to get the same pid.
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "started": process_start_ticks(os.getpid()), **more}))
    tmp.replace(data_dir / CONTROLLER_FILE)


def _read_controller_file(data_dir: Path) -> dict | None:
    try:
        return json.loads((data_dir / CONTROLLER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _still_serving(data_dir: Path, running: dict) -> bool:
    """Is the recorded pid still the controller that wrote the file, not a later process given its pid?"""
    started = process_start_ticks(int(running["pid"]))
    if started is None:
        return False
    if running.get("started") is not None:
        return started == running["started"]
    try:  # a file from before "started" was recorded: a controller is serving only while the lock is held
        with open(data_dir / LOCK_FILE, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True


def stop_running(data_dir: Path, timeout: float = 15.0) -> dict | None:
    """SIGTERM the controller serving ``data_dir`` and wait for it to exit; None if none was running."""
    running = _read_controller_file(data_dir)
    if not running:
        return None
    if not _still_serving(data_dir, running):
        log.info("controller file is stale: its process is gone; nothing signalled", pid=running.get("pid"))
        (data_dir / CONTROLLER_FILE).unlink(missing_ok=True)
        return None
    try:
        os.kill(running["pid"], signal.SIGTERM)
    except ProcessLookupError:
        (data_dir / CONTROLLER_FILE).unlink(missing_ok=True)
        return None
    done = threading.Event()
    for _ in range(int(timeout * 10)):
        if process_start_ticks(running["pid"]) is None:
            done.set()
            break
        done.wait(0.1)
    if not done.is_set():
        raise ServerError(f"controller pid {running['pid']} did not stop within {timeout:.0f}s")
    return running
