"""The controller with the AWS provider against moto: launch, no duplicates across a crash, cancel."""

from __future__ import annotations

import time

import yaml
from aws_fixtures import REGION, aws_config  # noqa: F401 - fixtures below come from the same module
from aws_fixtures import ami, moto_endpoint, session  # noqa: F401

from conftest import Controller, Runner, kill_nodes, write_job

JOB = "name: on-aws\nrun: python train.py\nresources: {cloud: [aws], accelerators: 'T4:1'}\n"


def _instances(session, job_id: str) -> list[dict]:
    ec2 = session.client("ec2", region_name=REGION)
    pages = ec2.describe_instances(Filters=[{"Name": "tag:runner:job", "Values": [job_id]}])["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def _start(home, ami) -> tuple[Controller, Runner]:
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"aws": aws_config(ami)}}))
    ctl = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": ctl.url, "RUNNER_TOKEN": ctl.token})
    return ctl, runner


def test_a_job_launches_one_tagged_spot_instance_and_cancel_terminates_it(tmp_path, moto_endpoint, ami, session):
    """Submit on AWS: one spot instance tagged with the job; cancel ends the job and terminates it."""
    home = tmp_path / "home"
    home.mkdir()
    ctl, runner = _start(home, ami)
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "j", JOB)))["id"]
        runner.wait_for(job_id, lambda j: j["state"] == "PROVISIONING", what="a launch")
        (instance,) = _instances(session, job_id)
        assert instance["InstanceLifecycle"] == "spot"
        (row,) = runner.json("restarts", job_id)
        assert row["cloud"] == "aws" and row["instance_type"] == instance["InstanceType"]
        assert row["zone"] == instance["Placement"]["AvailabilityZone"]
        assert runner("cancel", job_id).returncode == 0
        runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", what="the cancel")
        deadline = time.monotonic() + 20
        while _instances(session, job_id)[0]["State"]["Name"] not in ("terminated", "shutting-down"):
            assert time.monotonic() < deadline, "the instance was not terminated"
            time.sleep(0.3)
    finally:
        ctl.stop()
        kill_nodes(home)


def test_a_controller_killed_right_after_submit_launches_no_duplicate(tmp_path, moto_endpoint, ami, session):
    """SIGKILL of the controller during the launch, then a restart: still exactly one instance."""
    home = tmp_path / "home"
    home.mkdir()
    ctl, runner = _start(home, ami)
    port = int(ctl.url.rsplit(":", 1)[1])
    job_id = runner.json("submit", str(write_job(tmp_path / "j", JOB)))["id"]
    time.sleep(0.3)
    ctl.kill()
    again = Controller(home).start(port)
    try:
        runner.wait_for(job_id, lambda j: j["state"] == "PROVISIONING", what="a launch")
        time.sleep(2)  # a few reconciler ticks: a duplicate would have appeared by now
        assert len(_instances(session, job_id)) == 1
        assert len(runner.json("restarts", job_id)) == 1
    finally:
        again.stop()
