"""One node's set of fakes, and injection into them from another process's point of view."""

import pytest
import requests

from runner.providers.local import metadata
from runner.providers.local.metadata import inject_fault, inject_notice, serve_all


@pytest.fixture
def node():
    servers = serve_all()
    yield servers
    servers.stop()


def test_public_api_is_pinned():
    """The package exports exactly what the local provider and the CLI use."""
    assert sorted(metadata.__all__) == [
        "ENDPOINT_VARIABLES", "FakeGCEMetadata", "FakeIMDS", "FakeMetadataServer", "FakeScheduledEvents",
        "Fault", "NodeMetadata", "admin_request", "inject_fault", "inject_notice", "serve_all"]


def test_environment_names_every_endpoint_variable(node):
    """environment() maps each contract variable (and google-auth's ping variable) to a running fake."""
    env = node.environment()
    assert env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] == node["aws"].url
    assert env["GCE_METADATA_HOST"] == env["GCE_METADATA_IP"] == f"127.0.0.1:{node['gcp'].port}"
    assert env["RUNNER_AZURE_METADATA_ENDPOINT"] == node["azure"].url


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_inject_notice_reaches_the_fake_over_http(node, cloud):
    """inject_notice(cloud, endpoint, deadline) delivers that cloud's preemption through the admin API."""
    inject_notice(cloud, node.endpoints()[cloud], 60)
    server = node[cloud]
    if cloud == "aws":
        assert server._action[0] == "terminate" and server._rebalance is not None
    elif cloud == "gcp":
        assert server.value("instance/preempted") == "TRUE"
    else:
        assert [e["EventType"] for e in server._events] == ["Preempt"]


def test_inject_fault_reaches_the_fake_over_http(node):
    """inject_fault() makes a running fake misbehave from outside its process."""
    inject_fault(node.endpoints()["aws"], "status", status=500, count=1)
    response = requests.get(node["aws"].url + "/latest/meta-data/instance-id", timeout=30)
    assert response.status_code == 500


def test_admin_reset_clears_notices_and_faults(node):
    """POST /_fake/reset brings the fake back to a healthy node with nothing pending."""
    gce = node["gcp"]
    gce.preempt(30)
    gce.add_fault("status", status=503)
    metadata.admin_request(gce.endpoint, "reset")
    assert gce.value("instance/preempted") == "FALSE" and gce.stats()["requests"] == 0


def test_unknown_cloud_is_refused_with_the_choices():
    """An unknown cloud name is a ValueError listing the clouds."""
    with pytest.raises(ValueError, match="aws, gcp, azure"):
        inject_notice("oracle", "127.0.0.1:1", 30)


def test_unreachable_fake_says_so(node):
    """Injecting into a stopped node's server fails with a message that says the node may be gone."""
    endpoint = node.endpoints()["azure"]
    node.stop()
    with pytest.raises(RuntimeError, match="unreachable"):
        inject_notice("azure", endpoint, 30)


def test_bad_admin_request_is_a_400_naming_the_problem(node):
    """An admin call with an unknown op is refused with a message naming it."""
    with pytest.raises(RuntimeError, match="unknown op"):
        metadata.admin_request(node.endpoints()["aws"], "notice", {"op": "explode"})
