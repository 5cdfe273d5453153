"""The EC2 proxy that stands in front of moto: boto3 sees its injected errors as EC2's own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from aws_fixtures import REGION, ami, moto_endpoint, session  # noqa: F401
from botocore.config import Config
from botocore.exceptions import ClientError

FAKES = Path(__file__).resolve().parents[2] / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

from ec2_proxy import EC2Proxy  # noqa: E402


@pytest.fixture
def proxy(moto_endpoint):
    with EC2Proxy(moto_endpoint) as running:
        yield running


def _client(session, proxy, attempts: int = 1):
    return session.client("ec2", region_name=REGION, endpoint_url=proxy.url,
                          config=Config(retries={"mode": "standard", "total_max_attempts": attempts}))


def _launch(ec2, ami, zone: str) -> dict:
    return ec2.run_instances(ImageId=ami, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
                             Placement={"AvailabilityZone": zone})["Instances"][0]


def test_a_refused_zone_answers_insufficient_capacity_as_a_server_error_that_botocore_retries(proxy, session, ami):
    """A launch in a refused zone raises ClientError InsufficientInstanceCapacity, HTTP 500, after botocore's retry."""
    proxy.refuse("InsufficientInstanceCapacity", zones={"us-east-1b"})
    with pytest.raises(ClientError) as caught:
        _launch(_client(session, proxy, attempts=2), ami, "us-east-1b")
    answer = caught.value.response
    assert answer["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert "g4dn.xlarge capacity" in answer["Error"]["Message"] and "(us-east-1b)" in answer["Error"]["Message"]
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert answer["ResponseMetadata"]["RetryAttempts"] == 1 and len(proxy.refusals) == 2


def test_launches_in_other_zones_and_other_calls_pass_through_to_moto(proxy, session, ami):
    """With one zone refused, a launch in another zone succeeds and moto describes it through the proxy."""
    proxy.refuse("InsufficientInstanceCapacity", zones={"us-east-1b"})
    ec2 = _client(session, proxy)
    launched = _launch(ec2, ami, "us-east-1a")
    (seen,) = [i for r in ec2.describe_instances(InstanceIds=[launched["InstanceId"]])["Reservations"]
               for i in r["Instances"]]
    assert seen["Placement"]["AvailabilityZone"] == "us-east-1a" and not proxy.refusals


def test_an_authorization_error_is_a_403_that_is_not_retried(proxy, session, ami):
    """UnauthorizedOperation, refused in every zone, arrives once as a 403 ClientError."""
    proxy.refuse("UnauthorizedOperation")
    with pytest.raises(ClientError) as caught:
        _launch(_client(session, proxy, attempts=3), ami, "us-east-1c")
    assert caught.value.response["Error"]["Code"] == "UnauthorizedOperation"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert len(proxy.refusals) == 1


def test_a_reclaimed_instance_is_described_with_the_spot_interruption_reason(proxy, session, ami):
    """After reclaim_as_spot, DescribeInstances reports Server.SpotInstanceTermination for that instance only."""
    ec2 = _client(session, proxy)
    reclaimed, other = _launch(ec2, ami, "us-east-1a")["InstanceId"], _launch(ec2, ami, "us-east-1a")["InstanceId"]
    proxy.reclaim_as_spot(reclaimed)
    ec2.terminate_instances(InstanceIds=[reclaimed, other])
    answer = ec2.describe_instances(InstanceIds=[reclaimed, other])
    reasons = {i["InstanceId"]: i["StateReason"]["Code"] for r in answer["Reservations"] for i in r["Instances"]}
    assert reasons == {reclaimed: "Server.SpotInstanceTermination", other: "Client.UserInitiatedShutdown"}
