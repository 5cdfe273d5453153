"""The AWS provider: EC2 spot and on-demand nodes in the regions listed under ``clouds.aws``.

Every node carries the tags ``runner:job``, ``runner:attempt`` and ``runner:node``, and is launched
with ``ClientToken=node_id``: a launch retried after a controller crash finds the first instance by
its tag (or AWS returns it for the token) instead of starting a second one. The provider ref stored
for a node is ``REGION:INSTANCE_ID``. Only an answer from the EC2 API can make a node gone: an API
error is raised as a :class:`ProviderError`, never reported as a lost node.
"""

from __future__ import annotations

import threading
import time

import boto3
import structlog
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ... import __version__
from ..base import CheckpointBucket, CloudGangs, LaunchRequest, NodeStatus, Provider
from ..bootstrap import render_bootstrap
from ..catalog import load_catalog
from ..errors import ProviderError
from ..offers import Offer
from .config import AWSSettings, parse_config
from .errors import is_not_found, no_sdk_retry_of_no_capacity, translate, translated
from .prices import refresh_spot_prices
from .requests import (
    format_ref,
    instances_in,
    node_filters,
    node_status,
    parse_ref,
    pick_instance,
    placement_group_name,
    placement_group_params,
    run_instances_params,
)

log = structlog.get_logger(__name__)

PRICE_TTL_SECONDS = 300.0  # live spot prices are reused this long
# DescribeInstances is eventually consistent: a just-launched instance may be "not found" for a while.
NOT_FOUND_GRACE_SECONDS = 180.0
CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=5, read_timeout=60,
                       user_agent_extra=f"runner/{__version__}")


class AWSProvider(Provider, CloudGangs, CheckpointBucket):
    """EC2 nodes launched from the AWS rows of the offer catalog, with live spot prices."""

    name = "aws"

    def __init__(self, config: dict, *, session=None):
        self.settings = parse_config(config)
        self.checkpoint_url = self.settings.checkpoint_url
        self.session = session or boto3.Session()
        self._clients: dict[str, object] = {}
        self._subnet_zones: dict[str, dict[str, str]] = {}
        self._offers: tuple[float, list[Offer]] | None = None
        self._launched: dict[str, float] = {}  # ref -> when this process launched it
        self._lock = threading.Lock()
        covered = {o.region for o in load_catalog() if o.cloud == "aws"}
        for region in self.settings.regions:
            if region not in covered:
                log.warning("the offer catalog has no AWS offers in this region; nothing will launch there",
                            region=region, catalog_regions=sorted(covered))

    def client(self, region: str):
        """The EC2 client for ``region`` (one per region, shared; botocore clients are thread-safe)."""
        with self._lock:
            if region not in self._clients:
                client = self.session.client("ec2", region_name=region, config=CLIENT_CONFIG)
                client.meta.events.register("needs-retry.ec2.RunInstances", no_sdk_retry_of_no_capacity)
                self._clients[region] = client
            return self._clients[region]

    # --- offers -----------------------------------------------------------
    def offers(self) -> list[Offer]:
        with self._lock:
            cached = self._offers
        if cached and time.monotonic() - cached[0] < PRICE_TTL_SECONDS:
            return list(cached[1])
        catalog = load_catalog()
        offers: list[Offer] = []
        for region in self.settings.regions:
            rows = [o for o in catalog if o.cloud == "aws" and o.region == region]
            if rows and self.settings.refresh_prices:
                rows = refresh_spot_prices(self.client(region), rows)  # keeps the catalog's prices on failure
            zones = self._launchable_zones(region)
            offers.extend(o for o in rows if zones is None or o.zone in zones)
        with self._lock:
            self._offers = (time.monotonic(), offers)
        return list(offers)

    def refresh_prices(self) -> None:
        with self._lock:
            self._offers = None

    def _launchable_zones(self, region: str) -> set[str] | None:
        """The zones of the configured subnets, or None (every zone) when no subnet is configured."""
        if not self.settings.per_region[region].subnet_ids:
            return None
        try:
            return set(self._subnets_by_zone(region))
        except ProviderError as exc:
            log.warning("cannot read the configured subnets; no offers in this region", region=region,
                        error=str(exc))
            return set()

    def _subnets_by_zone(self, region: str) -> dict[str, str]:
        """{zone: subnet id} of the subnets configured for ``region``, read once from the API."""
        with self._lock:
            known = self._subnet_zones.get(region)
        if known is not None:
            return known
        subnet_ids = list(self.settings.per_region[region].subnet_ids)
        with translated(f"describe subnets {', '.join(subnet_ids)} in {region}"):
            found = self.client(region).describe_subnets(SubnetIds=subnet_ids)["Subnets"]
        by_zone: dict[str, str] = {}
        for subnet_id in subnet_ids:  # the first configured subnet of a zone wins
            for subnet in found:
                if subnet["SubnetId"] == subnet_id:
                    by_zone.setdefault(subnet["AvailabilityZone"], subnet_id)
        with self._lock:
            self._subnet_zones[region] = by_zone
        return by_zone

    # --- launch -----------------------------------------------------------
    def launch(self, request: LaunchRequest) -> str:
        offer = request.offer
        settings = self.settings.per_region.get(offer.region)
        if offer.cloud != "aws" or settings is None:
            raise ProviderError(f"offer {offer.cloud} {offer.region} is not in clouds.aws.regions "
                                f"({', '.join(self.settings.regions)})")
        client = self.client(offer.region)
        action = f"launch {offer.instance_type} in {offer.zone}"
        with translated(action):
            existing = self._find(client, request.node_id)
            if existing is not None:
                ref = format_ref(offer.region, existing["InstanceId"])
                log.info("node already launched", node=request.node_id, ref=ref, state=existing["State"]["Name"])
                return ref
        subnet_id = None
        if settings.subnet_ids:
            subnet_id = self._subnets_by_zone(offer.region).get(offer.zone)
            if subnet_id is None:
                raise ProviderError(f"AWS {action}: no subnet of clouds.aws.subnet_id is in {offer.zone}")
        user_data = render_bootstrap(request.bootstrap, cloud="aws", zone=offer.zone,
                                     package=self.settings.agent_package)
        params = run_instances_params(request, settings, user_data, subnet_id)
        if "GroupName" in params.get("Placement", {}):
            self._ensure_placement_group(client, request.job_id, action)
        with translated(action):
            instance = instances_in(client.run_instances(**params))[0]
        ref = format_ref(offer.region, instance["InstanceId"])
        with self._lock:
            self._launched[ref] = time.monotonic()
        log.info("node launched", node=request.node_id, ref=ref, zone=offer.zone, type=offer.instance_type,
                 spot=request.spot)
        return ref

    def _ensure_placement_group(self, client, job_id: str, action: str) -> None:
        """Create the job's cluster placement group unless it exists (one per job, kept across attempts)."""
        from botocore.exceptions import ClientError

        try:
            client.create_placement_group(**placement_group_params(job_id))
            log.info("placement group created", job=job_id, group=placement_group_name(job_id))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidPlacementGroup.Duplicate":
                raise translate(exc, f"{action} (creating placement group {placement_group_name(job_id)})") from exc

    def _find(self, client, node_id: str) -> dict | None:
        """The instance already launched for ``node_id`` in the client's region, if any."""
        pages = client.get_paginator("describe_instances").paginate(Filters=node_filters(node_id))
        return pick_instance([i for page in pages for i in instances_in(page)])

    # --- describe ---------------------------------------------------------
    def describe(self, node_id: str, provider_ref: str | None) -> NodeStatus:
        if provider_ref is None:
            found = []
            for region in self.settings.regions:
                with translated(f"find node {node_id} in {region}"):
                    instance = self._find(self.client(region), node_id)
                if instance is not None:
                    found.append(instance)
            return node_status(pick_instance(found))
        region, instance_id = _parse(provider_ref)
        try:
            answer = self.client(region).describe_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if not is_not_found(exc):
                raise translate(exc, f"describe {provider_ref}") from exc
            answer = {}
        except BotoCoreError as exc:
            raise translate(exc, f"describe {provider_ref}") from exc
        instance = pick_instance(instances_in(answer))
        if instance is None and self._recently_launched(provider_ref):
            return NodeStatus(alive=True)  # launched moments ago; the API has not caught up yet
        return node_status(instance)

    def _recently_launched(self, ref: str) -> bool:
        with self._lock:
            launched = self._launched.get(ref)
        return launched is not None and time.monotonic() - launched < NOT_FOUND_GRACE_SECONDS

    # --- terminate --------------------------------------------------------
    def terminate(self, node_id: str, provider_ref: str | None) -> None:
        if provider_ref is not None:
            targets = [_parse(provider_ref)]
        else:
            targets = []
            for region in self.settings.regions:
                with translated(f"find node {node_id} in {region}"):
                    pages = self.client(region).get_paginator("describe_instances").paginate(
                        Filters=node_filters(node_id))
                    targets += [(region, i["InstanceId"]) for page in pages for i in instances_in(page)
                                if i["State"]["Name"] != "terminated"]
        for region, instance_id in targets:
            try:
                self.client(region).terminate_instances(InstanceIds=[instance_id])
            except ClientError as exc:
                if not is_not_found(exc):
                    raise translate(exc, f"terminate {region}:{instance_id}") from exc
            except BotoCoreError as exc:
                raise translate(exc, f"terminate {region}:{instance_id}") from exc
            log.info("node terminated", node=node_id, ref=format_ref(region, instance_id))


def _parse(ref: str) -> tuple[str, str]:
    try:
        return parse_ref(ref)
    except ValueError as exc:
        error = ProviderError(str(exc))
        error.retryable = False
        raise error from None
