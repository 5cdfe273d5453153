"""`runner jobs` at scale: by default the active jobs and those ended in the last day (at most 100), a line
saying how many are hidden and how to see them; `--state`, `--limit`, `--all`; the API takes the same filters.
The JSON keeps its fields. Through the real CLI and HTTP against a real controller on SQLite and Postgres."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from conftest import Controller, Runner, controller_store_url
from runner.controller import api
from runner.state import Store, job_changes, open_database
from stored import job_spec, offer as make_offer

OFFER = make_offer()
OLD, RECENT, RUNNING = 30, 5, 3  # ended three days ago; ended an hour ago (FAILED); running


def _write_jobs(store: Store) -> None:
    """Jobs written straight through the store, as a controller that has run for a while holds them."""
    spec = job_spec("listed", recovery={"resume_drill": "off"})
    now = time.time()
    kinds = [("old", "SUCCEEDED", now - 3 * 86400)] * OLD + [("recent", "FAILED", now - 3600)] * RECENT + \
        [("running", "RUNNING", None)] * RUNNING
    with store.db.transaction() as tx:
        for i, (kind, state, ended) in enumerate(kinds):
            job_id, created = f"{kind}-{i:03d}", (ended or now) - 7200 + i
            store.insert_job(tx, job_id, "listed", spec, "PENDING", created)
            attempt = store.insert_attempt(tx, job_id, f"n-{i}", OFFER, True, 0, created)
            if ended is None:
                job_changes.set_job_state(tx, job_id, state, created, "running", ended=False)
                continue
            job_changes.end_attempt(tx, job_id, attempt, ended, "succeeded" if state == "SUCCEEDED" else "failed",
                                    exit_code=0 if state == "SUCCEEDED" else 1, notice=None, checkpoint_step=None,
                                    lost_seconds=0.0, drill=None, message="ended")
            job_changes.set_job_state(tx, job_id, state, ended, "ended", ended=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory, module_controller_db):
    home = tmp_path_factory.mktemp("listing")
    controller = Controller(home, db_url=module_controller_db).start()
    store = Store(open_database(controller_store_url(home, module_controller_db)))
    _write_jobs(store)
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        yield SimpleNamespace(controller=controller, runner=runner, store=store)
    finally:
        controller.stop()
        store.db.close()


def ids(jobs: list[dict]) -> set[str]:
    return {job["id"] for job in jobs}


def test_by_default_the_active_and_recent_jobs_are_listed_and_the_rest_counted(site):
    result = site.runner("jobs")
    assert result.returncode == 0, result.stderr
    assert "running-" in result.stdout and "recent-" in result.stdout and "old-" not in result.stdout
    assert f"{OLD} more job(s) not shown" in result.stderr and "runner jobs --all" in result.stderr
    listed = site.runner.json("jobs")
    assert len(listed) == RECENT + RUNNING
    for field in ("id", "name", "state", "attempts", "preemptions", "step", "cost_usd"):
        assert all(field in job for job in listed), field


def test_all_state_and_limit_select_what_is_listed(site):
    assert len(site.runner.json("jobs", "--all")) == OLD + RECENT + RUNNING
    assert {j["state"] for j in site.runner.json("jobs", "--state", "failed")} == {"FAILED"}
    both = site.runner.json("jobs", "--state", "RUNNING", "--state", "SUCCEEDED")
    assert len(both) == RUNNING + OLD and {j["state"] for j in both} == {"RUNNING", "SUCCEEDED"}
    newest = site.runner.json("jobs", "--all", "--limit", "2")
    assert ids(newest) == {f"running-{OLD + RECENT + RUNNING - 2:03d}", f"running-{OLD + RECENT + RUNNING - 1:03d}"}
    limited = site.runner("jobs", "--state", "SUCCEEDED", "--limit", "4")
    assert limited.returncode == 0 and f"{OLD + RECENT + RUNNING - 4} more job(s)" in limited.stderr


def test_a_state_that_does_not_exist_is_bad_input(site):
    result = site.runner("jobs", "--state", "DONE")
    assert result.returncode == 2 and "DONE" in result.stderr
    response = requests.get(site.controller.url + "/v1/jobs", params={"state": "DONE"},
                            headers=site.controller.headers(), timeout=10)
    assert response.status_code == 422 and "state" in response.json()["detail"]


def test_the_api_takes_the_same_filters_and_says_how_many_it_left_out(site):
    response = requests.get(site.controller.url + "/v1/jobs", params={"state": ["FAILED", "RUNNING"], "limit": 3},
                            headers=site.controller.headers(), timeout=10)
    assert response.status_code == 200 and len(response.json()) == 3
    assert int(response.headers[api.HIDDEN_HEADER]) == OLD + RECENT + RUNNING - 3
    assert [j["id"] for j in response.json()] == sorted(j["id"] for j in response.json())  # oldest first


def test_a_job_id_that_is_taken_is_drawn_again(site, monkeypatch):
    """Ids carry 40 random bits, and a draw that hits an existing job draws again."""
    draws = iter(["0000000000", "0000000000", "0123456789"])
    monkeypatch.setattr(api.secrets, "token_hex", lambda n: next(draws))
    with site.store.db.transaction() as tx:
        first = api._new_job_id(site.store, tx, "dup")
        site.store.insert_job(tx, first, "dup", job_spec("dup"), "CANCELLED", time.time())
        assert first == "dup-0000000000" and api._new_job_id(site.store, tx, "dup") == "dup-0123456789"
