"""`GET /metrics`: Prometheus text computed from the controller's database, behind the admin token."""

from __future__ import annotations

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from conftest import Controller, Runner, kill_nodes, write_job
from runner.controller.metrics import (MAX_MEASUREMENTS, StateCollector, commit_measurement, record_commits,
                                      record_notice)
from runner.scheduler.states import PROVISIONING, RECOVERING, RUNNING
from runner.scheduler.transitions import AttemptEnd, transition
from runner.state import Store, open_database
from runner.state.checkpoints import CheckpointReport
from stored import job_spec, offer as make_offer

STATES = ("PENDING", "PROVISIONING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED")
HELLO = """
name: hello
run: echo hello
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""
SLEEPER = """
name: sleeper
run: sleep 600
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""
TRAIN = """
import time
from runner.checkpoint import Checkpointer

ckpt = Checkpointer(extra={"x": 0}, interval="1h")
step = ckpt.restore()
while step < 300:
    time.sleep(0.02)
    step += 1
    if step % 10 == 0:
        print(f"step {step}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        break
ckpt.close()
"""
TRAIN_JOB = """
name: preempt-me
run: python train.py
resources: {cloud: [local]}
recovery: {max_preemptions: 3, max_failures: 0, resume_drill: "off"}
"""


def scrape(controller, token: str | None = None) -> requests.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return requests.get(controller.url + "/metrics", headers=headers, timeout=10)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape, keyed by (sample name, its labels), read by prometheus_client's own parser."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, frozenset(labels.items())))


def node_token(home, runner, job_id: str) -> str:
    node = runner.json("status", job_id)["current_attempt"]["node"]
    return next(yaml.safe_load(c.read_text())["token"] for c in home.glob("nodes/*/agent.yaml")
                if yaml.safe_load(c.read_text())["node_id"] == node)


# --- the endpoint, on a real controller -------------------------------------------------------------
def test_metrics_without_a_token_is_401(controller):
    """A scrape without a bearer token is refused with 401."""
    assert scrape(controller).status_code == 401


def test_metrics_refuses_a_node_token(tmp_path, runner, controller, home):
    """A node's token cannot read the controller's metrics."""
    job_id = runner.json("submit", str(write_job(tmp_path / "s", SLEEPER)))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", what="running")
    assert scrape(controller, node_token(home, runner, job_id)).status_code == 403


def test_metrics_with_the_admin_token_is_prometheus_text_with_every_job_state(controller):
    """The admin token gets Prometheus text that prometheus_client parses, with a jobs gauge for every state."""
    response = scrape(controller, controller.token)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert families["runner_jobs"].type == "gauge"
    assert {s.labels["state"]: s.value for s in families["runner_jobs"].samples} == dict.fromkeys(STATES, 0)


def test_a_succeeded_job_is_counted_by_state_and_its_attempt_by_cloud_zone_and_reason(tmp_path, runner, controller):
    """After a local job succeeds, jobs-by-state shows it SUCCEEDED and its attempt is counted where it ran."""
    job_id = runner.json("submit", str(write_job(tmp_path / "h", HELLO)))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", what="success")
    (row,) = runner.json("restarts", job_id)
    found = samples(scrape(controller, controller.token).text)
    assert value(found, "runner_jobs", state="SUCCEEDED") == 1
    assert value(found, "runner_jobs", state="RUNNING") == 0
    assert value(found, "runner_attempts_total", cloud="local", zone=row["zone"], end_reason="succeeded") == 1
    assert value(found, "runner_job_cost_usd_total", cloud="local", zone=row["zone"]) > 0


# --- a preemption through AWS's protocol, scraped once ----------------------------------------------------
PREEMPTION_ON_SQLITE = "a real preemption end to end; the collector over a store runs on both databases"

@pytest.fixture(scope="module")
def preempted(tmp_path_factory, module_controller_db):
    """A checkpointing job preempted once through the AWS protocol and resumed to success; its scrape and restart log."""
    home = tmp_path_factory.mktemp("metrics") / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05}}}))
    ctl = Controller(home, db_url=module_controller_db).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": ctl.url, "RUNNER_TOKEN": ctl.token})
    try:
        folder = home.parent / "job"
        job_id = runner.json("submit", str(write_job(folder, TRAIN_JOB, {"train.py": TRAIN})))["id"]
        runner.wait_for_output(job_id, r"^step 20$", timeout=90)
        assert runner("preempt", job_id, "--notice", "aws").returncode == 0
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")
        assert job["state"] == "SUCCEEDED", job
        yield samples(scrape(ctl, ctl.token).text), runner.json("restarts", job_id)
    finally:
        ctl.stop()
        kill_nodes(home)


@pytest.mark.sqlite_only(PREEMPTION_ON_SQLITE)
def test_a_preemption_is_counted_with_its_cloud_zone_and_reason(preempted):
    """The preempted attempt appears in the preemption counter under the zone it ran in."""
    found, (first, _) = preempted
    assert value(found, "runner_preemptions_total", cloud="local", zone=first["zone"], end_reason="preempted") == 1
    assert value(found, "runner_attempts_total", cloud="local", zone=first["zone"], end_reason="preempted") == 1


@pytest.mark.sqlite_only(PREEMPTION_ON_SQLITE)
def test_recovery_after_a_preemption_is_observed(preempted):
    """The time from the preempted attempt's end to the next attempt running is one recovery observation."""
    found, _ = preempted
    assert value(found, "runner_recovery_seconds_count", end_reason="preempted") == 1
    assert value(found, "runner_recovery_seconds_sum", end_reason="preempted") > 0


@pytest.mark.sqlite_only(PREEMPTION_ON_SQLITE)
def test_the_emergency_checkpoint_commit_seconds_are_reported(preempted):
    """The emergency checkpoint's commit time, reported by the agent, lands in the commit histogram."""
    found, _ = preempted
    assert value(found, "runner_checkpoint_commit_seconds_count", emergency="true") == 1
    assert value(found, "runner_checkpoint_commit_seconds_sum", emergency="true") > 0


@pytest.mark.sqlite_only(PREEMPTION_ON_SQLITE)
def test_the_warning_left_when_the_aws_notice_was_seen_is_reported(preempted):
    """The seconds left before the AWS notice's deadline when the watcher saw it are one observation."""
    found, _ = preempted
    assert value(found, "runner_notice_warning_seconds_count", source="aws", kind="termination") == 1
    assert 0 < value(found, "runner_notice_warning_seconds_sum", source="aws", kind="termination") <= 7


@pytest.mark.sqlite_only(PREEMPTION_ON_SQLITE)
def test_the_restart_log_notice_keeps_its_shape(preempted):
    """The timing fields the agent adds for metrics do not appear in the restart log's notice."""
    _, (first, _) = preempted
    assert first["notice"]["source"] == "aws" and first["notice"]["received_at"]
    assert not {"received_unix", "deadline_unix", "issued_unix"} & set(first["notice"])


# --- the collector over a SQLite store ------------------------------------------------------------------
OFFER = {"instance_type": "sim-t4", "spot_price": 0.36, "on_demand_price": 1.0}


@pytest.fixture
def store(db_url) -> Store:
    """One job: attempt 1 in local-a ran 1010-1100 and was preempted; attempt 2 in local-b runs since 1130."""
    store = Store(open_database(db_url))
    with store.db.transaction() as tx:
        store.insert_job(tx, "j1", "j", job_spec("j"), "PENDING", 1000.0)
        transition(tx, "j1", PROVISIONING, now=1000.0, message="launching")
        store.insert_attempt(tx, "j1", "n1", make_offer(**OFFER, zone="local-a"), True, 0, 1000.0)
        store.mark_attempt_running(tx, "j1", 1, 1010.0)
        transition(tx, "j1", RUNNING, now=1010.0, message="running")
        transition(tx, "j1", RECOVERING, now=1100.0, message="preempted",
                   attempt_end=AttemptEnd(attempt=1, reason="preempted"))
        transition(tx, "j1", PROVISIONING, now=1101.0, message="relaunching")
        store.insert_attempt(tx, "j1", "n2", make_offer(**OFFER, zone="local-b"), True, 0, 1105.0)
        store.mark_attempt_running(tx, "j1", 2, 1130.0)
        transition(tx, "j1", RUNNING, now=1130.0, message="running")
    return store


def collect(store: Store, now: float = 1205.0) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StateCollector(store.db, clock=lambda: now))
    return registry


def report_commit(store: Store, checkpoint: dict, now: float | None = None, keep: int = MAX_MEASUREMENTS) -> None:
    """Attempt 2 of j1 reports a durable commit, written as the report lane writes it (metrics.record_commits)."""
    report = CheckpointReport("j1", 2, checkpoint, commit_measurement("j1", 2, checkpoint, now))
    with store.db.transaction() as tx:
        record_commits(store, tx, [report], keep=keep)


def assert_every_commit_counted(store: Store, values: list[float]) -> None:
    """The commit-seconds histogram (not emergency) counts every one of ``values``: count, sum and buckets."""
    registry = collect(store)
    labels = {"emergency": "false"}
    assert registry.get_sample_value("runner_checkpoint_commit_seconds_count", labels) == len(values)
    assert registry.get_sample_value("runner_checkpoint_commit_seconds_sum", labels) == pytest.approx(sum(values))
    for le in (0.25, 1.0, 2.5):
        expected = sum(v <= le for v in values)
        bucket = registry.get_sample_value("runner_checkpoint_commit_seconds_bucket", {**labels, "le": str(le)})
        assert bucket == expected


def test_recovery_seconds_run_from_the_preempted_end_to_the_next_attempt_running(store):
    """Preempted at 1100, next attempt running at 1130: one recovery of 30 seconds."""
    registry = collect(store)
    assert registry.get_sample_value("runner_recovery_seconds_count", {"end_reason": "preempted"}) == 1
    assert registry.get_sample_value("runner_recovery_seconds_sum", {"end_reason": "preempted"}) == 30
    assert registry.get_sample_value("runner_recovery_seconds_bucket", {"end_reason": "preempted", "le": "15.0"}) == 0
    assert registry.get_sample_value("runner_recovery_seconds_bucket", {"end_reason": "preempted", "le": "30.0"}) == 1


def test_cost_is_billed_per_second_per_zone_up_to_now_for_the_running_attempt(store):
    """At 0.36 USD/h: 100 s of the ended attempt and 100 s so far of the running one, each 0.01 USD."""
    registry = collect(store, now=1205.0)
    assert registry.get_sample_value("runner_job_cost_usd_total", {"cloud": "local", "zone": "local-a"}) == 0.01
    assert registry.get_sample_value("runner_job_cost_usd_total", {"cloud": "local", "zone": "local-b"}) == 0.01


def test_jobs_by_state_and_attempt_counters_follow_the_restart_log(store):
    """One RUNNING job; one ended attempt counted as a preemption; one attempt running."""
    registry = collect(store)
    assert registry.get_sample_value("runner_jobs", {"state": "RUNNING"}) == 1
    assert registry.get_sample_value("runner_jobs", {"state": "PENDING"}) == 0
    where = {"cloud": "local", "zone": "local-a", "end_reason": "preempted"}
    assert registry.get_sample_value("runner_preemptions_total", where) == 1
    assert registry.get_sample_value("runner_attempts_total", {**where, "end_reason": "running"}) is None
    assert registry.get_sample_value("runner_attempts_running", {"cloud": "local", "zone": "local-b"}) == 1


def test_a_notice_with_an_issue_time_gives_detection_and_warning_seconds(store):
    """An AWS rebalance seen 0.25 s after its noticeTime, 60 s before its deadline, is one observation of each."""
    notice = {"source": "aws", "kind": "rebalance", "id": "aws:rebalance:rebalance",
              "issued_unix": 2000.0, "received_unix": 2000.25, "deadline_unix": 2060.25}
    with store.db.transaction() as tx:
        record_notice(tx, "j1", 2, notice)
    labels = {"source": "aws", "kind": "rebalance"}
    registry = collect(store)
    assert registry.get_sample_value("runner_notice_detection_seconds_sum", labels) == 0.25
    assert registry.get_sample_value("runner_notice_detection_seconds_bucket", {**labels, "le": "0.25"}) == 1
    assert registry.get_sample_value("runner_notice_warning_seconds_sum", labels) == 60


def test_a_report_delivered_twice_is_observed_once(store):
    """The same durable commit reported twice counts once in the commit histogram."""
    commit = {"step": 40, "durable": True, "emergency": True, "seconds": 1.5}
    for _ in range(2):
        report_commit(store, commit)
    registry = collect(store)
    assert registry.get_sample_value("runner_checkpoint_commit_seconds_count", {"emergency": "true"}) == 1
    assert registry.get_sample_value("runner_checkpoint_commit_seconds_sum", {"emergency": "true"}) == 1.5


def test_metrics_survive_a_controller_restart(store, db_url):
    """A second process opening the same database computes the same figures."""
    reopened = Store(open_database(db_url))
    assert collect(reopened).get_sample_value("runner_recovery_seconds_sum", {"end_reason": "preempted"}) == 30


def test_the_table_is_folded_in_batches_a_twentieth_over_its_maximum_and_every_observation_still_counts(store):
    """Folding sorts every kept row: it is done once the table is a twentieth over its maximum (not for every report
    group's few new rows), and folds it back to the maximum; the histograms count every observation throughout."""
    from runner.state.measurements import measurements

    keep, sizes, values = 100, [], []
    for step in range(1, 301):
        values.append(0.01 * step)
        report_commit(store, {"step": step, "durable": True, "seconds": values[-1]}, now=5000.0 + step, keep=keep)
        sizes.append(len(measurements(store.db)))
    assert max(sizes) == keep + keep // 20 and min(sizes[keep:]) == keep  # bounded, and folded back in batches
    assert sum(1 for before, after in zip(sizes, sizes[1:]) if after < before) == (300 - keep) // (keep // 20 + 1)
    assert_every_commit_counted(store, values)


def test_the_measurements_table_stays_bounded_while_the_histograms_count_every_observation(store):
    """50 commits with room for 10 kept one by one: 10 rows remain, and count, sum and buckets cover all 50."""
    from runner.state.measurements import measurements

    values = [0.05 * step for step in range(1, 51)]  # 0.05 s .. 2.5 s
    for step, seconds in enumerate(values, 1):
        report_commit(store, {"step": step, "durable": True, "seconds": seconds}, now=2000.0 + step, keep=10)
    assert len(measurements(store.db)) == 10
    assert_every_commit_counted(store, values)
