"""A job's life through the CLI against a real controller: submit, follow, logs, restarts, failures.

A controller start is a second of CPU, so the tests share controllers where they cannot see each other: those that
read only the jobs they submitted share `market`; those whose every submit is refused (the list of jobs stays empty)
share `refusals`; those that read the newest job of the list have one of their own (`controller`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from conftest import Runner, shared_controller, write_job

ECHO_JOB = """
name: hello
run: python count.py
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""
COUNT = "import sys, time\nfor i in range(3):\n    print(f'line {i}', flush=True); time.sleep(0.2)\nprint('to stderr', file=sys.stderr)\n"


def _shared_controller(tmp_path_factory) -> Iterator[Runner]:
    yield from shared_controller(tmp_path_factory, time_scale=0.05)


@pytest.fixture(scope="module")
def market(tmp_path_factory) -> Iterator[Runner]:
    """A controller for tests that each read only the jobs they submitted: the CLI driver, pointed at it."""
    yield from _shared_controller(tmp_path_factory)


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> Iterator[Runner]:
    """A controller that no test gets a job accepted by: its list of jobs stays empty."""
    yield from _shared_controller(tmp_path_factory)


def test_submit_follow_streams_output_and_exits_zero(tmp_path, market):
    """`submit --follow` prints the job's output and exits 0 when the job succeeds."""
    job = write_job(tmp_path / "job", ECHO_JOB, {"count.py": COUNT})
    result = market("submit", str(job), "--follow")
    assert result.returncode == 0, result.stderr
    assert "line 0" in result.stdout and "line 2" in result.stdout and "to stderr" in result.stdout
    assert "SUCCEEDED" in result.stderr


def test_jobs_and_status_json_have_contract_fields(tmp_path, runner, controller):
    """`jobs --json` and `status --json` carry the contract's fields."""
    job = write_job(tmp_path / "job", ECHO_JOB, {"count.py": COUNT})
    job_id = runner.json("submit", str(job))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", what="success")
    listed = runner.json("jobs")
    assert [j["id"] for j in listed] == [job_id]
    for record in (listed[0], runner.json("status", job_id)):
        for key in ("id", "name", "state", "attempts", "preemptions", "step", "cost_usd"):
            assert key in record
        assert record["state"] == "SUCCEEDED" and record["attempts"] == 1 and record["name"] == "hello"


def test_restart_log_row_has_contract_fields(tmp_path, market):
    """A finished attempt appears in `restarts --json` with where it ran, why it ended and its cost."""
    job = write_job(tmp_path / "job", ECHO_JOB, {"count.py": COUNT})
    job_id = market.json("submit", str(job))["id"]
    market.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", what="success")
    (row,) = market.json("restarts", job_id)
    assert row["attempt"] == 1 and row["cloud"] == "local" and row["zone"].startswith("local-")
    assert row["end_reason"] == "succeeded" and row["exit_code"] == 0
    assert row["resumed_from_step"] == 0 and row["cost_usd"] >= 0 and row["price_per_hour"] > 0
    assert row["started_at"].endswith("Z") and row["ended_at"].endswith("Z")


def test_failed_job_relaunches_up_to_max_failures_and_keeps_every_attempts_logs(tmp_path, runner, controller):
    """A job that exits non-zero is relaunched max_failures times, then FAILED, with all output kept."""
    job = write_job(tmp_path / "job", """
name: flaky
run: echo "attempt $RUNNER_ATTEMPT of $RUNNER_JOB_ID"; exit 3
resources: {cloud: [local]}
recovery: {max_failures: 1, resume_drill: "off"}
""")
    result = runner("submit", str(job), "--follow")
    assert result.returncode == 1
    job_id = runner.json("jobs")[0]["id"]
    rows = runner.json("restarts", job_id)
    assert [r["end_reason"] for r in rows] == ["failed", "failed"]
    assert [r["exit_code"] for r in rows] == [3, 3]
    assert runner.json("status", job_id)["state"] == "FAILED"
    logs = runner("logs", job_id).stdout
    assert "===== attempt 1" in logs and "===== attempt 2" in logs
    assert f"attempt 1 of {job_id}" in logs and f"attempt 2 of {job_id}" in logs
    only_second = runner("logs", job_id, "--attempt", "2").stdout
    assert "attempt 1 of" not in only_second and "attempt 2 of" in only_second
    missing = runner("logs", job_id, "--attempt", "5")  # a typo is an error, not an empty log
    assert missing.returncode == 1 and missing.stdout == ""
    assert f"job {job_id} has no attempt 5 (it has attempts 1 to 2)" in missing.stderr
    assert runner("logs", job_id, "--attempt", "5", "--follow").returncode == 1  # the job has ended: none will come


def test_setup_failure_fails_the_attempt_and_names_setup(tmp_path, market):
    """A failing setup command ends the attempt as failed with a message naming setup."""
    job = write_job(tmp_path / "job", """
name: bad-setup
setup: echo installing; exit 7
run: echo never
resources: {cloud: [local]}
recovery: {max_failures: 0, resume_drill: "off"}
""")
    job_id = market.json("submit", str(job))["id"]
    market.wait_for(job_id, lambda j: j["state"] == "FAILED", what="failure")
    (row,) = market.json("restarts", job_id)
    assert row["exit_code"] == 7 and "setup failed" in row["message"]
    assert "never" not in market("logs", job_id).stdout


def test_job_sees_runner_variables_and_its_env(tmp_path, runner, controller):
    """The job's process gets the RUNNER_* variables and the job file's env."""
    job = write_job(tmp_path / "job", """
name: env-check
run: env | grep -E '^(RUNNER_|GREETING)' | sort
env: {GREETING: hi}
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
""")
    assert runner("submit", str(job), "--follow").returncode == 0
    job_id = runner.json("jobs")[0]["id"]
    out = runner("logs", job_id).stdout
    for name in ("RUNNER_JOB_ID=" + job_id, "RUNNER_ATTEMPT=1", "RUNNER_CHECKPOINT_DIR=", "RUNNER_CHECKPOINT_URL=",
                 "RUNNER_CONTROL=", "GREETING=hi"):
        assert name in out
    row = runner.json("restarts", job_id)[0]  # where it runs, as the restart log names it
    for name in (f"RUNNER_CLOUD={row['cloud']}", f"RUNNER_ZONE={row['zone']}",
                 f"RUNNER_INSTANCE_TYPE={row['instance_type']}", f"RUNNER_SPOT={1 if row['spot'] else 0}"):
        assert name in out, out


def test_unknown_job_is_a_clear_error(refusals):
    """Asking for a job that does not exist exits 1 naming the id."""
    result = refusals("status", "nope-123")
    assert result.returncode == 1
    assert "nope-123" in result.stderr and "Traceback" not in result.stderr


def test_jobs_json_is_a_list_even_when_empty(refusals):
    """`jobs --json` prints a JSON list."""
    assert json.loads(refusals("jobs", "--json").stdout) == []


def test_unknown_accelerator_is_refused_at_submit_listing_known_ones(tmp_path, refusals):
    """A job asking for an accelerator no cloud has exits 2 and lists the known names."""
    job = write_job(tmp_path / "j", "name: big\nrun: x\nresources: {accelerators: 'H200:3'}\n")
    result = refusals("submit", str(job))
    assert result.returncode == 2
    assert "H200" in result.stderr and "T4" in result.stderr and "A100" in result.stderr
    assert refusals.json("jobs") == []


@pytest.mark.parametrize("accelerators,key,words", [
    ("[T4:1, H200:3]", "resources.accelerators[1]", ["unknown accelerator 'H200'", "A100"]),
    ("[T4:1, L4]", "resources.accelerators[1]", ["NAME:COUNT"]),
    ("[L4:1, l4:1]", "resources.accelerators[1]", ["listed twice"]),
    ("[]", "resources.accelerators", ["empty"]),
])
def test_bad_alternatives_are_refused_by_validate_and_submit_alike_naming_the_item(tmp_path, refusals,
                                                                                   accelerators, key, words):
    """An unknown, malformed or repeated alternative exits 2 naming its item, in `validate` as at submit."""
    job = write_job(tmp_path / "j", f"name: alt\nrun: x\nresources: {{accelerators: {accelerators}}}\n")
    for command in ("validate", "submit"):
        result = refusals(command, str(job))
        assert result.returncode == 2, (command, result.stderr)
        assert f"{key}:" in result.stderr and all(w in result.stderr for w in words), (command, result.stderr)
        assert "Traceback" not in result.stderr
    assert refusals.json("jobs") == []


def test_offers_takes_several_accelerators(refusals):
    """`offers --accelerators L4:1 --accelerators T4:1` lists the offers of either, cheapest spot first."""
    rows = refusals.json("offers", "--accelerators", "L4:1", "--accelerators", "T4:1")
    assert {(r["accelerator"], r["accelerator_count"]) for r in rows} == {("L4", 1), ("T4", 1)}
    assert [r["spot_price"] for r in rows] == sorted(r["spot_price"] for r in rows)


def test_price_cap_below_every_offer_is_refused_naming_the_cap(tmp_path, refusals):
    """max_price_per_hour below every fitting offer exits 2 naming it and the cheapest offer."""
    job = write_job(tmp_path / "j", "name: cheap\nrun: x\nresources: {accelerators: 'T4:1', max_price_per_hour: 0.01}\n")
    result = refusals("submit", str(job))
    assert result.returncode == 2
    assert "max_price_per_hour" in result.stderr and "cheapest" in result.stderr


def test_offers_lists_fitting_offers_cheapest_first_with_filters(refusals):
    """`offers --accelerators A100:8` lists only 8xA100 offers, cheapest spot first; --on-demand orders by that."""
    rows = refusals.json("offers", "--accelerators", "A100:8", "--refresh")
    assert rows and all(r["accelerator"] == "A100" and r["accelerator_count"] == 8 for r in rows)
    assert [r["spot_price"] for r in rows] == sorted(r["spot_price"] for r in rows)
    on_demand = refusals.json("offers", "--on-demand")
    assert [r["on_demand_price"] for r in on_demand] == sorted(r["on_demand_price"] for r in on_demand)
    bad = refusals("offers", "--accelerators", "Z9000:1")
    assert bad.returncode == 2 and "Z9000" in bad.stderr
