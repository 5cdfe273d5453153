"""A job's spec, a node's offer and an attempt's notice come out of the store typed, from the same JSON every
version has written, and a row written by an older (or newer) version still loads."""

from __future__ import annotations

import json
import time

import pytest

from runner import wire
from runner.spec import validate_job
from runner.spec.stored import stored_job
from runner.state import Store, open_database
from runner.state.values import Notice, Offer

OFFER = Offer("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "T4", 1, 4, 16.0, 0.2, 0.526)

# A job as the first release stored it: its job file had no resources.num_nodes, no recovery.deadline,
# total_steps, prepare_on or standby_timeout, and accelerators was one NAME:COUNT.
FIRST_RELEASE_SPEC = {
    "name": "old-job", "workdir": "/home/me/old-job", "setup": "pip install -r requirements.txt",
    "run": "python train.py", "env": {"SEED": "1"},
    "resources": {"cloud": ["local"], "accelerators": "T4:1", "cpus": None, "memory_gb": None, "regions": None,
                  "spot_policy": "spot", "max_price_per_hour": None},
    "checkpoint": {"local_dir": None, "durable_url": None, "interval": "auto", "keep": 3},
    "recovery": {"max_preemptions": 5, "max_failures": 2, "resume_drill": "off"},
    "workdir_digest": "ab" * 32,
}


@pytest.fixture
def store(db_url) -> Store:
    return Store(open_database(db_url))


def _raw_job(store: Store, job_id: str, spec: dict) -> None:
    """A jobs row written as another version wrote it, not through this version's insert_job."""
    with store.db.transaction() as tx:
        tx.execute("INSERT INTO jobs (id, name, spec, state, created_at, updated_at) VALUES (?,?,?,?,?,?)",
                   (job_id, spec["name"], json.dumps(spec), "RUNNING", 1000.0, 1000.0))


def test_a_spec_stored_by_the_first_release_loads_with_the_defaults_of_what_it_lacks(store):
    _raw_job(store, "old-job-1", FIRST_RELEASE_SPEC)
    job = store.job("old-job-1")
    assert job.spec.run == "python train.py" and job.spec.env == {"SEED": "1"}
    assert job.spec.workdir_digest == "ab" * 32
    assert job.spec.resources.accelerator() == ("T4", 1) and job.num_nodes == 1
    assert job.spec.recovery.max_preemptions == 5 and job.spec.recovery.resume_drill_seconds() is None
    assert job.spec.recovery.prepare_on == ["notice"] and job.spec.recovery.deadline is None


def test_a_key_a_newer_version_stored_is_set_aside_not_refused(store):
    newer = {**FIRST_RELEASE_SPEC, "priority": 3,
             "resources": {**FIRST_RELEASE_SPEC["resources"], "num_nodes": 2, "some_later_key": 1}}
    _raw_job(store, "new-job-1", newer)
    job = store.job("new-job-1")
    assert job.num_nodes == 2 and job.spec.name == "old-job"


def test_a_durable_url_whose_filesystem_this_controller_lacks_still_loads(store):
    """Another controller of the team (or this one before an upgrade) had the filesystem installed."""
    spec = {**FIRST_RELEASE_SPEC, "checkpoint": {**FIRST_RELEASE_SPEC["checkpoint"],
                                                 "durable_url": "nosuchfs://team-bucket/ckpt"}}
    _raw_job(store, "elsewhere-1", spec)
    assert store.job("elsewhere-1").spec.checkpoint.durable_url == "nosuchfs://team-bucket/ckpt"


def test_the_spec_column_holds_the_same_json_as_before(store):
    """What a submit stores: the validated job file's every key, then workdir_digest (no migration)."""
    spec = validate_job({"name": "same", "run": "true", "resources": {"accelerators": ["A100:1", "T4:1"]}})
    with store.db.transaction() as tx:
        store.insert_job(tx, "same-1", "same", stored_job(spec, "cd" * 32), "PENDING", time.time())
    text = store.db.query("SELECT spec FROM jobs WHERE id = ?", ("same-1",))[0]["spec"]
    assert text == json.dumps({**spec.model_dump(), "workdir_digest": "cd" * 32})
    assert store.job("same-1").spec.resources.accelerator_options() == [("A100", 1), ("T4", 1)]


def test_offer_and_notice_come_back_typed_and_the_restart_log_shows_the_notice_as_reported(store):
    reported = {"source": "gcp", "kind": "termination", "action": "stop", "received_at": "2026-11-23T10:00:00Z",
                "deadline": None, "terminal": True, "id": "gcp:preempted", "extra_field": {"kept": "as is"}}
    with store.db.transaction() as tx:
        store.insert_job(tx, "j-1", "j", stored_job(validate_job({"name": "j", "run": "true"}), None), "RUNNING",
                         1000.0)
        store.insert_node(tx, "n-1", "j-1", 1, "aws", "hash", OFFER, True, 1000.0)
        attempt = store.insert_attempt(tx, "j-1", "n-1", OFFER, True, 0, 1000.0)
        store.set_attempt_notice(tx, "j-1", attempt, Notice.from_json(reported))
    node, current = store.node("n-1"), store.current_attempt("j-1")
    assert node.offer == OFFER and node.offer.price(True) == 0.2
    assert current.notice.source == "gcp" and current.notice.deadline is None and current.notice.node_rank is None
    assert current.price_per_hour == 0.2 and current.zone == "us-east-1a"
    assert wire.restart_row(current)["notice"] == reported  # every key as the agent reported it, none added
