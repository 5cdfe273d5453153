"""The controller with the GCP provider against a fake Compute Engine API: launch, preemption, stockouts,
cancel, and no duplicate VM across a controller crash.

A real `runner server` runs with ``clouds: {gcp: ...}`` in its config.yaml and its Compute calls sent to
the fake through RUNNER_GCP_COMPUTE_ENDPOINT. No VM is real, so no agent ever registers: jobs stay
PROVISIONING, which is enough to see what the controller asks of Compute Engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from gcp_fixtures import CONFIG, ZONE, gce  # noqa: F401 - gce is a fixture

from conftest import Controller, Runner, kill_nodes, write_job
from polling import eventually
from runner.providers.gcp.requests import PREEMPTED_OPERATION, STARTUP_SCRIPT_KEY, label_value

OTHER_ZONE = CONFIG["zones"][1]
BUCKET = "gs://team-checkpoints/runs"
ADVERTISED = "http://10.128.0.9:8470"  # the URL nodes are told, as a controller on a VM would advertise it
JOB = ("name: on-gcp\nrun: python train.py\nresources: {cloud: [gcp], accelerators: 'T4:1'}\n"
       "recovery: {resume_drill: 'off'}\n")


@dataclass
class Cluster:
    """A controller configured for GCP, the CLI pointed at it, and the fake API behind it."""

    home: Path
    gce: object
    controller: Controller
    runner: Runner

    def start(self, port: int = 0) -> None:
        env = {"RUNNER_GCP_COMPUTE_ENDPOINT": self.gce.endpoint, "RUNNER_ADVERTISE_URL": ADVERTISED}
        self.controller = Controller(self.home, env=env).start(port)
        self.runner.env.update({"RUNNER_SERVER": self.controller.url, "RUNNER_TOKEN": self.controller.token})

    def submit(self, tmp_path: Path) -> str:
        return self.runner.json("submit", str(write_job(tmp_path / "job", JOB)))["id"]

    def vms(self, job_id: str) -> list[dict]:
        """The job's VMs that exist now, found by the job label as `gcloud compute instances list` would."""
        return [vm for vm in list(self.gce.instances.values())
                if vm["labels"].get("runner-job") == label_value(job_id)]

    def restarts(self, job_id: str) -> list[dict]:
        """What `runner restarts JOB --json` prints, by the CLI's code in this process (a test polls it)."""
        return self.runner.restarts(job_id)


@pytest.fixture
def cluster(tmp_path, gce):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"gcp": {**CONFIG, "checkpoint_url": BUCKET}}}))
    cluster = Cluster(home, gce, None, Runner(home))
    cluster.start()
    yield cluster
    cluster.controller.stop()
    kill_nodes(home)


def zone_of(vm: dict) -> str:
    return vm["zone"].rsplit("/", 1)[1]


def test_a_job_inserts_one_spot_vm_labelled_with_it_and_logs_where(cluster, tmp_path):
    """A submitted job gets exactly one Spot VM labelled with the job; its restart-log row names gcp, zone and type."""
    job_id = cluster.submit(tmp_path)
    cluster.runner.wait_for(job_id, lambda j: j["state"] == "PROVISIONING", what="a launch")
    (vm,) = cluster.vms(job_id)
    assert vm["scheduling"]["provisioningModel"] == "SPOT"
    (row,) = cluster.restarts(job_id)
    assert (row["cloud"], row["zone"], row["spot"]) == ("gcp", zone_of(vm), True)
    assert vm["machineType"].endswith(f"/machineTypes/{row['instance_type']}")
    assert len(cluster.gce.calls("POST", "/instances")) == 1


def test_the_vm_is_told_the_advertised_controller_url(cluster, tmp_path):
    """The startup-script points the node at the controller's advertised URL, not at its loopback address."""
    job_id = cluster.submit(tmp_path)
    (vm,) = eventually(lambda: cluster.vms(job_id), "the VM")
    (item,) = [i for i in vm["metadata"]["items"] if i["key"] == STARTUP_SCRIPT_KEY]
    assert ADVERTISED in item["value"]
    assert cluster.controller.url not in item["value"]


def test_a_preempted_vm_ends_the_attempt_as_preempted_and_relaunches_in_another_zone(cluster, tmp_path):
    """A Spot reclaim, confirmed through the zone's operations, ends the attempt as preempted; the next is elsewhere."""
    job_id = cluster.submit(tmp_path)
    (vm,) = eventually(lambda: cluster.vms(job_id), "the first VM")
    first_zone = zone_of(vm)
    inserts_before = len(cluster.gce.calls("POST", "/instances"))
    cluster.gce.preempt(first_zone, vm["name"])

    def relaunched():
        rows = cluster.restarts(job_id)
        return rows if len(rows) == 2 else None

    rows = eventually(relaunched, "the relaunch")
    assert rows[0]["end_reason"] == "preempted"
    assert rows[1]["zone"] != first_zone and rows[1]["end_reason"] == "running"
    (second,) = eventually(lambda: cluster.vms(job_id), "the second VM")
    assert zone_of(second) == rows[1]["zone"]
    confirmed = [i for i, r in enumerate(cluster.gce.requests)
                 if r.method == "GET" and r.path.endswith(f"/zones/{first_zone}/operations")
                 and PREEMPTED_OPERATION in r.query.get("filter", "")]
    inserts = [i for i, r in enumerate(cluster.gce.requests) if r.method == "POST" and r.path.endswith("/instances")]
    assert confirmed and confirmed[0] < inserts[inserts_before]
    assert cluster.runner.json("status", job_id)["preemptions"] == 1


def test_an_exhausted_zone_fails_over_to_another_zone_and_is_logged(cluster, tmp_path):
    """A stockout in the first zone makes the launch go to another zone; the restart log lists the failure."""
    cluster.gce.exhaust_zone(ZONE)
    job_id = cluster.submit(tmp_path)
    cluster.runner.wait_for(job_id, lambda j: j["state"] == "PROVISIONING", what="a launch")
    (vm,) = cluster.vms(job_id)
    assert zone_of(vm) == OTHER_ZONE
    (row,) = cluster.restarts(job_id)
    assert row["zone"] == OTHER_ZONE
    (failure,) = row["launch_failures"]
    assert ZONE in failure and "ZONE_RESOURCE_POOL_EXHAUSTED" in failure


def test_cancel_deletes_every_vm_of_the_job(cluster, tmp_path):
    """Cancelling a job ends it as CANCELLED and deletes its VMs."""
    job_id = cluster.submit(tmp_path)
    (vm,) = eventually(lambda: cluster.vms(job_id), "the VM")
    assert cluster.runner("cancel", job_id).returncode == 0
    cluster.runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", what="the cancel")
    eventually(lambda: not cluster.vms(job_id), "the VM's deletion")
    assert cluster.gce.calls("DELETE", f"/instances/{vm['name']}")


def test_a_controller_killed_in_the_middle_of_a_launch_creates_no_duplicate_vm(cluster, tmp_path):
    """SIGKILL of the controller while it waits on its insert, then a restart: still exactly one VM and one attempt."""
    cluster.gce.hold_operations()  # the insert's operation stays RUNNING: the controller is caught mid-launch
    port = int(cluster.controller.url.rsplit(":", 1)[1])
    job_id = cluster.submit(tmp_path)
    eventually(lambda: cluster.gce.calls("POST", "/wait"), "the controller waiting on its insert")
    cluster.controller.kill()
    cluster.gce.hold_operations(False)
    cluster.start(port)
    cluster.runner.wait_for(job_id, lambda j: j["state"] == "PROVISIONING", what="a launch")
    time.sleep(2)  # a few reconciler ticks: a duplicate would have appeared by now
    assert len(cluster.vms(job_id)) == 1
    assert len(cluster.restarts(job_id)) == 1
    inserts = cluster.gce.calls("POST", "/instances")
    assert len(inserts) == 2 and len({c.query["requestId"] for c in inserts}) == 1


def test_a_node_is_told_to_checkpoint_under_the_configured_bucket(cluster, tmp_path):
    """A job naming no durable_url checkpoints under clouds.gcp.checkpoint_url/JOB, as its node learns at registration."""
    import re

    import requests

    job_id = cluster.submit(tmp_path)
    (vm,) = eventually(lambda: cluster.vms(job_id), "the VM")
    (script,) = [i["value"] for i in vm["metadata"]["items"] if i["key"] == STARTUP_SCRIPT_KEY]
    token = re.search(r"^node_token='?([^'\n]+)'?$", script, re.M).group(1)
    reply = requests.post(f"{cluster.controller.url}/v1/agent/register",
                          headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["checkpoint"]["durable_url"] == f"{BUCKET}/{job_id}"


def test_a_job_with_no_bucket_anywhere_is_refused_naming_durable_url(tmp_path, gce):
    """Without checkpoint.durable_url or clouds.gcp.checkpoint_url, submit exits 2 and says how to fix it."""
    home = tmp_path / "bare"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"gcp": dict(CONFIG)}}))
    controller = Controller(home, env={"RUNNER_GCP_COMPUTE_ENDPOINT": gce.endpoint}).start()
    try:
        runner = Runner(home)
        runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
        result = runner("submit", str(write_job(tmp_path / "job", JOB)))
        assert result.returncode == 2
        assert "checkpoint.durable_url" in result.stderr and "clouds.gcp.checkpoint_url" in result.stderr
        assert gce.calls("POST", "/instances") == []
    finally:
        controller.stop()


def test_a_gang_launches_every_vm_in_one_zone_under_the_jobs_compact_placement_policy(tmp_path, cluster):
    """num_nodes 2 of an L4 (G2) type: two VMs in one zone, both naming one compact placement policy."""
    gang = ("name: gang-on-gcp\nrun: torchrun train.py\n"
            "resources: {cloud: [gcp], accelerators: 'L4:1', num_nodes: 2}\nrecovery: {resume_drill: 'off'}\n")
    job_id = cluster.runner.json("submit", str(write_job(tmp_path / "gang", gang)))["id"]
    vms = eventually(lambda: (lambda found: found if len(found) == 2 else None)(cluster.vms(job_id)), "two VMs")
    assert len({zone_of(vm) for vm in vms}) == 1
    (policy,) = cluster.gce.policies.values()
    assert policy["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    assert all(vm["resourcePolicies"] == [vms[0]["resourcePolicies"][0]] for vm in vms)
    assert vms[0]["resourcePolicies"][0].endswith(f"/regions/us-central1/resourcePolicies/{policy['name']}")
    (row,) = cluster.restarts(job_id)
    assert [n["rank"] for n in row["nodes"]] == [0, 1]
