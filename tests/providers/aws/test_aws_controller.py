"""The controller with the AWS provider against moto: launch, no duplicates across a crash, cancel, vanished
instances, spot reclaims, and launches that EC2 refuses (injected by a proxy in front of moto)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml
from aws_fixtures import OTHER_REGION, REGION, aws_config  # noqa: F401 - fixtures below come from the same module
from aws_fixtures import ami, moto_endpoint, session  # noqa: F401

from conftest import Controller, Runner, kill_nodes, write_job

FAKES = Path(__file__).resolve().parents[2] / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

from ec2_proxy import EC2Proxy  # noqa: E402

# A cloud node's disk goes with the node: a job that may run on AWS names a bucket for its checkpoints.
CHECKPOINT = "checkpoint: {durable_url: 's3://runner-test-bucket/ckpt'}\n"
JOB = "name: on-aws\nrun: python train.py\nresources: {cloud: [aws], accelerators: 'T4:1'}\n" + CHECKPOINT


def _instances(session, job_id: str) -> list[dict]:
    ec2 = session.client("ec2", region_name=REGION)
    pages = ec2.describe_instances(Filters=[{"Name": "tag:runner:job", "Values": [job_id]}])["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def _start(home, ami, endpoint: str | None = None) -> tuple[Controller, Runner]:
    """A controller with the AWS provider; ``endpoint`` (a proxy in front of moto) replaces moto's URL."""
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"aws": aws_config(ami)}}))
    ctl = Controller(home, env={"AWS_ENDPOINT_URL": endpoint} if endpoint else None).start()
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
    again = None
    try:
        port = int(ctl.url.rsplit(":", 1)[1])
        job_id = runner.json("submit", str(write_job(tmp_path / "j", JOB)))["id"]
        time.sleep(0.3)
        ctl.kill()
        again = Controller(home).start(port)
        runner.wait_for(job_id, lambda j: j["state"] == "PROVISIONING", what="a launch")
        time.sleep(2)  # a few reconciler ticks: a duplicate would have appeared by now
        assert len(_instances(session, job_id)) == 1
        assert len(runner.json("restarts", job_id)) == 1
    finally:
        for controller in (ctl, again):  # the first one too, should the test fail before killing it
            if controller is not None:
                controller.stop()


# --- instances that vanish, and launches that EC2 refuses ------------------------------------------

@pytest.fixture
def proxy(moto_endpoint):
    """The EC2 proxy in front of moto, forwarding everything until told otherwise."""
    with EC2Proxy(moto_endpoint) as running:
        yield running


@pytest.fixture
def start(tmp_path, ami):
    """Start a controller with the AWS provider (through ``endpoint`` when given); stopped after the test."""
    started: list[tuple[Controller, Path]] = []

    def start(endpoint: str | None = None) -> Runner:
        home = tmp_path / "home"
        home.mkdir()
        ctl, runner = _start(home, ami, endpoint)
        started.append((ctl, home))
        return runner

    yield start
    for ctl, home in started:
        ctl.stop()
        kill_nodes(home)


def _job_instances(session, job_id: str) -> list[dict]:
    """Every instance tagged with the job, in both configured regions, oldest first."""
    found = []
    for region in (REGION, OTHER_REGION):
        answer = session.client("ec2", region_name=region).describe_instances(
            Filters=[{"Name": "tag:runner:job", "Values": [job_id]}])
        found += [i for r in answer["Reservations"] for i in r["Instances"]]
    return sorted(found, key=lambda i: i["LaunchTime"])


def _terminate(session, instance: dict) -> None:
    """Terminate ``instance`` with a plain client, as a user in the console (or the spot market) would."""
    zone = instance["Placement"]["AvailabilityZone"]
    session.client("ec2", region_name=zone[:-1]).terminate_instances(InstanceIds=[instance["InstanceId"]])


def _relaunched(runner: Runner, session, job_id: str) -> tuple[list[dict], dict]:
    """Wait for attempt 2 to be launched; return the restart log and the new instance."""
    runner.wait_for(job_id, lambda j: j["attempts"] == 2 and j["state"] == "PROVISIONING", timeout=45,
                    what="the relaunch")
    live = [i for i in _job_instances(session, job_id) if i["State"]["Name"] in ("pending", "running")]
    assert len(live) == 1, live
    return runner.json("restarts", job_id), live[0]


def _where(row: dict) -> tuple[str, str, str]:
    """A restart-log row's cloud, zone and instance type."""
    return row["cloud"], row["zone"], row["instance_type"]


def _placed(instance: dict) -> tuple[str, str, str]:
    """Where EC2 says an instance runs, in the restart log's terms."""
    return "aws", instance["Placement"]["AvailabilityZone"], instance["InstanceType"]


def _launched(runner: Runner, session, job_id: str) -> dict:
    """Wait for the job's first launch; return its instance."""
    runner.wait_for(job_id, lambda j: j["state"] == "PROVISIONING", what="a launch")
    (instance,) = _job_instances(session, job_id)
    return instance


def test_an_instance_terminated_behind_the_controllers_back_is_lost_and_relaunched_in_another_zone(
        tmp_path, start, session):
    """An instance terminated outside the runner ends its attempt as lost; attempt 2 runs in another zone."""
    runner = start()
    job_id = runner.json("submit", str(write_job(tmp_path / "j", JOB)))["id"]
    first = _launched(runner, session, job_id)
    _terminate(session, first)
    (ended, current), second = _relaunched(runner, session, job_id)
    assert ended["end_reason"] == "lost" and current["end_reason"] == "running"
    assert _where(ended) == _placed(first) and _where(current) == _placed(second)
    assert current["zone"] != ended["zone"]


def test_a_spot_reclaimed_instance_is_preempted_and_relaunched_in_another_zone(tmp_path, proxy, start, session):
    """An instance that EC2 describes as reclaimed by the spot market ends its attempt as preempted."""
    runner = start(proxy.url)
    job_id = runner.json("submit", str(write_job(tmp_path / "j", JOB)))["id"]
    first = _launched(runner, session, job_id)
    proxy.reclaim_as_spot(first["InstanceId"])
    _terminate(session, first)
    (ended, current), second = _relaunched(runner, session, job_id)
    assert ended["end_reason"] == "preempted" and current["end_reason"] == "running"
    assert _where(ended) == _placed(first) and _where(current) == _placed(second)
    assert current["zone"] != ended["zone"]


def test_no_capacity_in_the_cheapest_zone_fails_over_to_another_zone_and_is_logged(
        tmp_path, proxy, start, session):
    """InsufficientInstanceCapacity in the cheapest zone: asked once, the job launches elsewhere, the row says so."""
    runner = start(proxy.url)
    cheapest = min((o for o in runner.json("offers", "--accelerators", "T4:1") if o["cloud"] == "aws"),
                   key=lambda o: o["spot_price"])["zone"]
    proxy.refuse("InsufficientInstanceCapacity", zones={cheapest})
    job_id = runner.json("submit", str(write_job(tmp_path / "j", JOB)))["id"]
    instance = _launched(runner, session, job_id)
    (row,) = runner.json("restarts", job_id)
    assert row["zone"] == instance["Placement"]["AvailabilityZone"] != cheapest
    (failure,) = row["launch_failures"]
    assert cheapest in failure and "InsufficientInstanceCapacity" in failure
    assert len(proxy.refusals) == 1  # EC2's HTTP 500 is not retried by the SDK: the next zone is tried at once


def test_an_unauthorized_launch_fails_the_job_with_a_message_naming_the_fix(tmp_path, proxy, start, session):
    """EC2's UnauthorizedOperation fails the job at once, and its message points to the IAM policy to grant."""
    runner = start(proxy.url)
    proxy.refuse("UnauthorizedOperation")
    job_id = runner.json("submit", str(write_job(tmp_path / "j", JOB)))["id"]
    job = runner.wait_for(job_id, lambda j: j["state"] == "FAILED", timeout=30, what="the failure")
    assert "UnauthorizedOperation" in job["message"] and "IAM policy in docs/aws.md" in job["message"]
    assert len(proxy.refusals) == 1 and not _job_instances(session, job_id)


def test_a_gang_launches_every_node_in_one_zone_and_one_cluster_placement_group(tmp_path, moto_endpoint, ami,
                                                                                  session):
    """num_nodes 2 of a g5 type: two tagged instances in one zone, both launched into the job's cluster
    placement group, which is created once."""
    home = tmp_path / "home"
    home.mkdir()
    gang = ("name: gang-on-aws\nrun: torchrun train.py\n"
            "resources: {cloud: [aws], accelerators: 'A10G:4', num_nodes: 2}\n" + CHECKPOINT)
    with EC2Proxy(moto_endpoint) as proxy:
        ctl, runner = _start(home, ami, proxy.url)
        try:
            job_id = runner.json("submit", str(write_job(tmp_path / "j", gang)))["id"]
            runner.wait_for(job_id, lambda j: len(_instances(session, job_id)) == 2, what="both launches")
            instances = _instances(session, job_id)
            assert len({i["Placement"]["AvailabilityZone"] for i in instances}) == 1
            assert proxy.placement_groups == {f"runner-{job_id}": "cluster"}
            assert proxy.launch_groups == [f"runner-{job_id}"] * 2
            (row,) = runner.json("restarts", job_id)
            assert [n["rank"] for n in row["nodes"]] == [0, 1]
            assert {n["zone"] for n in row["nodes"]} == {instances[0]["Placement"]["AvailabilityZone"]}
            runner("cancel", job_id)
        finally:
            ctl.stop()
            kill_nodes(home)
