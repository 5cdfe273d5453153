"""An in-memory provider: nodes that are only records, scripted like httpx's ``MockTransport``.

Scheduler tests drive the reconciler against it without starting processes, and the controller's scale
benchmark runs on it (its nodes are played by the benchmark). What it can be told to do:

- ``refuse(zone, times, error)``: the next launches in a zone fail (a stockout, a quota, bad credentials);
- ``hold_launches()`` / ``release_launches()``: launches wait until released (a cloud operation that
  takes minutes), so a test can see what a slow launch holds up; ``hold_describes(*node_ids)`` and
  ``hold_terminates()`` likewise for describes (of some nodes, or all) and terminates, until
  ``release_describes()`` / ``release_terminates()``; ``describe_held(node_id)`` says whether a describe call about
  the node is waiting at that hold now (one asked for before the hold may still be out, and answer);
- ``fail_terminates(times, error)``: the next terminates raise (an API error; terminate is retried);
- ``preempt(node_id)`` / ``lose(node_id)``: a node is reclaimed after a notice, or vanishes without one.

``launch`` is idempotent per node id, ``terminate`` is idempotent, every launch and terminate is recorded.
Describes are answered in one call per tick (``DescribesInBatch``, as a cloud's batch API would);
``PerNodeMemoryProvider`` answers them node by node, as a cloud's per-node API.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from .base import CheckpointBucket, DescribesInBatch, HoldsGangs, LaunchRequest, NodeStatus, Provider
from .errors import NoCapacityError, ProviderError
from .offers import Offer

ALIVE, PREEMPTED, LOST, TERMINATED = "alive", "preempted", "not-found", "terminated"


@dataclass
class MemoryNode:
    request: LaunchRequest
    ref: str
    state: str = ALIVE

    @property
    def zone(self) -> str:
        return self.request.offer.zone


def memory_offers(zones: tuple[str, ...] = ("mem-a", "mem-b", "mem-c")) -> list[Offer]:
    """One CPU type per zone, each zone's spot price a cent dearer than the one before."""
    return [Offer("memory", "mem", zone, "mem-cpu-2", None, 0, 2, 4.0, round(0.01 * (i + 1), 2), 0.05)
            for i, zone in enumerate(zones)]


class PerNodeMemoryProvider(Provider, HoldsGangs, CheckpointBucket):
    """Nodes that exist only in this object, described node by node; see the module docstring for what a test
    can script."""

    describe_interval = 0.0

    def __init__(self, offers: list[Offer] | None = None, *, name: str = "memory", zone_capacity: int = 64,
                 checkpoint_url: str | None = "memory://checkpoints",
                 on_launch: Callable[[LaunchRequest], None] | None = None):
        self.name = name
        self._offers = list(offers) if offers is not None else memory_offers()
        self.zone_capacity = zone_capacity
        self.checkpoint_url = checkpoint_url
        self.on_launch = on_launch  # told of every new node (the scale benchmark hands its bootstrap to a fake agent)
        self.nodes: dict[str, MemoryNode] = {}
        self.launch_calls: list[str] = []  # node ids, one per call (an idempotent retry appears twice)
        self.terminate_calls: list[str] = []
        self._refusals: Counter = Counter()
        self._refusal_errors: dict[str | None, ProviderError] = {}
        self._gate = threading.Event()
        self._gate.set()
        self._describe_gate, self._held_describes = threading.Event(), None  # None: all held while the gate is shut
        self._describe_gate.set()
        self._describes_waiting: Counter = Counter()  # node id -> describes waiting at the hold now
        self._terminate_gate = threading.Event()
        self._terminate_gate.set()
        self._terminate_failures: list[ProviderError] = []
        self._lock = threading.Lock()

    # --- scripting --------------------------------------------------------
    def refuse(self, zone: str | None = None, times: int = 1, error: ProviderError | None = None) -> None:
        """The next ``times`` launches in ``zone`` (any zone: None) raise ``error`` (default: no capacity)."""
        self._refusals[zone] += times
        self._refusal_errors[zone] = error or NoCapacityError(f"no capacity in {zone or 'any zone'} (scripted)")

    def hold_launches(self) -> None:
        """Launches block from now on until :meth:`release_launches` (a slow cloud operation)."""
        self._gate.clear()

    def release_launches(self) -> None:
        self._gate.set()

    def hold_describes(self, *node_ids: str) -> None:
        """Describes of ``node_ids`` (of every node: none named) block until :meth:`release_describes` (a hung API)."""
        self._held_describes = set(node_ids) or None
        self._describe_gate.clear()

    def release_describes(self) -> None:
        self._describe_gate.set()

    def hold_terminates(self) -> None:
        """Terminates block from now on until :meth:`release_terminates` (a cloud that takes minutes to answer)."""
        self._terminate_gate.clear()

    def release_terminates(self) -> None:
        self._terminate_gate.set()

    def fail_terminates(self, times: int = 1, error: ProviderError | None = None) -> None:
        """The next ``times`` terminates raise ``error`` (default: a retryable API error) and release nothing."""
        self._terminate_failures += [error or ProviderError("terminate failed (scripted)")] * times

    def preempt(self, node_id: str) -> None:
        """The cloud reclaims the node after a notice: ``describe`` says it is gone, ``preempted``."""
        self.nodes[node_id].state = PREEMPTED

    def lose(self, node_id: str) -> None:
        """The node vanishes without a notice: ``describe`` says ``not-found``."""
        self.nodes[node_id].state = LOST

    # --- what a test reads ------------------------------------------------
    def describe_held(self, node_id: str) -> bool:
        """Whether a describe of ``node_id`` is waiting at :meth:`hold_describes` now (it answers only once released)."""
        with self._lock:
            return self._describes_waiting[node_id] > 0

    def alive(self) -> list[str]:
        """Ids of the nodes running now, in launch order."""
        return [node_id for node_id, node in self.nodes.items() if node.state == ALIVE]

    # --- the Provider interface -------------------------------------------
    def offers(self) -> list[Offer]:
        return list(self._offers)

    def gang_capacity(self) -> int:
        return self.zone_capacity

    def free_slots(self, zone: str, live_here: int) -> int:
        return max(0, self.zone_capacity - live_here)

    def rendezvous_port(self, previous: int | None = None) -> int:
        return 29501 if previous == 29500 else 29500

    def launch(self, request: LaunchRequest) -> str:
        self.launch_calls.append(request.node_id)
        self._gate.wait()
        with self._lock:
            existing = self.nodes.get(request.node_id)
            if existing is not None:
                return existing.ref
            for zone in (request.offer.zone, None):
                if self._refusals[zone] > 0:
                    self._refusals[zone] -= 1
                    raise self._refusal_errors[zone]
            node = MemoryNode(request, ref=f"mem-{len(self.nodes) + 1}")
            self.nodes[request.node_id] = node
        if self.on_launch is not None:
            self.on_launch(request)
        return node.ref

    def describe(self, node_id: str, provider_ref: str | None) -> NodeStatus:
        self._wait_if_held([node_id])
        return self._status(node_id)

    def _wait_if_held(self, node_ids: list[str]) -> None:
        """A describe call about ``node_ids`` waits while :meth:`hold_describes` holds any of them."""
        held = self._held_describes
        if self._describe_gate.is_set() or (held is not None and not held.intersection(node_ids)):
            return
        with self._lock:
            self._describes_waiting.update(node_ids)
        try:
            self._describe_gate.wait()
        finally:
            with self._lock:
                self._describes_waiting.subtract(node_ids)

    def _status(self, node_id: str) -> NodeStatus:
        node = self.nodes.get(node_id)
        if node is None:
            return NodeStatus(alive=False, reason=LOST)
        return NodeStatus(alive=node.state == ALIVE, reason=None if node.state == ALIVE else node.state)

    def terminate(self, node_id: str, provider_ref: str | None) -> None:
        self.terminate_calls.append(node_id)
        self._terminate_gate.wait()
        with self._lock:
            failure = self._terminate_failures.pop(0) if self._terminate_failures else None
        if failure is not None:
            raise failure
        node = self.nodes.get(node_id)
        if node is not None and node.state == ALIVE:
            node.state = TERMINATED


class MemoryProvider(PerNodeMemoryProvider, DescribesInBatch):
    """The in-memory provider whose describes of a tick are one call."""

    def describe_many(self, nodes: list[tuple[str, str | None]]) -> dict[str, NodeStatus]:
        self._wait_if_held([node_id for node_id, _ in nodes])  # one call: held, it hangs for all of them
        return {node_id: self._status(node_id) for node_id, _ in nodes}
