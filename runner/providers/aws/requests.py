"""Pure builders and readers of EC2 API shapes: no client, no network, tested without the SDK.

The provider calls these to build ``run_instances`` parameters and tag filters, and to read
``describe_instances`` answers into a :class:`NodeStatus`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import LaunchRequest, NodeStatus

TAG_JOB = "runner:job"
TAG_ATTEMPT = "runner:attempt"
TAG_NODE = "runner:node"

ALIVE_STATES = frozenset({"pending", "running"})
# StateReason codes of an instance that the spot market took back (terminate, or stop/hibernate).
SPOT_REASONS = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})
LIVE_FIRST = {"running": 0, "pending": 1, "stopping": 2, "stopped": 3, "shutting-down": 4, "terminated": 5}


@dataclass(frozen=True)
class RegionSettings:
    """What every launch in one region uses, resolved from ``clouds.aws`` of config.yaml."""

    region: str
    image_id: str
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    iam_instance_profile: str | None = None  # a name, or an ARN


def format_ref(region: str, instance_id: str) -> str:
    """The provider ref stored for a node: ``REGION:INSTANCE_ID``."""
    return f"{region}:{instance_id}"


def parse_ref(ref: str) -> tuple[str, str]:
    """``(region, instance_id)`` of a ref made by :func:`format_ref`; ValueError for anything else."""
    region, sep, instance_id = (ref or "").partition(":")
    if not sep or not region or not instance_id.startswith("i-"):
        raise ValueError(f"not an AWS node ref: {ref!r} (expected REGION:i-...)")
    return region, instance_id


def node_tags(request: LaunchRequest) -> list[dict]:
    """The tags naming a node's job, attempt and node id (plus a readable Name for the console)."""
    return [
        {"Key": "Name", "Value": f"runner-{request.node_id}"},
        {"Key": TAG_JOB, "Value": request.job_id},
        {"Key": TAG_ATTEMPT, "Value": str(request.attempt)},
        {"Key": TAG_NODE, "Value": request.node_id},
    ]


def node_filters(node_id: str) -> list[dict]:
    """``describe_instances`` filters that find the instance(s) launched for ``node_id``."""
    return [{"Name": f"tag:{TAG_NODE}", "Values": [node_id]}]


def instance_profile(value: str) -> dict:
    """``IamInstanceProfile`` for a profile given by name or by ARN."""
    return {"Arn": value} if value.startswith("arn:") else {"Name": value}


# Instance families that a cluster placement group packs onto one low-latency network segment (EFA and
# high-bandwidth types; burstable and most small types cannot join one).
CLUSTER_PLACEMENT_FAMILIES = frozenset({
    "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "g4dn", "g5", "g6", "g6e", "trn1", "trn1n", "trn2",
    "inf2", "dl1", "c5n", "c6in", "c7gn", "hpc6a", "hpc7g",
})


def supports_cluster_placement(instance_type: str) -> bool:
    """Whether an instance type can launch into a cluster placement group."""
    return instance_type.split(".")[0] in CLUSTER_PLACEMENT_FAMILIES


def placement_group_name(job_id: str) -> str:
    """One cluster placement group per job (every attempt's gang joins it; it costs nothing)."""
    return f"runner-{job_id}"


def placement_group_params(job_id: str) -> dict:
    """Keyword arguments of ``ec2.create_placement_group`` for a job's gang."""
    return {"GroupName": placement_group_name(job_id), "Strategy": "cluster",
            "TagSpecifications": [{"ResourceType": "placement-group", "Tags": [{"Key": TAG_JOB, "Value": job_id}]}]}


def gang_placement_group(request: LaunchRequest) -> str | None:
    """The placement group a node launches into: its job's, for a gang of a type that supports one."""
    if request.gang_size > 1 and supports_cluster_placement(request.offer.instance_type):
        return placement_group_name(request.job_id)
    return None


def run_instances_params(request: LaunchRequest, settings: RegionSettings, user_data: str,
                         subnet_id: str | None = None) -> dict:
    """Keyword arguments of ``ec2.run_instances`` for one node.

    ``ClientToken`` is the node id, so AWS itself makes a retried launch return the first instance.
    With a subnet, the subnet picks the zone (it lives in exactly one); without, the offer's zone does.
    """
    offer = request.offer
    params: dict = {
        "ImageId": settings.image_id,
        "InstanceType": offer.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": request.node_id,
        "UserData": user_data,
        "InstanceInitiatedShutdownBehavior": "terminate",  # a node that powers off costs nothing more
        # IMDSv2 only; hop limit 2 lets the agent in a container reach the metadata service.
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"},
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": node_tags(request)},
            {"ResourceType": "volume", "Tags": node_tags(request)},
        ],
    }
    if subnet_id:
        params["SubnetId"] = subnet_id
    else:
        params["Placement"] = {"AvailabilityZone": offer.zone}
    group = gang_placement_group(request)
    if group:  # a gang: every node of the job in one cluster placement group (all in the offer's zone)
        params["Placement"] = {**params.get("Placement", {}), "GroupName": group}
    if request.spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    if settings.security_group_ids:
        params["SecurityGroupIds"] = list(settings.security_group_ids)
    if settings.key_name:
        params["KeyName"] = settings.key_name
    if settings.iam_instance_profile:
        params["IamInstanceProfile"] = instance_profile(settings.iam_instance_profile)
    return params


def instances_in(response: dict) -> list[dict]:
    """Every instance in a ``describe_instances`` (or ``run_instances``) answer."""
    if "Instances" in response and "Reservations" not in response:
        return list(response["Instances"])
    return [instance for reservation in response.get("Reservations", []) for instance in reservation["Instances"]]


def pick_instance(instances: list[dict]) -> dict | None:
    """The instance that stands for a node when several carry its tag: the liveliest, then the oldest."""
    if not instances:
        return None
    return min(instances, key=lambda i: (LIVE_FIRST.get(i.get("State", {}).get("Name"), 9),
                                         str(i.get("LaunchTime", "")), i.get("InstanceId", "")))


def node_status(instance: dict | None) -> NodeStatus:
    """What one ``describe_instances`` entry says about the node: alive, preempted, or gone."""
    if instance is None:
        return NodeStatus(alive=False, reason="not-found")
    state = instance.get("State", {}).get("Name")
    if state in ALIVE_STATES:
        return NodeStatus(alive=True)
    if (instance.get("StateReason") or {}).get("Code") in SPOT_REASONS:
        return NodeStatus(alive=False, reason="preempted")
    return NodeStatus(alive=False, reason="terminated")

