"""The controller as `runner server` runs it: the API (runner.controller) with the web page (runner.web).

The composition root of the controller's side: the web page sits above the controller (it reads through the
API's handlers), so the controller never imports it; this module, above both, puts them together.
"""

from __future__ import annotations

from .controller.app import ControllerState, create_app
from .controller.daemon import ServerSettings
from .controller.daemon import serve as serve_api
from .web import routes as web


def create_server_app(state: ControllerState):
    """The API and the web page (/, /jobs/JOB, sign-in) over one controller state."""
    return create_app(state, routers=(web.router,))


def serve(settings: ServerSettings, providers: dict | None = None) -> None:
    """``runner server``: the controller daemon with its web page."""
    serve_api(settings, providers, app_factory=create_server_app)
