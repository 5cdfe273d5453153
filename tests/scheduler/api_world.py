"""Fixtures the scheduler's API tests share: a world whose node tokens the agent API accepts, and the real
controller app over it. A test module imports them (``from api_world import api, world``; a conftest.py here would
shadow tests/conftest.py for the modules that import names from it); one that needs another world (another
provider, a clock) defines its own ``world``, and ``api`` then serves that one."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from runner.controller.app import ControllerState, create_app
from runner.controller.logstore import LogStore

from scheduler_world import ADMIN, agent_api_world


@pytest.fixture
def world(db_url):
    return agent_api_world(db_url)


@pytest.fixture
def api(world, tmp_path):
    """A client of the controller's app over ``world`` (its state as ``client.controller``)."""
    state = ControllerState(world.store, ADMIN, tmp_path, LogStore(tmp_path / "logs"), world.ctx)
    with TestClient(create_app(state)) as client:
        client.controller = state
        yield client
