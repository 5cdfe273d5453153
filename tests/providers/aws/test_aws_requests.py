"""The pure EC2 request builders and answer readers: no SDK client, no server."""

from __future__ import annotations

import pytest

from runner.providers.aws.requests import (
    RegionSettings,
    format_ref,
    instance_profile,
    instances_in,
    node_filters,
    node_status,
    parse_ref,
    pick_instance,
    placement_group_params,
    run_instances_params,
    supports_cluster_placement,
)
from runner.providers.base import LaunchRequest, NodeBootstrap, NodeStatus
from runner.providers.offers import Offer

OFFER = Offer("aws", "us-east-1", "us-east-1b", "g5.xlarge", "A10G", 1, 4, 16.0, 0.40, 1.006)
SETTINGS = RegionSettings(region="us-east-1", image_id="ami-0123456789abcdef0")


def request(spot: bool = True) -> LaunchRequest:
    return LaunchRequest("n-7", "j-1", 2, OFFER, spot, NodeBootstrap("http://ctl:8470", "n-7", "tok"))


def test_a_spot_launch_asks_for_a_one_time_spot_instance_that_terminates_on_interruption():
    """Spot launches carry one-time spot market options with terminate on interruption."""
    params = run_instances_params(request(spot=True), SETTINGS, "#!/bin/bash")
    assert params["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
    }


def test_an_on_demand_launch_has_no_market_options():
    """On-demand launches leave InstanceMarketOptions out."""
    assert "InstanceMarketOptions" not in run_instances_params(request(spot=False), SETTINGS, "")


def test_the_offer_picks_type_and_zone_and_the_settings_pick_the_image():
    """Type and zone come from the offer, the image from the region's settings; one instance exactly."""
    params = run_instances_params(request(), SETTINGS, "#!/bin/bash")
    assert params["InstanceType"] == "g5.xlarge" and params["ImageId"] == "ami-0123456789abcdef0"
    assert params["Placement"] == {"AvailabilityZone": "us-east-1b"}
    assert (params["MinCount"], params["MaxCount"]) == (1, 1)
    assert params["UserData"] == "#!/bin/bash"


def test_the_node_id_is_the_client_token():
    """ClientToken is the node id, which makes a retried launch idempotent on AWS's side."""
    assert run_instances_params(request(), SETTINGS, "")["ClientToken"] == "n-7"


def test_a_subnet_replaces_the_placement_zone():
    """With a subnet, the subnet decides the zone and no Placement is sent."""
    params = run_instances_params(request(), SETTINGS, "", subnet_id="subnet-1")
    assert params["SubnetId"] == "subnet-1" and "Placement" not in params


def test_instance_and_volume_are_tagged_with_job_attempt_and_node():
    """Both the instance and its volumes get the runner tags and a readable Name."""
    specs = run_instances_params(request(), SETTINGS, "")["TagSpecifications"]
    assert [s["ResourceType"] for s in specs] == ["instance", "volume"]
    for spec in specs:
        tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
        assert tags == {"Name": "runner-n-7", "runner:job": "j-1", "runner:attempt": "2", "runner:node": "n-7"}


def test_optional_settings_are_sent_only_when_configured():
    """Key, security groups and instance profile appear only when set."""
    bare = run_instances_params(request(), SETTINGS, "")
    assert not {"KeyName", "SecurityGroupIds", "IamInstanceProfile", "SubnetId"} & set(bare)
    full = run_instances_params(request(), RegionSettings("us-east-1", "ami-1", ("subnet-1",), ("sg-1", "sg-2"),
                                                          "ops", "runner-node"), "")
    assert full["KeyName"] == "ops" and full["SecurityGroupIds"] == ["sg-1", "sg-2"]
    assert full["IamInstanceProfile"] == {"Name": "runner-node"}


def test_the_node_asks_for_imdsv2_with_room_for_a_container_hop():
    """Metadata requires IMDSv2 tokens, with a hop limit of 2 so a containerised agent reaches it."""
    options = run_instances_params(request(), SETTINGS, "")["MetadataOptions"]
    assert options == {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"}


def test_an_instance_profile_is_named_by_name_or_by_arn():
    """A profile ARN is sent as Arn, anything else as Name."""
    arn = "arn:aws:iam::123456789012:instance-profile/runner-node"
    assert instance_profile(arn) == {"Arn": arn}
    assert instance_profile("runner-node") == {"Name": "runner-node"}


def test_a_ref_carries_region_and_instance_id_and_reads_back():
    """format_ref and parse_ref round-trip ``REGION:INSTANCE_ID``."""
    ref = format_ref("us-west-2", "i-0abc")
    assert ref == "us-west-2:i-0abc" and parse_ref(ref) == ("us-west-2", "i-0abc")


@pytest.mark.parametrize("ref", ["", "i-0abc", "us-east-1:", ":i-0abc", "us-east-1:vm-1"])
def test_a_malformed_ref_is_rejected(ref):
    """A ref without a region or an instance id raises ValueError."""
    with pytest.raises(ValueError, match="REGION:i-"):
        parse_ref(ref)


def test_the_node_filter_selects_by_the_runner_node_tag():
    """Instances of a node are found by the ``runner:node`` tag."""
    assert node_filters("n-7") == [{"Name": "tag:runner:node", "Values": ["n-7"]}]


@pytest.mark.parametrize("state, reason, expected", [
    ("pending", None, NodeStatus(True)),
    ("running", None, NodeStatus(True)),
    ("shutting-down", "Server.SpotInstanceTermination", NodeStatus(False, "preempted")),
    ("terminated", "Server.SpotInstanceTermination", NodeStatus(False, "preempted")),
    ("stopped", "Server.SpotInstanceShutdown", NodeStatus(False, "preempted")),
    ("terminated", "Client.UserInitiatedShutdown", NodeStatus(False, "terminated")),
    ("shutting-down", None, NodeStatus(False, "terminated")),
    ("stopped", "Client.UserInitiatedShutdown", NodeStatus(False, "terminated")),
])
def test_an_instance_state_reads_as_a_node_status(state, reason, expected):
    """pending/running are alive; a spot reclaim is "preempted"; any other end is "terminated"."""
    entry = {"InstanceId": "i-1", "State": {"Name": state}}
    if reason:
        entry["StateReason"] = {"Code": reason, "Message": reason}
    assert node_status(entry) == expected


def test_no_instance_reads_as_not_found():
    """No instance at all is gone, reason "not-found"."""
    assert node_status(None) == NodeStatus(False, "not-found")


def test_the_liveliest_then_oldest_instance_stands_for_the_node():
    """When several instances carry a node's tag, a running one wins over a terminated one, then the oldest."""
    dead = {"InstanceId": "i-1", "State": {"Name": "terminated"}, "LaunchTime": "2026-01-01"}
    late = {"InstanceId": "i-3", "State": {"Name": "running"}, "LaunchTime": "2026-01-03"}
    early = {"InstanceId": "i-2", "State": {"Name": "running"}, "LaunchTime": "2026-01-02"}
    assert pick_instance([dead, late, early]) is early
    assert pick_instance([]) is None


def test_instances_are_read_from_reservations_or_a_run_answer():
    """instances_in flattens describe_instances reservations and reads run_instances' Instances."""
    assert instances_in({"Reservations": [{"Instances": [{"InstanceId": "i-1"}]},
                                          {"Instances": [{"InstanceId": "i-2"}]}]}) == [
        {"InstanceId": "i-1"}, {"InstanceId": "i-2"}]
    assert instances_in({"Instances": [{"InstanceId": "i-3"}]}) == [{"InstanceId": "i-3"}]
    assert instances_in({}) == []


def gang_request(instance_type: str, gang_size: int = 2) -> LaunchRequest:
    offer = Offer("aws", "us-east-1", "us-east-1b", instance_type, "A100", 8, 96, 1152.0, 9.8, 32.77)
    return LaunchRequest("n-8", "j-1", 1, offer, True, NodeBootstrap("http://ctl:8470", "n-8", "tok"),
                         gang_size=gang_size)


def test_a_gang_node_of_a_supported_type_joins_its_jobs_cluster_placement_group():
    """p4d in a gang of 2: Placement names the job's group and keeps the zone."""
    params = run_instances_params(gang_request("p4d.24xlarge"), SETTINGS, "")
    assert params["Placement"] == {"AvailabilityZone": "us-east-1b", "GroupName": "runner-j-1"}


def test_a_single_node_or_an_unsupported_type_gets_no_placement_group():
    """One node, or a t3 gang, launches without a GroupName."""
    assert "GroupName" not in run_instances_params(gang_request("p4d.24xlarge", 1), SETTINGS, "")["Placement"]
    assert "GroupName" not in run_instances_params(gang_request("t3.large"), SETTINGS, "")["Placement"]


def test_the_placement_group_is_a_cluster_group_tagged_with_the_job():
    """create_placement_group parameters: cluster strategy, the job's name and tag."""
    params = placement_group_params("j-1")
    assert params["GroupName"] == "runner-j-1" and params["Strategy"] == "cluster"
    assert params["TagSpecifications"][0]["Tags"] == [{"Key": "runner:job", "Value": "j-1"}]
    assert supports_cluster_placement("g5.48xlarge") and not supports_cluster_placement("m5.large")
