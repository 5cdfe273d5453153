"""What a newcomer trips on with the README, each fixed: `validate` checks what `submit` checks; `offers` says
which counts an accelerator comes in and where clouds are configured; `preempt` of an ended job says so."""

from __future__ import annotations

import pytest

from conftest import Runner, shared_controller, write_job

from runner.home import CONTROLLER_FILE

JOBS = {
    "B200:8": ("name: big\nrun: echo hi\nresources: {accelerators: 'B200:8'}\n", "unknown accelerator 'B200'"),
    "H100:3": ("name: odd\nrun: echo hi\nresources: {accelerators: 'H100:3'}\n", "H100 comes as H100:8"),
    "aws": ("name: away\nrun: echo hi\nresources: {cloud: [aws], accelerators: 'T4:1'}\n", "docs/aws.md"),
}


@pytest.fixture(scope="module")
def market(tmp_path_factory) -> Runner:
    """One controller for the tests that ask one (none of them depends on what another submitted; a controller
    start is a second of CPU): the CLI driver, pointed at it."""
    yield from shared_controller(tmp_path_factory, time_scale=0.05)


@pytest.mark.parametrize("which", list(JOBS))
def test_validate_refuses_what_submit_refuses(tmp_path, market, which):
    text, reason = JOBS[which]
    job = write_job(tmp_path / "job", text)
    validated, submitted = market("validate", str(job)), market("submit", str(job))
    assert (validated.returncode, submitted.returncode) == (2, 2), validated.stdout + validated.stderr
    assert reason in validated.stderr and reason in submitted.stderr
    assert "valid" not in validated.stdout


def test_a_submit_message_names_the_cheapest_offer_in_dollars(tmp_path, market):
    result = market("submit", str(write_job(tmp_path / "job", JOBS["H100:3"][0])))
    assert "the cheapest H100:8 offer is sim-h100-8 in local-" in result.stderr and "at $" in result.stderr


def test_validate_says_when_only_the_file_was_checked(tmp_path, runner):
    """With no controller to ask, validate passes the file (its accelerator names are checked against the
    shipped catalog; whether an offer of that count exists is not) and says plainly that the offers were not
    checked; it starts no controller for that."""
    job = write_job(tmp_path / "job", JOBS["H100:3"][0])
    result = runner("validate", str(job), env={"RUNNER_SERVER": "http://127.0.0.1:9", "RUNNER_TOKEN": "x"})
    assert result.returncode == 0
    assert "only the file was checked" in result.stdout
    result = runner("validate", str(job))
    assert result.returncode == 0 and "only the file was checked" in result.stdout
    assert "Started a local controller" not in result.stderr and not (runner.home / CONTROLLER_FILE).exists()


def test_validate_without_a_controller_still_refuses_an_unknown_accelerator(tmp_path, runner):
    result = runner("validate", str(write_job(tmp_path / "job", JOBS["B200:8"][0])))
    assert result.returncode == 2 and "unknown accelerator 'B200'" in result.stderr


def test_validate_passes_a_runnable_job(tmp_path, market):
    result = market("validate", str(write_job(tmp_path / "job", "name: ok\nrun: echo hi\nresources: {cloud: [local]}\n")))
    assert result.returncode == 0 and "valid" in result.stdout and "can run it" in result.stdout


def test_offers_with_a_count_nobody_offers_names_the_counts(market):
    result = market("offers", "--accelerators", "H100:3")
    assert result.returncode == 1
    assert "H100 comes as H100:8" in result.stderr and "$RUNNER_HOME" not in result.stderr + result.stdout


def test_offers_on_a_cloud_not_configured_points_to_its_guide(market):
    result = market("offers", "--cloud", "aws")
    assert result.returncode == 1
    assert "cloud aws is not configured" in result.stderr and "docs/aws.md" in result.stderr
    assert "$RUNNER_HOME" not in result.stderr


def test_preempting_an_ended_job_says_it_ended_as_cancel_does(tmp_path, market):
    job = write_job(tmp_path / "job", "name: done\nrun: echo hi\nresources: {cloud: [local]}\n"
                                      "recovery: {resume_drill: 'off'}\n")
    job_id = market.json("submit", str(job))["id"]
    market.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", what="success")
    cancelled, preempted = market("cancel", job_id), market("preempt", job_id)
    assert f"{job_id} already ended (SUCCEEDED)" in cancelled.stdout
    assert preempted.returncode == 1
    assert f"{job_id} already ended (SUCCEEDED)" in preempted.stderr and "409" not in preempted.stderr
