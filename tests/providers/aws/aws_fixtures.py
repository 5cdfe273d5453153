"""Fixtures, imported by the tests here: moto's EC2 server on loopback, a hermetic AWS environment, hooks.

The provider talks to moto with the real boto3 through ``AWS_ENDPOINT_URL``. What moto cannot do
(capacity, quota and auth errors, spot reclaims) is injected with botocore's public event hooks on the
provider's own client, so every other part of the call stays real.
"""

from __future__ import annotations

import os
import uuid

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from moto.server import ThreadedMotoServer

from runner.providers.base import LaunchRequest, NodeBootstrap
from runner.providers.catalog import load_catalog

REGION = "us-east-1"
OTHER_REGION = "us-west-2"
# Fake credentials, distinctive enough to search the user data for them.
KEY_ID = "AKIARUNNERTESTKEY123"
SECRET = "runner-test-secret-0123456789abcdefghijkl"


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory):
    """moto's server on 127.0.0.1, with this module's process environment pointed at it."""
    empty = tmp_path_factory.mktemp("aws-config") / "absent"
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("AWS_")]:
            env.delenv(name)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        env.setenv("AWS_ENDPOINT_URL", url)  # EC2 and IAM both reach moto
        env.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
        env.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        env.setenv("AWS_CONFIG_FILE", str(empty))
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        try:
            yield url
        finally:
            server.stop()


@pytest.fixture(scope="module")
def session(moto_endpoint):
    """One boto3 session for the module: its clients share the loaded EC2 model."""
    return boto3.Session()


@pytest.fixture(scope="module")
def ami(session) -> str:
    """An AMI id that moto knows in both test regions."""
    images = session.client("ec2", region_name=REGION).describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}])["Images"]
    return sorted(image["ImageId"] for image in images)[0]


@pytest.fixture
def ec2(session):
    """A plain EC2 client of the test, standing for the AWS console or the spot market."""
    return session.client("ec2", region_name=REGION)


def aws_config(ami: str, **extra) -> dict:
    """A ``clouds.aws`` mapping for two regions, without live price refresh unless asked."""
    return {"regions": [REGION, OTHER_REGION], "image_id": {REGION: ami, OTHER_REGION: ami},
            "refresh_prices": False, **extra}


def offer(instance_type: str = "g4dn.xlarge", zone: str = "us-east-1a"):
    """The catalog's offer of ``instance_type`` in ``zone``."""
    return next(o for o in load_catalog() if o.cloud == "aws" and o.zone == zone and o.instance_type == instance_type)


def launch_request(spot: bool = True, node_id: str | None = None, **offer_args) -> LaunchRequest:
    """A launch request for a new node with a fresh id."""
    node_id = node_id or f"n-{uuid.uuid4().hex[:12]}"
    return LaunchRequest(node_id=node_id, job_id="j-tiny-gpt", attempt=3, offer=offer(**offer_args), spot=spot,
                         bootstrap=NodeBootstrap("http://10.0.0.5:8470", node_id, "node-token-abc123"))


def instance(ec2, ref: str) -> dict:
    """The instance behind a provider ref, as describe_instances reports it."""
    return ec2.describe_instances(InstanceIds=[ref.split(":", 1)[1]])["Reservations"][0]["Instances"][0]


def tagged(ec2, node_id: str) -> list[dict]:
    """Every instance carrying the node's ``runner:node`` tag."""
    answer = ec2.describe_instances(Filters=[{"Name": "tag:runner:node", "Values": [node_id]}])
    return [i for r in answer["Reservations"] for i in r["Instances"]]


def fail(client, operation: str, code: str, message: str = "injected", status: int = 400, times: int | None = None):
    """Make ``client`` answer ``operation`` with an AWS error, as the real API would (botocore raises it).

    ``times`` limits how many calls fail; the returned list records each failed call's parameters.
    """
    calls: list[dict] = []

    def answer(params, **_):
        if times is not None and len(calls) >= times:
            return None
        calls.append(params)
        http = AWSResponse(params.get("url", ""), status, {}, None)
        return http, {"Error": {"Code": code, "Message": message},
                      "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "injected"}}

    client.meta.events.register(f"before-call.ec2.{operation}", answer)
    return calls


def raise_before(client, operation: str, exc: Exception) -> None:
    """Make ``client`` raise ``exc`` (e.g. a connection error) instead of sending ``operation``."""
    def boom(**_):
        raise exc

    client.meta.events.register(f"before-call.ec2.{operation}", boom)


def reclaim_as_spot(client, instance_id: str) -> None:
    """Make ``client`` see ``instance_id`` with the state reason of a spot reclaim (moto cannot set it)."""
    def rewrite(parsed, **_):
        for reservation in parsed.get("Reservations", []):
            for entry in reservation["Instances"]:
                if entry["InstanceId"] == instance_id:
                    entry["StateReason"] = {"Code": "Server.SpotInstanceTermination",
                                            "Message": "Server.SpotInstanceTermination: Spot instance termination"}

    client.meta.events.register("after-call.ec2.DescribeInstances", rewrite)


def count_calls(client, operation: str) -> list[dict]:
    """A list that records the parameters of each ``operation`` that ``client`` sends."""
    calls: list[dict] = []
    client.meta.events.register(f"provide-client-params.ec2.{operation}", lambda params, **_: calls.append(params))
    return calls

