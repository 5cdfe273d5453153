"""The agent's telemetry reports on a real controller: stored per attempt, shown by status, jobs and restarts."""

from __future__ import annotations

import math
import re

import pytest
import requests

from conftest import controller_with_a_sleeping_job
from runner.protocol.events import EventKind

HF_TOKEN = "hf-secret-value"  # the job's env: a secret, which its training process may get in its argv

@pytest.fixture(scope="module")
def server(tmp_path_factory, module_controller_db):
    """One controller with one running job that never trains: the tests post its agent's reports themselves."""
    with controller_with_a_sleeping_job(tmp_path_factory.mktemp("telemetry"), module_controller_db,
                                        env={"HF_TOKEN": HF_TOKEN}) as server:
        yield server


def post(server, kind: str, data: dict) -> requests.Response:
    return requests.post(server.controller.url + "/v1/agent/events", headers=server.node_headers, timeout=10,
                         json={"kind": kind, "data": data})


def test_before_any_report_the_figures_are_null(server):
    """A job that has reported nothing: steps/s, $/1000 steps and manifest null; the restart row's fields null."""
    job = server.runner.json("status", server.job_id)
    assert (job["steps_per_second"], job["cost_per_1000_steps"], job["manifest"]) == (None, None, None)
    row = server.runner.json("restarts", server.job_id)[-1]
    assert (row["steps"], row["peak_memory_gb"], row["nan_steps"]) == (None, None, None)


def test_a_report_is_stored_on_the_attempt_and_the_peak_keeps_the_largest(server):
    """steps, steps/s and NaN steps are the newest report's; peak memory the largest (in GB of 10^9 bytes)."""
    assert post(server, EventKind.TELEMETRY, {"steps": 40, "steps_per_second": 12.5, "nan_steps": 2,
                                                "peak_memory_bytes": 3_000_000_000}).status_code == 200
    assert post(server, EventKind.TELEMETRY, {"steps": 80, "steps_per_second": 10.0, "nan_steps": 3,
                                                "peak_memory_bytes": 1_000_000_000}).status_code == 200
    assert post(server, EventKind.TELEMETRY, {"peak_memory_bytes": 2_500_000_000}).status_code == 200  # node 1
    row = server.runner.json("restarts", server.job_id)[-1]
    assert (row["steps"], row["peak_memory_gb"], row["nan_steps"]) == (80, 3.0, 3)
    job = server.runner.json("status", server.job_id)
    assert job["steps_per_second"] == 10.0
    assert job["cost_per_1000_steps"] is None  # nothing committed: no step kept yet
    listed = next(j for j in server.runner.json("jobs") if j["id"] == server.job_id)
    assert listed["steps_per_second"] == 10.0 and "cost_per_1000_steps" in listed


def test_cost_per_1000_steps_is_the_cost_over_the_committed_step(server):
    """Once step 80 is committed durably, $/1000 steps is cost_usd / 80 * 1000."""
    assert post(server, "checkpoint", {"step": 80, "durable": True, "seconds": 0.1,
                                       "manifest": "file:///x/step-00000080/manifest.json"}).status_code == 200
    job = server.runner.json("status", server.job_id)
    assert job["step"] == 80 and job["cost_usd"] > 0
    # both are shown to the micro-dollar: a job this short costs a few of them, so allow that rounding
    assert math.isclose(job["cost_per_1000_steps"], job["cost_usd"] / 80 * 1000, rel_tol=1e-3, abs_tol=1e-6)


def test_the_first_manifest_of_an_attempt_is_kept_with_only_the_contract_keys(server):
    """The manifest shows in status; a second one for the attempt is ignored; other keys are dropped; the job's
    env values in its argv (`run: python train.py --hf-token $HF_TOKEN`) show as ***."""
    argv = ["train.py", "--steps", "80", "--hf-token", HF_TOKEN, f"--token={HF_TOKEN}"]
    manifest = {"git_commit": "a" * 40, "git_dirty": False, "python": "3.11.7", "torch": "2.5.1", "cuda": None,
                "gpus": [], "packages_sha256": "b" * 64, "argv": argv, "environment": {"HF_TOKEN": HF_TOKEN}}
    assert post(server, EventKind.MANIFEST, {"manifest": manifest}).json() == {"accepted": True}
    assert post(server, EventKind.MANIFEST, {"manifest": {**manifest, "python": "2.7"}}).json() == {
        "accepted": False}
    shown = server.runner.json("status", server.job_id)["manifest"]
    hidden = ["train.py", "--steps", "80", "--hf-token", "***", "--token=***"]
    assert shown == {**{k: v for k, v in manifest.items() if k != "environment"}, "argv": hidden}
    table = server.runner("status", server.job_id).stdout
    assert "commit aaaaaaaaaaaa, python 3.11.7, torch 2.5.1" in table and HF_TOKEN not in table


@pytest.mark.parametrize("data, field", [
    ({"steps": "abc"}, "data.steps"), ({"nan_steps": -1}, "data.nan_steps"),
    ({"peak_memory_bytes": 2**70}, "data.peak_memory_bytes"), ({"steps_per_second": -3}, "data.steps_per_second"),
    ({"steps_per_second": "fast"}, "data.steps_per_second"),
])
def test_a_report_with_a_value_of_the_wrong_kind_is_422_naming_it(server, data, field):
    """Bad telemetry is refused naming the field, and what was stored stays."""
    def stored() -> tuple:  # what `runner restarts`/`status --json` print, read in this process (tests/conftest.py)
        row = server.runner.restarts(server.job_id)[-1]
        return row["steps"], row["peak_memory_gb"], row["nan_steps"], server.runner.job(
            server.job_id)["steps_per_second"]

    before = stored()
    response = post(server, EventKind.TELEMETRY, data)
    assert response.status_code == 422 and field in response.json()["detail"]
    assert stored() == before


def test_a_manifest_that_is_not_an_object_is_422(server):
    response = post(server, EventKind.MANIFEST, {"manifest": "a string"})
    assert response.status_code == 422 and "data.manifest" in response.json()["detail"]


def test_the_tables_show_the_figures(server):
    """`runner jobs`, `runner status` and `runner restarts --wide` tables carry steps/s, $/1000 steps and the row's."""
    # Its own committed step (the same report as above, taken once): under xdist this test may get a fresh controller.
    assert post(server, "checkpoint", {"step": 80, "durable": True, "seconds": 0.1,
                                       "manifest": "file:///x/step-00000080/manifest.json"}).status_code == 200
    assert post(server, EventKind.TELEMETRY, {"steps_per_second": 10.0, "peak_memory_bytes": 3_000_000_000,
                                                "nan_steps": 3}).status_code == 200
    jobs = server.runner("jobs").stdout
    assert "STEPS/S" in jobs and "$/1K STEPS" in jobs
    status = server.runner("status", server.job_id).stdout
    assert re.search(r"^steps/s: +10$", status, re.M) and re.search(r"^\$/1k steps: +\$", status, re.M)
    restarts = server.runner("restarts", server.job_id, "--wide").stdout.splitlines()  # every column
    header, row = restarts[0].split(), restarts[-1]
    assert header[-3:] == ["PEAK", "MEM", "NAN"] and "3.00 GB" in row


def test_a_late_report_never_takes_the_steps_back(server):
    """Reports retried through an outage may land late: the attempt keeps the furthest steps (and NaN steps),
    and the steps/s of the report that got that far, not those of an older report arriving after it."""
    assert post(server, EventKind.TELEMETRY, {"steps": 500_000, "steps_per_second": 9.0,
                                                "nan_steps": 7}).status_code == 200
    assert post(server, EventKind.TELEMETRY, {"steps": 70, "steps_per_second": 20.0,
                                                "nan_steps": 1}).status_code == 200
    row = server.runner.json("restarts", server.job_id)[-1]
    assert (row["steps"], row["nan_steps"]) == (500_000, 7)
    assert server.runner.json("status", server.job_id)["steps_per_second"] == 9.0
