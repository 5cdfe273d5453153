"""The pure GCP request builders: config, names, labels, scheduling, accelerators and the instance body."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest
from gcp_fixtures import A100, CONFIG, T4, launch_request

from runner.providers.offers import Offer
from runner.providers.errors import ProviderError
from runner.providers.gcp.errors import GCPConfigError
from runner.providers.gcp.requests import (
    GCPConfig,
    guest_accelerators,
    instance_body,
    instance_name,
    label_value,
    parse_config,
    parse_ref,
    request_id,
    scheduling,
)

GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def config(**changes) -> GCPConfig:
    return parse_config({**CONFIG, **changes})


def test_builders_need_no_cloud_sdk():
    """Importing the builders and the error translation loads no Google client library."""
    code = ("import sys, runner.providers.gcp.requests, runner.providers.gcp.errors; "
            "print([m for m in sys.modules if m.startswith(('google.cloud', 'google.api_core'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_vm_name_is_the_node_id_prefixed():
    """A node id that is already a valid name gives runner-<node id>."""
    assert instance_name("n-0123456789ab") == "runner-n-0123456789ab"


@pytest.mark.parametrize("node_id", ["N_Upper.Case", "x" * 80, "n--", "-", "ünïcode-node"])
def test_the_vm_name_is_always_a_valid_gce_name(node_id):
    """Any node id maps to a valid GCE name of at most 63 characters."""
    name = instance_name(node_id)
    assert GCE_NAME.match(name) and len(name) <= 63


def test_different_node_ids_that_clean_to_the_same_text_get_different_names():
    """Cleaning a node id keeps names unique (a short hash is appended)."""
    assert instance_name("a_b") != instance_name("a.b")
    assert instance_name("x" * 80) != instance_name("x" * 81)


def test_the_request_id_is_a_uuid5_stable_per_node():
    """The insert's request id is a UUID5 of the node id: the same for the same node, different otherwise."""
    assert request_id("n-1") == request_id("n-1") != request_id("n-2")
    assert uuid.UUID(request_id("n-1")).version == 5


def test_label_values_are_lowercase_and_short():
    """Label values keep only lowercase letters, digits, '_' and '-', up to 63 characters."""
    assert label_value("Job.Name/1") == "job-name-1"
    assert len(label_value("a" * 100)) == 63


def test_spot_scheduling_deletes_on_reclaim_and_never_restarts():
    """Spot VMs: provisioning model SPOT, deleted when reclaimed, terminate on maintenance, no restart."""
    assert scheduling(spot=True, has_gpu=True) == {
        "provisioningModel": "SPOT", "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
        "automaticRestart": False}


def test_on_demand_cpu_vms_may_live_migrate():
    """An on-demand VM without GPUs may live-migrate; one with GPUs terminates on host maintenance."""
    assert scheduling(spot=False, has_gpu=False)["onHostMaintenance"] == "MIGRATE"
    assert scheduling(spot=False, has_gpu=True)["onHostMaintenance"] == "TERMINATE"


@pytest.mark.parametrize("gpu, name", [("T4", "nvidia-tesla-t4"), ("V100", "nvidia-tesla-v100"),
                                       ("P100", "nvidia-tesla-p100"), ("P4", "nvidia-tesla-p4")])
def test_n1_machines_take_their_gpus_as_guest_accelerators(gpu, name):
    """N1 machines get the GPU as a zonal accelerator type."""
    assert guest_accelerators("n1-standard-8", gpu, 2, "us-central1-b") == [
        {"acceleratorType": f"zones/us-central1-b/acceleratorTypes/{name}", "acceleratorCount": 2}]


@pytest.mark.parametrize("machine, gpu", [("a2-highgpu-1g", "A100"), ("a3-highgpu-8g", "H100"),
                                          ("g2-standard-4", "L4"), ("e2-standard-4", None)])
def test_gpu_bundling_and_cpu_machines_take_no_guest_accelerators(machine, gpu):
    """A2, A3 and G2 machine types carry their GPUs; CPU-only machines have none."""
    assert guest_accelerators(machine, gpu, 1 if gpu else 0, "us-central1-a") == []


def test_a_gpu_on_a_machine_that_cannot_take_it_is_refused():
    """A catalog row pairing a T4 with an N2 machine raises ProviderError naming both."""
    with pytest.raises(ProviderError, match="T4.*n2-standard-8"):
        guest_accelerators("n2-standard-8", "T4", 1, "us-central1-a")


def test_the_instance_body_of_a_cpu_machine_carries_only_the_startup_script():
    """A CPU-only VM's metadata holds exactly one item, startup-script, with the given script."""
    cpu = Offer("gcp", "us-central1", "us-central1-a", "n2-standard-8", None, 0, 8, 32.0, 0.08, 0.39)
    body = instance_body(config(), launch_request(offer=cpu), "#!/bin/bash\necho hi\n")
    assert body["metadata"] == {"items": [{"key": "startup-script", "value": "#!/bin/bash\necho hi\n"}]}


def test_a_gpu_vm_asks_the_image_to_install_the_nvidia_driver():
    """A T4 VM's metadata also carries install-nvidia-driver=True, which Deep Learning VM images act on."""
    body = instance_body(config(), launch_request(), "#!/bin/bash\n")
    assert {"key": "install-nvidia-driver", "value": "True"} in body["metadata"]["items"]


def test_the_instance_body_for_a_bundled_gpu_machine_has_no_accelerators():
    """An A2 offer's body names the machine type and no guest accelerators."""
    body = instance_body(config(), launch_request(offer=A100), "")
    assert body["machineType"] == "zones/us-central1-a/machineTypes/a2-highgpu-1g"
    assert "guestAccelerators" not in body


def test_short_network_names_are_expanded():
    """Network and subnetwork short names become global and regional partial URLs."""
    body = instance_body(config(network="vpc", subnetwork="gpu-subnet", external_ip=False), launch_request(), "")
    assert body["networkInterfaces"] == [{"network": "global/networks/vpc",
                                          "subnetwork": "regions/us-central1/subnetworks/gpu-subnet"}]


def test_without_a_service_account_the_vm_gets_none():
    """With no service_account configured, the body attaches no service account."""
    raw = {k: v for k, v in CONFIG.items() if k != "service_account"}
    assert "serviceAccounts" not in instance_body(parse_config(raw), launch_request(offer=T4), "")


def test_boot_disk_size_and_type_come_from_config():
    """boot_disk_gb and boot_disk_type shape the boot disk."""
    body = instance_body(config(boot_disk_gb=250, boot_disk_type="pd-ssd"), launch_request(), "")
    params = body["disks"][0]["initializeParams"]
    assert params["diskSizeGb"] == "250" and params["diskType"] == "zones/us-central1-a/diskTypes/pd-ssd"


def test_config_defaults():
    """Only project, zones and image are required; the boot disk defaults to 100 GB pd-balanced."""
    parsed = parse_config({"project": "my-project", "zones": ["us-central1-a"], "image": "img"})
    assert (parsed.boot_disk_gb, parsed.boot_disk_type, parsed.external_ip) == (100, "pd-balanced", True)


@pytest.mark.parametrize("changes, key", [
    ({"project": None}, "project"),
    ({"project": "My Project"}, "project"),
    ({"zones": []}, "zones"),
    ({"zones": ["us-central1"]}, "zones"),
    ({"image": ""}, "image"),
    ({"boot_disk_gb": "big"}, "boot_disk_gb"),
    ({"boot_disk_gb": 5}, "boot_disk_gb"),
    ({"service_account": "runner"}, "service_account"),
    ({"external_ip": "yes"}, "external_ip"),
    ({"network": 3}, "network"),
    ({"regions": ["us-central1"]}, "regions"),
])
def test_config_mistakes_name_the_key(changes, key):
    """Each config mistake raises GCPConfigError naming clouds.gcp.<key>."""
    raw = {k: v for k, v in {**CONFIG, **changes}.items() if v is not None}
    with pytest.raises(GCPConfigError, match=rf"^clouds\.gcp\.{key}:"):
        parse_config(raw)


def test_a_ref_is_zone_slash_name():
    """parse_ref splits zone/name and refuses anything else."""
    assert parse_ref("us-central1-a/runner-n-1") == ("us-central1-a", "runner-n-1")
    with pytest.raises(ProviderError):
        parse_ref("runner-n-1")


def test_a_gang_vm_of_a_compact_series_names_its_jobs_placement_policy():
    """A G2 VM of a 2-node gang carries the job's resource policy; a single node or an N1 gang does not."""
    from runner.providers.base import LaunchRequest, NodeBootstrap
    from runner.providers.gcp.requests import placement_policy_body, supports_compact_placement

    def body(instance_type: str, gang_size: int) -> dict:
        gpu = "T4" if instance_type.startswith("n1-") else "L4"
        offer = Offer("gcp", "us-central1", "us-central1-a", instance_type, gpu, 1, 4, 16.0, 0.28, 0.71)
        request = LaunchRequest("n-1", "Job-1", 1, offer, True, NodeBootstrap("http://c", "n-1", "t"),
                                gang_size=gang_size)
        return instance_body(parse_config(CONFIG), request, "#!/bin/sh")

    assert body("g2-standard-4", 2)["resourcePolicies"] == [
        f"projects/{CONFIG['project']}/regions/us-central1/resourcePolicies/runner-job-1"]
    assert "resourcePolicies" not in body("g2-standard-4", 1) and "resourcePolicies" not in body("n1-standard-8", 2)
    assert placement_policy_body("Job-1")["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    assert supports_compact_placement("a3-highgpu-8g") and not supports_compact_placement("e2-medium")

