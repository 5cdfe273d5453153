"""The agent's setup reports on a real controller: typed, checked, stored on the calling node's row."""

from __future__ import annotations

import pytest
import requests

from conftest import controller_store_url, controller_with_a_sleeping_job
from runner import wire
from runner.protocol.events import EventKind
from runner.state import Store, open_database


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_controller_db):
    with controller_with_a_sleeping_job(tmp_path_factory.mktemp("setup"), module_controller_db) as server:
        store = Store(open_database(controller_store_url(server.home, module_controller_db)))
        server.node_id = server.runner.json("status", server.job_id)["current_attempt"]["node"]
        server.store = store
        yield server
        store.db.close()


def post(server, data: dict) -> requests.Response:
    return requests.post(server.controller.url + "/v1/agent/events", headers=server.node_headers, timeout=10,
                         json={"kind": EventKind.SETUP, "data": data})


@pytest.mark.parametrize("data, field", [({}, "data.started_at"), ({"started_at": "soon"}, "data.started_at"),
                                         ({"started_at": 100.0, "ended_at": 50.0}, "data.ended_at"),
                                         ({"started_at": 100.0, "exit_code": "0"}, "data.exit_code")])
def test_a_malformed_setup_report_is_refused_naming_the_field(server, data, field):
    answer = post(server, data)
    assert answer.status_code == 422 and field in answer.text


def test_the_start_then_the_end_of_setup_are_stored_on_the_node(server):
    """The start report leaves the end null (setup still running); the end report completes it."""
    node = server.store.node(server.node_id)
    assert node.launched_at is not None and node.first_registered_at is not None
    assert node.launched_at <= node.first_registered_at
    assert post(server, wire.SetupReport(1_800_000_000.0).to_json()).json() == {"accepted": True}
    node = server.store.node(server.node_id)
    assert (node.setup_started_at, node.setup_ended_at, node.setup_seconds) == (1_800_000_000.0, None, None)
    assert post(server, wire.SetupReport(1_800_000_000.0, 1_800_000_042.5, 0).to_json()).status_code == 200
    node = server.store.node(server.node_id)
    assert (node.setup_ended_at, node.setup_seconds) == (1_800_000_042.5, 42.5)
