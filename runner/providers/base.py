"""The provider interface: a handful of methods every cloud implements the same way."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from .offers import Offer


@dataclass(frozen=True)
class NodeBootstrap:
    """What a new node needs to find the controller: never cloud credentials."""

    controller_url: str
    node_id: str
    token: str


@dataclass(frozen=True)
class LaunchRequest:
    node_id: str
    job_id: str
    attempt: int
    offer: Offer
    spot: bool
    bootstrap: NodeBootstrap
    gang_size: int = 1  # the job's num_nodes: a node of a gang asks for close placement where the cloud has it


@dataclass(frozen=True)
class NodeStatus:
    """What the provider's API says about a node: ``alive`` or gone, and why when it knows."""

    alive: bool
    reason: str | None = None  # e.g. "preempted", "terminated", "not-found"


class Provider(ABC):
    """Launch, describe and terminate nodes. ``launch`` and ``terminate`` are idempotent."""

    name: str
    describe_interval: float = 10.0  # seconds between describes of one node (cloud APIs are rate-limited)

    @abstractmethod
    def offers(self) -> list[Offer]:
        """Every offer this provider can launch, with current prices."""

    # Gangs (resources.num_nodes > 1) run in one zone. A cloud's zone has no capacity we can read, so a
    # cloud caps a gang's size (its launches then find out what the zone has); the local market has a
    # real per-zone capacity (clouds.local.zone_capacity).
    max_gang_nodes: int = 64
    RENDEZVOUS_PORTS = range(29500, 30000)  # where a cloud gang's rendezvous listens (open them node to node)

    def gang_capacity(self) -> int:
        """The most nodes one gang can hold in one zone of this provider."""
        return self.max_gang_nodes

    def free_slots(self, zone: str, live_here: int) -> int:
        """How many more nodes ``zone`` takes now, given ``live_here`` live nodes of ours there."""
        return self.max_gang_nodes

    def rendezvous_port(self, previous: int | None = None) -> int:
        """A port for node 0's rendezvous, different from the previous attempt's (a dying one may hold it)."""
        import random

        choices = [p for p in self.RENDEZVOUS_PORTS if p != previous]
        return random.choice(choices)

    # clouds.NAME.checkpoint_url: where jobs that name no checkpoint.durable_url keep their checkpoints
    checkpoint_url: str | None = None

    def default_checkpoint_url(self, job_id: str) -> str | None:
        """The durable URL for a job that names none; None when this provider has no default (a cloud node's
        disk goes with the node, so a cloud needs a bucket)."""
        return f"{self.checkpoint_url.rstrip('/')}/{job_id}" if self.checkpoint_url else None

    def refresh_prices(self) -> None:
        """Forget cached prices so the next ``offers()`` reads them live (a no-op without live prices)."""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> str:
        """Start a node (or find the one already started for ``request.node_id``); return its ref."""

    @abstractmethod
    def describe(self, node_id: str, provider_ref: str | None) -> NodeStatus:
        """Whether the node still exists, according to the provider's own API."""

    @abstractmethod
    def terminate(self, node_id: str, provider_ref: str | None) -> None:
        """Release the node; no error if it is already gone."""

    # A provider whose describes cost nothing (a local check) or that has a batch API is asked about all its
    # due nodes in one call (``describe_many``); a cloud is asked node by node, so one hung describe holds
    # up no other node's.
    describes_in_batch: bool = False

    def describe_many(self, nodes: list[tuple[str, str | None]]) -> dict[str, NodeStatus]:
        """``describe`` of each (node id, provider ref), by node id."""
        return {node_id: self.describe(node_id, ref) for node_id, ref in nodes}
