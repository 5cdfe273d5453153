"""The controller as `runner server` runs it: the API (runner.controller) with the web page (runner.web).

The composition root of the controller's side: the web page sits above the controller (it reads through the
API's handlers), so the controller never imports it; this module, above both, puts them together.
"""

from __future__ import annotations

import sys
from typing import IO

from .controller import workers
from .controller.app import ControllerState, create_app
from .controller.daemon import ServerSettings
from .controller.daemon import serve as serve_api
from .web import routes as web

# A worker of `runner server --workers N` is `runner server` itself, told it is one (its settings on stdin).
WORKER_COMMAND = (sys.executable, "-m", "runner.cli.main", "server", "--worker")


def create_server_app(state: ControllerState):
    """The API and the web page (/, /jobs/JOB, sign-in) over one controller state."""
    return create_app(state, routers=(web.router,))


def serve(settings: ServerSettings, providers: dict | None = None) -> None:
    """``runner server``: the controller daemon with its web page."""
    serve_api(settings, providers, app_factory=create_server_app)


def serve_workers(settings: ServerSettings, count: int) -> int:
    """``runner server --workers N``: N controller processes on one port (runner/controller/workers.py)."""
    return workers.serve_workers(settings, count, list(WORKER_COMMAND))


def worker_settings(stream: IO[bytes]) -> ServerSettings:
    """A worker's settings, from its supervisor."""
    return workers.read_settings(stream)
