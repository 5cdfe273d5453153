"""The controller's HTTP application: routers for the CLI and for agents over shared state."""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import structlog
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..scheduler.reconciler import SchedulerContext
from ..state import DatabaseUnreachable, Store
from ..state.logs import DatabaseLogStore
from .agent_wheel import AgentWheel
from .auth import principal
from .group_commit import GroupCommit
from .heartbeat_reads import heartbeat_reads
from .heartbeats import HeartbeatBook
from .logstore import LogStore
from .workdirs import FileWorkdirs

log = structlog.get_logger(__name__)

LOG_LANES = 4  # log-chunk transactions at once on a shared database (runner/controller/group_commit.py)


@dataclass
class ControllerState:
    store: Store
    admin_token: str
    data_dir: Path
    logs: LogStore
    scheduler: SchedulerContext
    heartbeats: HeartbeatBook | None = None  # set by create_app: heartbeats written once a second, together
    heartbeat_reads: object | None = None  # set by create_app: the heartbeat's reads (heartbeat_reads.py)
    report_commits: GroupCommit | None = None  # set by create_app on a shared database: reports committed in groups
    log_commits: tuple[GroupCommit, ...] = ()  # set by create_app where output is kept in the database: lanes
    is_leader: Callable[[], bool] = lambda: True  # runs the scheduler and reconciler (runner/controller/leadership.py)

    workdir_archives: object | None = None  # where uploaded workdirs are kept (default: files in the data dir)
    agent_wheel_cache: AgentWheel | None = None

    @property
    def workdirs(self):
        """Uploaded workdir archives: ``has``, ``put`` and ``stream`` by sha256 (runner/controller/workdirs.py,
        or in the database when controllers share one: runner/state/workdirs.py)."""
        if self.workdir_archives is None:
            self.workdir_archives = FileWorkdirs(self.data_dir / "workdirs")
        return self.workdir_archives

    @property
    def agent_wheel(self) -> AgentWheel:
        """The wheel this controller's cloud nodes install the runner from (built on first use)."""
        if self.agent_wheel_cache is None:
            self.agent_wheel_cache = AgentWheel(self.data_dir / "agent-wheel")
        return self.agent_wheel_cache


def create_app(state: ControllerState, routers: tuple = ()):
    """The controller's API; ``routers``: more routes served beside it (the web page, mounted by the
    composition root, runner/server.py, since the web page sits above the controller)."""
    from . import agent_api, api, event_api, heartbeat_api, log_api, metrics
    from .front_door import FrontDoor

    state.heartbeats = state.heartbeats or HeartbeatBook(state.store)
    state.heartbeat_reads = state.heartbeat_reads or heartbeat_reads(state.store)
    if state.report_commits is None and state.store.db.shared:  # a commit is a round trip there (SQLite: local)
        state.report_commits = GroupCommit(state.store.db.transaction, "report-commits",
                                           write_group=functools.partial(event_api.record_reports, state))
    if not state.log_commits and isinstance(state.logs, DatabaseLogStore):  # output in the database, not in files
        # Chunks are not serialized writes: several lanes, each a group commit, write at once (a node's chunks
        # always take the same lane).
        state.log_commits = tuple(GroupCommit(lambda: state.store.db.transaction(serialized=False), f"log-commits-{n}",
                                              write_group=functools.partial(log_api.store_chunks, state))
                                  for n in range(LOG_LANES))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.heartbeats.start()
        state.heartbeat_reads.start()
        try:
            yield
        finally:
            state.heartbeat_reads.stop()
            for commits in (*state.log_commits, *filter(None, [state.report_commits])):
                commits.stop()  # what is waiting is committed and answered first
            unwritten = state.heartbeats.stop()  # the last second's heartbeats are written before the server exits
            if state.store.db.unreachable:  # every write above failed at once: say what that leaves to the nodes
                log.warning("stopping while the database cannot be reached: nothing more is written here; nodes "
                            "report again to the next controller what this one did not acknowledge (their output, "
                            "events and exits; heartbeats not written are replaced by the next ones)",
                            database=state.store.db.where, heartbeats_not_written=unwritten)

    # No /openapi.json: every endpoint needs a token, and the API's description is not one to hand out.
    app = FastAPI(title="runner controller", version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.controller = state
    app.include_router(api.router)
    app.include_router(agent_api.router)
    app.include_router(metrics.router)
    for router in routers:
        app.include_router(router)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict:
        """Liveness for a load balancer, no token: this controller answers, and whether it leads."""
        return {"ok": True, "leader": bool(state.is_leader())}

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError):
        try:  # the body is read and checked before the route's token check: a caller without one learns nothing
            principal(request)
        except HTTPException as refused:
            return JSONResponse({"detail": refused.detail}, status_code=refused.status_code, headers=refused.headers)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(DatabaseUnreachable)
    async def _database_away(request: Request, exc: DatabaseUnreachable):
        """A database out of reach is a 503 that says so (the caller tries again), not a bare 500 and a traceback."""
        log.warning("request not answered: the database cannot be reached", path=request.url.path, error=str(exc))
        return JSONResponse({"detail": str(exc)}, status_code=503)

    # What every node sends all the time is answered in front of the framework (front_door.py).
    return FrontDoor(app, state, {heartbeat_api.HEARTBEAT_PATH: heartbeat_api.ROUTE, log_api.LOGS_PATH: log_api.ROUTE,
                                  event_api.EVENTS_PATH: event_api.ROUTE})
