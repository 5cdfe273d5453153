"""The AWS provider against moto's EC2 server on loopback, driven by the real boto3.

moto ignores ``ClientToken``, never reclaims a spot instance and never reports capacity, quota or auth
errors; those answers are injected with botocore event hooks on the provider's own client.
"""

from __future__ import annotations

import base64
import uuid

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from structlog.testing import capture_logs

import runner.providers.aws as aws_package
from aws_fixtures import (  # noqa: F401 - pytest fixtures
    KEY_ID,
    OTHER_REGION,
    REGION,
    SECRET,
    ami,
    aws_config,
    count_calls,
    ec2,
    fail,
    instance,
    launch_request,
    moto_endpoint,
    raise_before,
    reclaim_as_spot,
    session,
    tagged,
)
from runner.home import ConfigError
from runner.providers.aws import AWSConfigError
from runner.providers.aws import AWSProvider
from runner.providers.aws.provider import parse_config
from runner.providers.base import NodeStatus, Provider
from runner.providers.catalog import load_catalog
from runner.providers.errors import AuthError, NoCapacityError, PriceTooLowError, ProviderError, QuotaError


@pytest.fixture
def provider(session, ami):
    return AWSProvider(aws_config(ami), session=session)


# --- the package ---------------------------------------------------------------------------------
def test_the_package_exports_the_provider_and_its_config_reader():
    """``runner.providers.aws`` exports exactly the provider, its settings, the config reader and its error."""
    assert sorted(aws_package.__all__) == ["AWSConfigError", "AWSProvider", "AWSSettings", "parse_config"]
    assert issubclass(AWSConfigError, ConfigError)
    assert issubclass(AWSProvider, Provider) and AWSProvider.name == "aws"


# --- configuration -------------------------------------------------------------------------------
@pytest.mark.parametrize("config, named", [
    ({"regions": ["us-east-1"], "image_id": "ami-1", "image": "x"}, "clouds.aws.image: unknown key"),
    ({"image_id": "ami-1"}, "clouds.aws.regions"),
    ({"regions": ["us-east-1", "us-west-2"], "image_id": {"us-east-1": "ami-1"}}, "no image for region us-west-2"),
    ({"regions": ["us-east-1"], "image_id": {"us-east-1": "ami-1", "eu-west-1": "ami-2"}}, "region 'eu-west-1'"),
    ({"regions": ["us-east-1", "us-west-2"], "image_id": "ami-1", "subnet_id": "subnet-1"}, "clouds.aws.subnet_id"),
    ({"regions": ["us-east-1"], "image_id": "ami-1", "security_group_ids": [3]}, "clouds.aws.security_group_ids"),
    ({"regions": ["us-east-1"], "image_id": "ami-1", "refresh_prices": "yes"}, "clouds.aws.refresh_prices"),
    ({"regions": ["us-east-1"], "image_id": "ami-1", "key_name": {"us-east-1": ""}}, "clouds.aws.key_name.us-east-1"),
    ({"regions": ["us-east-1"], "image_id": "ami-1", "checkpoint_url": "my-bucket"}, "clouds.aws.checkpoint_url"),
])
def test_a_config_mistake_is_an_error_naming_the_key(config, named):
    """A wrong ``clouds.aws`` raises AWSConfigError whose message names the key at fault."""
    with pytest.raises(AWSConfigError, match=named.replace(".", r"\.")):
        AWSProvider(config)


def test_checkpoint_url_is_the_default_durable_tier_one_folder_per_job(ami, session):
    """With clouds.aws.checkpoint_url, a job naming no durable_url checkpoints under it; without, there is none."""
    with_bucket = AWSProvider(aws_config(ami, checkpoint_url="s3://team-ckpt/runs/"), session=session)
    assert with_bucket.default_checkpoint_url("tiny-gpt-1a2b3c") == "s3://team-ckpt/runs/tiny-gpt-1a2b3c"
    assert AWSProvider(aws_config(ami), session=session).default_checkpoint_url("tiny-gpt-1a2b3c") is None


def test_one_image_id_serves_every_region_and_mappings_are_per_region():
    """A single value applies to every region; a mapping gives each region its own."""
    settings = parse_config({"regions": ["us-east-1", "us-west-2"], "image_id": "ami-1",
                             "security_group_ids": {"us-west-2": ["sg-2"]}, "key_name": "ops",
                             "iam_instance_profile": "runner-node"})
    east, west = settings.per_region["us-east-1"], settings.per_region["us-west-2"]
    assert (east.image_id, west.image_id) == ("ami-1", "ami-1")
    assert (east.security_group_ids, west.security_group_ids) == ((), ("sg-2",))
    assert east.key_name == west.key_name == "ops" and west.iam_instance_profile == "runner-node"
    assert settings.refresh_prices is True


# --- offers --------------------------------------------------------------------------------------
def test_offers_are_the_catalogs_aws_rows_in_the_configured_regions(session, ami):
    """offers() lists the catalog's AWS offers of the configured regions, and nothing else."""
    provider = AWSProvider(aws_config(ami, regions=[REGION], image_id=ami), session=session)
    expected = [o for o in load_catalog() if o.cloud == "aws" and o.region == REGION]
    assert provider.offers() == expected and expected


def test_live_spot_prices_are_read_once_per_region_and_cached(session, ami):
    """With refresh on, prices come from DescribeSpotPriceHistory once per region, then from the cache."""
    provider = AWSProvider(aws_config(ami, refresh_prices=True), session=session)
    calls = {region: count_calls(provider.client(region), "DescribeSpotPriceHistory")
             for region in (REGION, OTHER_REGION)}
    first = provider.offers()
    assert provider.offers() == first
    assert {region: len(c) for region, c in calls.items()} == {REGION: 1, OTHER_REGION: 1}


def test_refresh_prices_reads_the_spot_price_history_again(session, ami):
    """After refresh_prices() (what `runner offers --refresh` asks for), the next offers() asks AWS again."""
    provider = AWSProvider(aws_config(ami, regions=[REGION], image_id=ami, refresh_prices=True), session=session)
    calls = count_calls(provider.client(REGION), "DescribeSpotPriceHistory")
    provider.offers()
    provider.refresh_prices()
    provider.offers()
    assert len(calls) == 2


def test_a_price_api_failure_keeps_the_catalog_prices_with_a_warning(session, ami):
    """When the spot price history cannot be read, the catalog's prices stay and a warning says why."""
    provider = AWSProvider(aws_config(ami, regions=[REGION], image_id=ami, refresh_prices=True), session=session)
    fail(provider.client(REGION), "DescribeSpotPriceHistory", "UnauthorizedOperation", status=403)
    with capture_logs() as logs:
        offers = provider.offers()
    assert offers == [o for o in load_catalog() if o.cloud == "aws" and o.region == REGION]
    assert any(e["log_level"] == "warning" and "not refreshed" in e["event"] for e in logs)


def test_with_subnets_only_their_zones_are_offered_and_launches_use_them(session, ami, ec2):
    """A configured subnet pins launches to its zone: offers are limited to it and the instance lands in it."""
    subnet = next(s for s in ec2.describe_subnets()["Subnets"] if s["AvailabilityZone"] == "us-east-1b")
    provider = AWSProvider(aws_config(ami, subnet_id={REGION: subnet["SubnetId"]}), session=session)
    east = {o.zone for o in provider.offers() if o.region == REGION}
    assert east == {"us-east-1b"}
    ref = provider.launch(launch_request(zone="us-east-1b"))
    assert instance(ec2, ref)["SubnetId"] == subnet["SubnetId"]


# --- launch --------------------------------------------------------------------------------------
def test_launch_starts_a_one_time_spot_instance_of_the_offers_type_in_its_zone(provider, ec2, ami):
    """A spot launch runs the offer's type in the offer's zone from the configured image, as a spot instance."""
    ref = provider.launch(launch_request(instance_type="g4dn.xlarge", zone="us-east-1c"))
    assert ref.startswith(f"{REGION}:i-")
    started = instance(ec2, ref)
    assert started["InstanceType"] == "g4dn.xlarge" and started["ImageId"] == ami
    assert started["Placement"]["AvailabilityZone"] == "us-east-1c"
    assert started["InstanceLifecycle"] == "spot" and started["State"]["Name"] in ("pending", "running")


def test_an_on_demand_launch_asks_for_no_spot_market(provider, ec2):
    """With ``spot=False`` the instance is an ordinary on-demand one."""
    ref = provider.launch(launch_request(spot=False))
    assert "InstanceLifecycle" not in instance(ec2, ref)


def test_launch_tags_the_instance_with_job_attempt_and_node(provider, ec2):
    """The instance carries ``runner:job``, ``runner:attempt`` and ``runner:node``, and so does its volume."""
    request = launch_request()
    started = instance(ec2, provider.launch(request))
    tags = {t["Key"]: t["Value"] for t in started["Tags"]}
    assert tags["runner:job"] == "j-tiny-gpt" and tags["runner:attempt"] == "3"
    assert tags["runner:node"] == request.node_id
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:runner:node", "Values": [request.node_id]}])["Volumes"]
    assert len(volumes) == 1


def test_launch_passes_the_bootstrap_script_as_user_data_without_aws_credentials(provider, ec2):
    """User data is the node's boot script (controller, node id, its token) and holds no AWS key material."""
    request = launch_request()
    ref = provider.launch(request)
    encoded = ec2.describe_instance_attribute(InstanceId=ref.split(":")[1], Attribute="userData")["UserData"]["Value"]
    script = base64.b64decode(encoded).decode()
    assert script.startswith("#!/bin/bash")
    for expected in ("http://10.0.0.5:8470", request.node_id, "node-token-abc123", "us-east-1a"):
        assert expected in script
    for secret in (KEY_ID, SECRET, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "aws_session_token"):
        assert secret not in script


def test_launch_uses_the_node_id_as_client_token(provider, ec2):
    """``ClientToken`` is the node id, so AWS returns the first instance to a retried launch."""
    request = launch_request()
    assert instance(ec2, provider.launch(request))["ClientToken"] == request.node_id


def test_a_repeated_launch_of_the_same_node_returns_the_first_instance(session, ami, ec2):
    """Launching a node id again (a controller restarted mid-launch) starts no second instance."""
    request = launch_request()
    first = AWSProvider(aws_config(ami), session=session).launch(request)
    again = AWSProvider(aws_config(ami), session=session).launch(request)  # a fresh controller process
    assert again == first
    assert [i["InstanceId"] for i in tagged(ec2, request.node_id)] == [first.split(":")[1]]


def test_launch_passes_key_security_groups_and_instance_profile(session, ami, ec2):
    """The configured key pair, security groups and instance profile reach run_instances."""
    suffix = uuid.uuid4().hex[:8]
    ec2.create_key_pair(KeyName=f"ops-{suffix}")
    group = ec2.create_security_group(GroupName=f"runner-{suffix}", Description="runner nodes")["GroupId"]
    session.client("iam", region_name=REGION).create_instance_profile(InstanceProfileName=f"runner-node-{suffix}")
    provider = AWSProvider(aws_config(ami, key_name=f"ops-{suffix}", security_group_ids={REGION: [group]},
                                      iam_instance_profile=f"runner-node-{suffix}"), session=session)
    started = instance(ec2, provider.launch(launch_request()))
    assert started["KeyName"] == f"ops-{suffix}"
    assert [g["GroupId"] for g in started["SecurityGroups"]] == [group]
    assert started["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/runner-node-{suffix}")


@pytest.mark.parametrize("code, error", [
    ("InsufficientInstanceCapacity", NoCapacityError),
    ("UnfulfillableCapacity", NoCapacityError),
    ("MaxSpotInstanceCountExceeded", QuotaError),
    ("VcpuLimitExceeded", QuotaError),
    ("SpotMaxPriceTooLow", PriceTooLowError),
])
def test_a_refused_launch_raises_the_neutral_error_and_starts_nothing(provider, ec2, code, error):
    """RunInstances refused for capacity, quota or price becomes the neutral error, retryable elsewhere."""
    calls = fail(provider.client(REGION), "RunInstances", code, "There is no Spot capacity available")
    request = launch_request()
    with pytest.raises(error, match=code) as raised:
        provider.launch(request)
    assert raised.value.retryable and len(calls) == 1
    assert tagged(ec2, request.node_id) == []


def test_a_launch_without_permission_raises_auth_error_naming_the_policy(provider):
    """UnauthorizedOperation stops retries and points at the IAM policy in docs/aws.md."""
    fail(provider.client(REGION), "RunInstances", "UnauthorizedOperation", "You are not authorized", status=403)
    with pytest.raises(AuthError, match="docs/aws.md") as raised:
        provider.launch(launch_request())
    assert raised.value.retryable is False


def test_rejected_credentials_raise_auth_error_naming_the_credentials_chain(provider):
    """AuthFailure says to check the AWS credentials chain."""
    fail(provider.client(REGION), "DescribeInstances", "AuthFailure", "AWS was not able to validate", status=401)
    with pytest.raises(AuthError, match="credentials chain"):
        provider.launch(launch_request())


def test_no_credentials_at_all_raise_auth_error(ami, monkeypatch):
    """With no credentials anywhere, botocore's NoCredentialsError becomes an AuthError."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    provider = AWSProvider(aws_config(ami), session=boto3.Session())
    with pytest.raises(AuthError, match="no usable credentials"):
        provider.launch(launch_request())


# --- describe ------------------------------------------------------------------------------------
def test_a_running_node_is_alive(provider):
    """A freshly launched instance is alive."""
    request = launch_request()
    assert provider.describe(request.node_id, provider.launch(request)) == NodeStatus(alive=True)


def test_an_instance_terminated_behind_our_back_is_gone_as_terminated(provider, ec2):
    """An instance someone else terminated is reported gone, reason "terminated"."""
    request = launch_request()
    ref = provider.launch(request)
    ec2.terminate_instances(InstanceIds=[ref.split(":")[1]])
    assert provider.describe(request.node_id, ref) == NodeStatus(alive=False, reason="terminated")


def test_a_spot_reclaim_is_reported_as_preempted(provider, ec2):
    """An instance ended with ``Server.SpotInstanceTermination`` is gone, reason "preempted"."""
    request = launch_request()
    ref = provider.launch(request)
    instance_id = ref.split(":")[1]
    ec2.terminate_instances(InstanceIds=[instance_id])  # the spot market takes it back
    reclaim_as_spot(provider.client(REGION), instance_id)
    assert provider.describe(request.node_id, ref) == NodeStatus(alive=False, reason="preempted")


def test_an_unknown_instance_is_not_found(provider):
    """An instance id the API does not know (long terminated) is gone, reason "not-found"."""
    status = provider.describe("n-old", f"{REGION}:i-0123456789abcdef0")
    assert status == NodeStatus(alive=False, reason="not-found")


def test_a_just_launched_instance_the_api_cannot_see_yet_stays_alive(provider):
    """DescribeInstances lags behind RunInstances: "not found" right after our own launch is not a loss."""
    request = launch_request()
    ref = provider.launch(request)
    fail(provider.client(REGION), "DescribeInstances", "InvalidInstanceID.NotFound", "does not exist")
    assert provider.describe(request.node_id, ref) == NodeStatus(alive=True)


@pytest.mark.parametrize("code", ["RequestLimitExceeded", "InternalError", "ServiceUnavailable"])
def test_an_api_error_while_describing_raises_instead_of_reporting_the_node_gone(provider, code):
    """A throttled or failing DescribeInstances raises a retryable ProviderError, never alive=False."""
    request = launch_request()
    ref = provider.launch(request)
    fail(provider.client(REGION), "DescribeInstances", code, "try again", status=503)
    with pytest.raises(ProviderError, match=code) as raised:
        provider.describe(request.node_id, ref)
    assert type(raised.value) is ProviderError and raised.value.retryable


def test_an_unreachable_api_raises_instead_of_reporting_the_node_gone(provider):
    """A connection failure while describing raises ProviderError."""
    raise_before(provider.client(REGION), "DescribeInstances", EndpointConnectionError(endpoint_url="http://ec2"))
    with pytest.raises(ProviderError, match="Could not connect"):
        provider.describe("n-1", f"{REGION}:i-0123456789abcdef0")


def test_describe_without_a_ref_finds_the_node_by_its_tag(provider):
    """With no ref recorded, describe looks the node up by its ``runner:node`` tag in every region."""
    request = launch_request()
    provider.launch(request)
    assert provider.describe(request.node_id, None) == NodeStatus(alive=True)
    assert provider.describe("n-never-launched", None) == NodeStatus(alive=False, reason="not-found")


def test_a_malformed_ref_is_a_provider_error_that_is_not_retried(provider):
    """A ref that is not ``REGION:i-...`` raises a non-retryable ProviderError."""
    with pytest.raises(ProviderError, match="REGION:i-") as raised:
        provider.describe("n-1", "i-0123456789abcdef0")
    assert raised.value.retryable is False


# --- terminate -----------------------------------------------------------------------------------
def test_terminate_ends_the_instance_and_may_be_repeated(provider, ec2):
    """terminate() ends the instance; a second call is not an error."""
    request = launch_request()
    ref = provider.launch(request)
    provider.terminate(request.node_id, ref)
    assert instance(ec2, ref)["State"]["Name"] in ("shutting-down", "terminated")
    provider.terminate(request.node_id, ref)
    assert provider.describe(request.node_id, ref).alive is False


def test_terminate_of_an_unknown_instance_is_not_an_error(provider):
    """Terminating an instance the API no longer knows succeeds quietly."""
    provider.terminate("n-old", f"{REGION}:i-0123456789abcdef0")


def test_terminate_without_a_ref_finds_the_node_by_its_tag(provider, ec2):
    """With no ref (the launch answer was lost), terminate finds the node's instance by tag and ends it."""
    request = launch_request()
    ref = provider.launch(request)
    provider.terminate(request.node_id, None)
    assert instance(ec2, ref)["State"]["Name"] in ("shutting-down", "terminated")
    provider.terminate("n-never-launched", None)


def test_terminate_reports_an_api_error(provider):
    """A failing TerminateInstances raises, so the node is released again on the next tick."""
    fail(provider.client(REGION), "TerminateInstances", "RequestLimitExceeded", status=503)
    with pytest.raises(ProviderError, match="RequestLimitExceeded"):
        provider.terminate("n-1", f"{REGION}:i-0123456789abcdef0")
