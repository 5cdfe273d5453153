"""GCPProvider with the real google-cloud-compute client (REST) against a fake Compute Engine API on loopback."""

from __future__ import annotations

import threading
import time

import pytest
from gcp_fixtures import A100, CONFIG, PROJECT, T4, ZONE, gce, launch_request, provider  # noqa: F401 - fixtures

from runner.providers.bootstrap import render_bootstrap
from runner.providers.errors import AuthError, NoCapacityError, ProviderError, QuotaError
from runner.providers.gcp import GCPConfigError, GCPProvider
from runner.providers.gcp.requests import instance_name, request_id

NODE = "n-0123456789ab"
VM = instance_name(NODE)
INSTANCES = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"


def inserted(gce) -> dict:
    (call,) = gce.calls("POST", "/instances")
    return call.body


def test_launch_inserts_a_spot_vm_with_its_t4_accelerator(provider, gce):
    """A spot launch on N1 asks for a Spot VM, deleted when reclaimed, with the T4 as a guest accelerator."""
    ref = provider.launch(launch_request(NODE, T4, spot=True))
    body = inserted(gce)
    assert ref == f"{ZONE}/{VM}"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-8"
    assert body["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                  "onHostMaintenance": "TERMINATE", "automaticRestart": False}
    assert body["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}]
    assert gce.instances[(ZONE, VM)]["status"] == "RUNNING"


def test_launch_labels_the_vm_with_job_attempt_and_node(provider, gce):
    """The VM carries labels naming the job, the attempt and the node."""
    provider.launch(launch_request(NODE))
    assert inserted(gce)["labels"] == {"runner-managed": "true", "runner-node": NODE, "runner-job": "j-tiny-gpt",
                                       "runner-attempt": "2"}


def test_launch_uses_image_disk_service_account_and_network_from_config(provider, gce):
    """Image, boot disk size, service account and network come from clouds.gcp."""
    provider.launch(launch_request(NODE))
    body = inserted(gce)
    (disk,) = body["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == CONFIG["image"]
    assert disk["initializeParams"]["diskSizeGb"] == "100"
    assert body["serviceAccounts"] == [{"email": CONFIG["service_account"],
                                        "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert body["networkInterfaces"][0]["network"] == "global/networks/default"


def test_launch_passes_the_bootstrap_as_startup_script_without_credentials(provider, gce, monkeypatch):
    """The startup-script is the rendered bootstrap: the controller, the node and its token, no cloud credentials."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/home/me/.config/gcloud/key-do-not-ship.json")
    request = launch_request(NODE)
    provider.launch(request)
    items = {item["key"]: item["value"] for item in inserted(gce)["metadata"]["items"]}
    assert set(items) == {"startup-script", "install-nvidia-driver"}
    script = items["startup-script"]
    assert script == render_bootstrap(request.bootstrap, cloud="gcp", zone=ZONE)
    assert "http://10.128.0.2:8470" in script and NODE in script and "node-token-secret" in script
    for secret in ("key-do-not-ship", "GOOGLE_APPLICATION_CREDENTIALS", "private_key", "refresh_token",
                   "client_secret", "BEGIN PRIVATE KEY"):
        assert secret not in script


def test_launch_of_an_a2_machine_attaches_no_accelerator(provider, gce):
    """A2 (and A3, G2) machine types come with their GPUs, so no guestAccelerators are sent."""
    provider.launch(launch_request(NODE, A100))
    body = inserted(gce)
    assert "guestAccelerators" not in body
    assert body["machineType"].endswith("/a2-highgpu-1g")


def test_on_demand_launch_is_a_standard_vm(provider, gce):
    """An on-demand launch uses the standard provisioning model and still terminates on host maintenance."""
    provider.launch(launch_request(NODE, spot=False))
    scheduling = inserted(gce)["scheduling"]
    assert scheduling["provisioningModel"] == "STANDARD"
    assert scheduling["onHostMaintenance"] == "TERMINATE"
    assert "instanceTerminationAction" not in scheduling


def test_relaunch_of_a_node_sends_the_same_request_id_and_makes_one_vm(provider, gce):
    """Launching the same node twice sends one request id and yields one VM and the same ref."""
    first = provider.launch(launch_request(NODE))
    second = provider.launch(launch_request(NODE))
    calls = gce.calls("POST", "/instances")
    assert first == second
    assert [c.query["requestId"] for c in calls] == [request_id(NODE)] * 2
    assert len(gce.instances) == 1


def test_relaunch_after_the_request_id_expired_adopts_the_existing_vm(provider, gce):
    """When GCE has forgotten the request id, the VM already named for the node is adopted, not duplicated."""
    first = provider.launch(launch_request(NODE))
    gce.forget_request_ids()
    assert provider.launch(launch_request(NODE)) == first
    assert len(gce.instances) == 1


def test_launch_waits_on_a_running_operation_through_the_fake(provider, gce):
    """An insert whose operation is still RUNNING is waited on with zone operations/wait at the same endpoint."""
    gce.slow_operations()
    provider.launch(launch_request(NODE))
    assert len(gce.calls("POST", "/wait")) == 1


def test_launch_keeps_waiting_while_the_operation_is_still_running(provider, gce):
    """A wait that returns the insert still RUNNING is repeated; the launch returns once the operation is DONE."""
    gce.hold_operations()
    done = []
    worker = threading.Thread(target=lambda: done.append(provider.launch(launch_request(NODE))))
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while len(gce.calls("POST", "/wait")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not done and len(gce.calls("POST", "/wait")) >= 3
    finally:
        gce.hold_operations(False)
        worker.join(20)
    assert done == [f"{ZONE}/{VM}"]


def test_launch_in_an_exhausted_zone_raises_no_capacity(provider, gce):
    """ZONE_RESOURCE_POOL_EXHAUSTED in the zone operation becomes NoCapacityError, and no VM is left."""
    gce.exhaust_zone(ZONE)
    with pytest.raises(NoCapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        provider.launch(launch_request(NODE))
    assert gce.instances == {}


def test_launch_with_the_detailed_stockout_code_raises_no_capacity(provider, gce):
    """ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS is a stockout too."""
    gce.exhaust_zone(ZONE, code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    with pytest.raises(NoCapacityError):
        provider.launch(launch_request(NODE))


def test_launch_over_quota_raises_quota_error_naming_the_quota(provider, gce):
    """QUOTA_EXCEEDED in the zone operation becomes QuotaError naming the quota."""
    gce.exceed_quota(ZONE, "GPUS_ALL_REGIONS")
    with pytest.raises(QuotaError, match="GPUS_ALL_REGIONS"):
        provider.launch(launch_request(NODE))


def test_launch_refused_by_the_insert_call_for_quota_raises_quota_error(provider, gce):
    """A quota refused by the insert call itself (HTTP 403, quotaExceeded) is a QuotaError, not an AuthError."""
    gce.exceed_quota(ZONE, "NVIDIA_T4_GPUS", in_call=True)
    with pytest.raises(QuotaError, match="NVIDIA_T4_GPUS"):
        provider.launch(launch_request(NODE))


def test_launch_without_permission_raises_auth_error_naming_the_roles(provider, gce):
    """HTTP 403 becomes AuthError (not retryable) telling which roles to grant."""
    gce.deny(403)
    with pytest.raises(AuthError, match="compute.instanceAdmin.v1") as caught:
        provider.launch(launch_request(NODE))
    assert caught.value.retryable is False


def test_launch_retries_a_transient_error(provider, gce):
    """A single 503 is retried with the same request id and the launch succeeds."""
    gce.fail_next(503)
    assert provider.launch(launch_request(NODE)) == f"{ZONE}/{VM}"
    assert len(gce.instances) == 1


def test_describe_a_running_vm_is_alive(provider, gce):
    """A RUNNING VM is alive."""
    ref = provider.launch(launch_request(NODE))
    assert provider.describe(NODE, ref).alive


def test_describe_a_preempted_and_deleted_spot_vm_is_preempted(provider, gce):
    """A Spot VM reclaimed (and deleted, its termination action) is gone with reason preempted."""
    ref = provider.launch(launch_request(NODE))
    gce.preempt(ZONE, VM)
    assert (ZONE, VM) not in gce.instances
    status = provider.describe(NODE, ref)
    assert (status.alive, status.reason) == (False, "preempted")


def test_describe_a_preempted_spot_vm_still_terminated_is_preempted(provider, gce):
    """A reclaimed Spot VM seen TERMINATED, before GCE deletes it, is preempted."""
    ref = provider.launch(launch_request(NODE))
    gce.preempt(ZONE, VM, delete=False)
    assert provider.describe(NODE, ref).reason == "preempted"


def test_describe_a_vm_deleted_behind_our_back_is_not_found(provider, gce):
    """A VM deleted by someone else, with no preemption recorded, is gone with reason not-found."""
    ref = provider.launch(launch_request(NODE))
    gce.delete_behind_our_back(ZONE, VM)
    status = provider.describe(NODE, ref)
    assert (status.alive, status.reason) == (False, "not-found")


def test_describe_an_on_demand_vm_stopped_by_someone_is_terminated(provider, gce):
    """A stopped on-demand VM is gone with reason terminated (never preempted)."""
    ref = provider.launch(launch_request(NODE, spot=False))
    gce.stop(ZONE, VM)
    assert provider.describe(NODE, ref).reason == "terminated"


def test_describe_never_reports_a_node_gone_on_an_api_error(provider, gce):
    """When the API keeps failing, describe raises ProviderError instead of declaring the node gone."""
    ref = provider.launch(launch_request(NODE))
    gce.fail_next(*[503] * 50)
    with pytest.raises(ProviderError) as caught:
        provider.describe(NODE, ref)
    assert not isinstance(caught.value, AuthError)


def test_describe_rides_out_one_transient_error(provider, gce):
    """One 503 while reading the VM is retried, and the node stays alive."""
    ref = provider.launch(launch_request(NODE))
    gce.fail_next(503)
    assert provider.describe(NODE, ref).alive


def test_terminate_deletes_the_vm_and_is_idempotent(provider, gce):
    """Terminate deletes the VM; terminating again (404) is no error."""
    ref = provider.launch(launch_request(NODE))
    provider.terminate(NODE, ref)
    provider.terminate(NODE, ref)
    assert gce.instances == {}
    assert len(gce.calls("DELETE", f"/instances/{VM}")) == 2


def test_terminate_without_a_ref_finds_the_vm_by_its_label(provider, gce):
    """With no recorded ref, terminate lists each configured zone by the node label and deletes what it finds."""
    provider.launch(launch_request(NODE))
    provider.launch(launch_request("n-other"))
    provider.terminate(NODE, None)
    assert list(gce.instances) == [(ZONE, instance_name("n-other"))]
    assert gce.calls("GET", "/instances")[0].query["filter"] == f'labels.runner-node = "{NODE}"'


def test_offers_are_the_catalog_gcp_rows_in_the_configured_zones(provider):
    """offers() lists only GCP catalog rows in clouds.gcp.zones."""
    offers = provider.offers()
    assert offers and {o.cloud for o in offers} == {"gcp"}
    assert {o.zone for o in offers} == set(CONFIG["zones"])
    assert {"T4", "L4", "A100", "H100"} <= {o.accelerator for o in offers}


def test_a_config_mistake_names_the_key():
    """A broken clouds.gcp raises GCPConfigError naming the key at fault."""
    with pytest.raises(GCPConfigError, match=r"clouds\.gcp\.zones"):
        GCPProvider({"project": PROJECT, "zones": "not a zone", "image": "img"})


def test_an_endpoint_that_is_not_a_url_is_refused(monkeypatch):
    """RUNNER_GCP_COMPUTE_ENDPOINT must be an http:// or https:// URL."""
    monkeypatch.setenv("RUNNER_GCP_COMPUTE_ENDPOINT", "127.0.0.1:9999")
    with pytest.raises(GCPConfigError, match="RUNNER_GCP_COMPUTE_ENDPOINT"):
        GCPProvider(dict(CONFIG))
