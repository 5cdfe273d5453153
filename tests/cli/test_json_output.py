"""What `--json` prints is for programs: stdout holds one JSON document and nothing else, the exit code is that of
the same command without `--json` and the contract's (2: bad input or configuration), and a job's
`current_attempt` is the same object in `jobs` as in `status`."""

from __future__ import annotations

import json

import pytest

from conftest import write_job

CHATTY = """
name: chatty
run: echo "a line the job printed"; exit 3
resources: {cloud: [local]}
recovery: {max_failures: 0, resume_drill: "off"}
"""

# A deadline job with spot_policy auto: the cost policy places it, and its current attempt says why.
PLACED = """
name: placed
run: sleep 600
resources: {cloud: [local], spot_policy: auto}
recovery: {resume_drill: "off", deadline: 10h, total_steps: 1000}
"""


def test_submit_follow_json_prints_only_the_id_object_on_stdout(tmp_path, runner, controller):
    """`submit --follow --json`: stdout parses as `{"id": ...}`; the job's output and its end go to stderr, in
    order; the exit code still says how the job ended (1: it failed)."""
    result = runner("submit", str(write_job(tmp_path / "job", CHATTY)), "--follow", "--json", timeout=300)
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)  # the whole of stdout: one JSON document, on one line
    assert list(document) == ["id"] and document["id"].startswith("chatty-")
    assert result.stdout == json.dumps(document) + "\n"
    order = ["===== attempt 1", "a line the job printed", "Z FAILED:", "its restart log"]
    where = [result.stderr.find(text) for text in order]
    assert all(i >= 0 for i in where) and where == sorted(where), result.stderr


@pytest.mark.parametrize("filters, reason", [
    (("--accelerators", "H100:3"), "H100 comes as H100:8"),
    (("--cloud", "aws"), "cloud aws is not configured"),
])
def test_offers_json_exits_as_the_table_does_when_no_offer_fits(runner, controller, filters, reason):
    """No offer fits: exit 1 with or without --json, the reason on stderr; the JSON on stdout is an empty list."""
    table, as_json = runner("offers", *filters), runner("offers", *filters, "--json")
    assert (table.returncode, as_json.returncode) == (1, 1), as_json.stdout + as_json.stderr
    assert json.loads(as_json.stdout) == []
    assert reason in table.stderr and reason in as_json.stderr


def test_jobs_json_shows_the_current_attempt_as_status_json_does(tmp_path, runner, controller):
    """The running attempt in `runner jobs --json` has every field `runner status JOB --json` gives it, with the
    same values (its cost aside, which grows between the two reads): here the cost policy's reason for the market."""
    job_id = runner.json("submit", str(write_job(tmp_path / "job", PLACED)))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", what="running")
    in_status = runner.json("status", job_id)["current_attempt"]
    (listed,) = [job for job in runner.json("jobs") if job["id"] == job_id]
    in_jobs = listed["current_attempt"]
    assert in_status["message"] and in_status["message"].startswith("spot:"), in_status
    assert set(in_jobs) == set(in_status), set(in_status) ^ set(in_jobs)
    assert {k: v for k, v in in_jobs.items() if k != "cost_usd"} == {k: v for k, v in in_status.items()
                                                                      if k != "cost_usd"}


@pytest.mark.parametrize("where", ["RUNNER_SERVER", "config.yaml"])
def test_a_controller_url_without_its_scheme_is_bad_configuration(runner, where):
    """`127.0.0.1:8470` (no http://) as the controller's URL: exit 2 with or without --json, naming where it was
    set and the form to use; no request is tried with it."""
    env = {"RUNNER_TOKEN": "x"}
    if where == "RUNNER_SERVER":
        env["RUNNER_SERVER"] = "127.0.0.1:8470"
    else:
        (runner.home / "config.yaml").write_text("server: 127.0.0.1:8470\n")
    for args in (("jobs", "--json"), ("jobs",), ("status", "some-job", "--json")):
        result = runner(*args, env=env)
        assert result.returncode == 2 and result.stdout == "", (args, result.stderr)
        assert f"{where}" in result.stderr and "'127.0.0.1:8470'" in result.stderr and "http://" in result.stderr
        assert "--debug" not in result.stderr
