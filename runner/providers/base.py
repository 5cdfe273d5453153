"""The provider interface: a handful of methods every cloud implements the same way."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
    """Launch, describe and terminate nodes. ``launch`` and ``terminate`` are idempotent.

    What a provider can do beyond that it says by type: it implements the capabilities below that it has
    (``isinstance(provider, InjectsNotices)``), and callers ask through the functions at the end of this module
    where a provider without the capability has a defined answer."""

    name: str
    describe_interval: float = 10.0  # seconds between describes of one node (cloud APIs are rate-limited)

    @abstractmethod
    def offers(self) -> list[Offer]:
        """Every offer this provider can launch, with current prices."""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> str:
        """Start a node (or find the one already started for ``request.node_id``); return its ref."""

    @abstractmethod
    def describe(self, node_id: str, provider_ref: str | None) -> NodeStatus:
        """Whether the node still exists, according to the provider's own API."""

    @abstractmethod
    def terminate(self, node_id: str, provider_ref: str | None) -> None:
        """Release the node; no error if it is already gone."""


# --- capabilities ----------------------------------------------------------------------------------------------

class DescribesInBatch:
    """Describes cost nothing (a local check) or the provider has a batch API: all its due nodes are asked about
    in one call. A provider without this is asked node by node, so one hung describe holds up no other node's."""

    def describe_many(self, nodes: list[tuple[str, str | None]]) -> dict[str, NodeStatus]:
        """``describe`` of each (node id, provider ref), by node id."""
        return {node_id: self.describe(node_id, ref) for node_id, ref in nodes}  # type: ignore[attr-defined]


class HoldsGangs(ABC):
    """Runs gangs (resources.num_nodes > 1) in one zone: says how many nodes a zone holds and where node 0's
    rendezvous listens."""

    @abstractmethod
    def gang_capacity(self) -> int:
        """The most nodes one gang can hold in one zone of this provider."""

    @abstractmethod
    def free_slots(self, zone: str, live_here: int) -> int:
        """How many more nodes ``zone`` takes now, given ``live_here`` live nodes of ours there."""

    @abstractmethod
    def rendezvous_port(self, previous: int | None = None) -> int:
        """A port for node 0's rendezvous, different from the previous attempt's (a dying one may hold it)."""


class CloudGangs(HoldsGangs):
    """A cloud's zone has no capacity we can read, so a cloud caps a gang's size (its launches then find out what
    the zone has); node 0's rendezvous listens on a port of a fixed range (open it node to node)."""

    MAX_GANG_NODES = 64
    RENDEZVOUS_PORTS = range(29500, 30000)

    def gang_capacity(self) -> int:
        return self.MAX_GANG_NODES

    def free_slots(self, zone: str, live_here: int) -> int:
        return self.MAX_GANG_NODES

    def rendezvous_port(self, previous: int | None = None) -> int:
        import random

        return random.choice([p for p in self.RENDEZVOUS_PORTS if p != previous])


class DefaultCheckpoints(ABC):
    """Has a durable URL for the checkpoints of a job whose file names no ``checkpoint.durable_url``."""

    @abstractmethod
    def default_checkpoint_url(self, job_id: str) -> str | None:
        """The job's durable URL; None when none is configured."""


class CheckpointBucket(DefaultCheckpoints):
    """The default is a bucket named in the configuration (``clouds.NAME.checkpoint_url``): a cloud node's disk
    goes with the node, so without one a job must name its own."""

    checkpoint_url: str | None = None

    def default_checkpoint_url(self, job_id: str) -> str | None:
        return f"{self.checkpoint_url.rstrip('/')}/{job_id}" if self.checkpoint_url else None


@runtime_checkable
class RefreshesPrices(Protocol):
    """Reads prices live: ``refresh_prices`` forgets the cached ones so the next ``offers()`` reads them again."""

    def refresh_prices(self) -> None: ...


@runtime_checkable
class InjectsNotices(Protocol):
    """Chaos (the simulated market): a preemption notice or an AWS rebalance recommendation through a node's
    metadata server."""

    def inject_notice(self, node_id: str, cloud: str, reclaim: bool = True) -> float:
        """Deliver a notice; return the grace in seconds (``reclaim=False``: a false notice)."""

    def inject_rebalance(self, node_id: str) -> None: ...


# --- asking a provider, whatever it can do ----------------------------------------------------------------------

SINGLE_NODE_PORT = 29500  # the rendezvous port where the provider has no say (a single node listens on itself)


def gang_capacity(provider: Provider) -> int:
    """The most nodes of one gang a zone of ``provider`` holds (1 where it runs no gangs)."""
    return provider.gang_capacity() if isinstance(provider, HoldsGangs) else 1


def free_slots(provider: Provider, zone: str, live_here: int) -> int:
    """How many more of our nodes ``zone`` takes now (one at a time where the provider cannot say)."""
    return provider.free_slots(zone, live_here) if isinstance(provider, HoldsGangs) else 1


def rendezvous_port(provider: Provider | None, previous: int | None = None) -> int:
    return provider.rendezvous_port(previous) if isinstance(provider, HoldsGangs) else SINGLE_NODE_PORT


def default_checkpoint_url(provider: Provider | None, job_id: str) -> str | None:
    """Where a job that names no durable URL keeps its checkpoints on ``provider``; None where it has no default."""
    return provider.default_checkpoint_url(job_id) if isinstance(provider, DefaultCheckpoints) else None
