"""The ledger on a real controller: its node's boot, the setup and step reports of its agent, the restart log's
start phases, and the goodput that ``runner status`` shows."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
import requests

from conftest import controller_with_a_sleeping_job
from runner.protocol.events import EventKind


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_controller_db):
    """One controller with one running job that never trains: the tests post its agent's reports themselves."""
    with controller_with_a_sleeping_job(tmp_path_factory.mktemp("ledger"), module_controller_db) as server:
        yield server


def post(server, kind: str, data: dict) -> requests.Response:
    return requests.post(server.controller.url + "/v1/agent/events", headers=server.node_headers, timeout=10,
                         json={"kind": kind, "data": data})


def _row(server) -> dict:
    return server.runner.json("restarts", server.job_id)[-1]


def test_the_nodes_boot_and_its_agents_setup_report_are_on_the_first_row(server):
    """The real agent registered (its boot: launch to registration) and said it ran no setup (0 s)."""
    deadline = time.monotonic() + 60
    while _row(server)["setup_seconds"] is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the agent's setup report is on its way
    row = _row(server)
    assert row["boot_seconds"] is not None and row["boot_seconds"] >= 0
    assert row["setup_seconds"] == 0.0
    assert row["gap_seconds"] is None  # the first attempt
    started = time.time() - 20
    assert post(server, EventKind.SETUP, {"started_at": started, "ended_at": None}).status_code == 200
    assert _row(server)["setup_seconds"] == 0.0  # a setup under way counts once it has ended
    assert post(server, EventKind.SETUP, {"started_at": started, "ended_at": started + 12.5,
                                            "exit_code": 0}).status_code == 200
    assert _row(server)["setup_seconds"] == 12.5


def test_step_times_and_restore_become_training_time_in_the_goodput(server):
    """40 steps over the last 2 s of a node up for longer: 2 training seconds, of the node's paid time."""
    launched = datetime.fromisoformat(_row(server)["started_at"].replace("Z", "+00:00")).timestamp()
    deadline = time.monotonic() + 60
    while time.time() < launched + 4 and time.monotonic() < deadline:
        time.sleep(0.2)  # the training reported below happened while the node was up
    now = time.time()
    report = {"steps": 40, "first_step": 1, "first_step_at": now - 2.5, "last_step": 41,
              "last_step_at": now - 0.5, "restore_seconds": 0.75}
    assert post(server, EventKind.TELEMETRY, report).status_code == 200
    assert _row(server)["restore_seconds"] == 0.75
    goodput = server.runner.json("status", server.job_id)["goodput"]
    assert goodput["training_seconds"] == 2.0 and goodput["redone_seconds"] == 0.0
    assert goodput["paid_seconds"] >= goodput["training_seconds"] + goodput["redone_seconds"]
    assert goodput["ratio"] == pytest.approx(goodput["training_seconds"] / goodput["paid_seconds"], abs=1e-3)
    assert "goodput:" in server.runner("status", server.job_id).stdout


@pytest.mark.parametrize("data, field", [
    ({"first_step": 3}, "data.first_step and data.first_step_at"),
    ({"last_step_at": 1.0e9}, "data.last_step and data.last_step_at"),
    ({"first_step": -1, "first_step_at": 1.0e9}, "data.first_step"),
    ({"last_step": 1, "last_step_at": "yesterday"}, "data.last_step_at"),
    ({"restore_seconds": -2}, "data.restore_seconds"),
])
def test_a_step_without_its_time_or_a_bad_value_is_422_naming_it(server, data, field):
    """Bad ledger fields are refused naming the field, and what was stored stays."""
    assert post(server, EventKind.TELEMETRY, {"restore_seconds": 0.75}).status_code == 200
    answer = post(server, EventKind.TELEMETRY, {**data, "restore_seconds": 9.0} if "restore_seconds" not in data
                  else data)
    assert answer.status_code == 422 and field in answer.text
    assert _row(server)["restore_seconds"] == 0.75


@pytest.mark.parametrize("data, field", [
    ({}, "data.started_at"), ({"started_at": "noon"}, "data.started_at"),
    ({"started_at": 1.0e9, "ended_at": -1}, "data.ended_at"),
    ({"started_at": 1.0e9, "ended_at": 0.9e9}, "data.ended_at"),
])
def test_a_setup_report_without_its_times_is_422_naming_the_field(server, data, field):
    answer = post(server, EventKind.SETUP, data)
    assert answer.status_code == 422 and field in answer.text
