"""The local provider: every node is a process tree under ``DATA_DIR/nodes/NODE_ID``.

The node's ``scratch/`` folder is its local NVMe: it is deleted when the node is terminated.
Terminating a node kills its whole session at once, as a power-off would.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import structlog
import yaml

from ..base import DefaultCheckpoints, DescribesInBatch, HoldsGangs, LaunchRequest, NodeStatus, Provider
from ..errors import NoCapacityError, ProviderError
from ..offers import Offer
from ...local_durable import throttle_environment
from .ports import HeldPorts
from .processes import kill_node, process_ref

log = structlog.get_logger(__name__)

DEFAULT_ZONES = ("local-a", "local-b", "local-c")
DEFAULT_ZONE_CAPACITY = 8  # nodes per simulated zone, all jobs together (clouds.local.zone_capacity)
NODE_ADDRESS = "127.0.0.1"  # every simulated node is this machine
# Seconds from a notice to the loss of the node, per cloud (docs/aws.md, docs/gcp.md).
GRACE_SECONDS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
# How long a node process found holding its lock may take to be recorded or to end at its gate (its Python's start,
# on a busy machine) before a launch or terminate of it fails, to be asked for again.
GATE_SECONDS = 60.0


class LocalProvider(Provider, DescribesInBatch, HoldsGangs, DefaultCheckpoints):
    """A simulated spot market on this machine (its describes are free: all of a tick's are one call); it also
    injects notices (``InjectsNotices``)."""

    name = "local"
    describe_interval = 0.0  # a local check is free

    def __init__(self, data_dir: Path, zones: list[str] | None = None, time_scale: float = 1.0,
                 no_capacity: list[str] | None = None, zone_capacity: int = DEFAULT_ZONE_CAPACITY,
                 boot_seconds: float = 0.0, durable_mb_per_s: float | None = None):
        self.data_dir = Path(data_dir)
        self.nodes_dir = self.data_dir / "nodes"
        self.nodes_dir.mkdir(parents=True, exist_ok=True)
        self.zones = list(zones or DEFAULT_ZONES)
        self.no_capacity = set(no_capacity or ())  # chaos: zones whose launches fail as a stockout would
        if isinstance(zone_capacity, bool) or not isinstance(zone_capacity, int) or zone_capacity < 1:
            raise ValueError(f"clouds.local.zone_capacity: {zone_capacity!r} is not a positive whole number of nodes")
        self.zone_capacity = zone_capacity  # live nodes a simulated zone holds at once (every job's)
        self.time_scale = _non_negative_number("time_scale", time_scale, positive=True)
        # As slow as a cloud: a launched node's agent starts this long after the launch (a VM's boot) ...
        self.boot_seconds = _non_negative_number("boot_seconds", boot_seconds)
        # ... and the default durable tier moves this many MB/s per node and direction (None: unlimited).
        self.durable_mb_per_s = (None if durable_mb_per_s is None
                                 else _non_negative_number("durable_mb_per_s", durable_mb_per_s, positive=True))
        self._children: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._ports = HeldPorts(NODE_ADDRESS)

    def offers(self) -> list[Offer]:
        try:
            from ..catalog import local_offers
        except ImportError:  # the catalog is optional for the simulated market
            return [Offer("local", "local", zone, "sim-cpu-2", None, 0, 2, 4.0, 0.01, 0.03) for zone in self.zones]
        return local_offers(self.zones)

    def default_checkpoint_url(self, job_id: str) -> str:
        """Local nodes share this machine's disk: checkpoints go under the controller's data dir (through the
        bandwidth-limited ``local-durable://`` filesystem when ``durable_mb_per_s`` is set)."""
        url = (self.data_dir / "checkpoints" / job_id).resolve().as_uri()
        return url if self.durable_mb_per_s is None else "local-durable" + url[len("file"):]

    def node_dir(self, node_id: str) -> Path:
        return self.nodes_dir / node_id

    # --- gangs --------------------------------------------------------------
    def gang_capacity(self) -> int:
        return self.zone_capacity

    def free_slots(self, zone: str, live_here: int) -> int:
        return max(0, self.zone_capacity - live_here)

    def rendezvous_port(self, previous: int | None = None) -> int:
        """A port free on this machine now (every simulated node is this machine), held until its node listens
        on it (ports.py: why)."""
        return self._ports.take(avoid=previous)

    def _live_in_zone(self, zone: str) -> int:
        """Simulated nodes alive in ``zone`` now (each holds its alive.lock for its whole life)."""
        count = 0
        for zone_file in self.nodes_dir.glob("*/zone"):
            if zone_file.read_text() != zone:
                continue
            fd = _try_lock(zone_file.parent / "alive.lock")
            if fd is None:
                count += 1
            else:
                os.close(fd)
        return count

    def launch(self, request: LaunchRequest) -> str:
        """Start the node's process, or adopt the one a launcher before a controller restart started. Crash-safe as
        a cloud's launch with its idempotency token: the process does nothing until its ``ref`` is on disk (the
        node's gate, :mod:`.node`), so a node that runs can always be found again from its id."""
        if request.offer.zone in self.no_capacity:
            raise NoCapacityError(f"no {request.offer.instance_type} capacity in {request.offer.zone} (simulated)")
        node_dir = self.node_dir(request.node_id)
        while True:
            with self._lock:
                node_dir.mkdir(parents=True, exist_ok=True)
                lock_fd = _try_lock(node_dir / "alive.lock")
                if lock_fd is not None:
                    try:
                        if (node_dir / "ref").exists():
                            raise ProviderError(f"node {request.node_id} was launched before and is gone")
                        if self._live_in_zone(request.offer.zone) >= self.zone_capacity:
                            raise NoCapacityError(f"{request.offer.zone} is full: it holds {self.zone_capacity} "
                                                  "nodes (simulated; clouds.local.zone_capacity)")
                        (node_dir / "zone").write_text(request.offer.zone)
                        return self._spawn(request, node_dir, lock_fd)
                    finally:
                        os.close(lock_fd)  # the node process keeps its inherited copy of the lock
            # A node process holds the lock: started by a launcher before a controller restart. Adopt it once it
            # is recorded; one whose launcher died before recording it ends at its gate, and is launched again.
            ref = self._recorded_ref(node_dir)
            if ref is not None:
                log.info("node adopted", node=request.node_id, ref=ref)
                return ref

    def _spawn(self, request: LaunchRequest, node_dir: Path, lock_fd: int) -> str:
        scratch = node_dir / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        _write_private(node_dir / "agent.yaml", yaml.safe_dump({
            "controller_url": request.bootstrap.controller_url,
            "node_id": request.node_id,
            "token": request.bootstrap.token,
            "scratch_dir": str(scratch),
            "cloud": "local",
            "zone": request.offer.zone,
            "address": NODE_ADDRESS,  # where the other nodes of a gang reach this one
            # Simulated time runs faster; the job still needs real seconds to import torch and restore, and a
            # gang's simulated nodes share this machine's CPUs: every rank of every node restarts at once.
            "drill_timeout_seconds": max(20.0, 120.0 * self.time_scale,
                                         30.0 * request.gang_size if request.gang_size > 1 else 0.0),
            # The restart's restore comes after a new Python's imports (transformers, lightning: tens of CPU
            # seconds on a busy machine), which no simulated clock speeds up: a real node's 120 s at least.
            "drill_restore_timeout_seconds": max(120.0, 30.0 * request.gang_size),
            # GCP's protocol states no deadline: tell the agent how soon this simulated node powers off.
            "gcp_spot_grace_seconds": self.grace_seconds("gcp"),
        }))
        # The simulated VM's boot: the node process starts its agent this long after the launch.
        (node_dir / "boot.json").write_text(json.dumps({"launched_at": time.time(), "boot_seconds": self.boot_seconds}))
        gate_out, gate_in = os.pipe()  # the node reads its gate to the end before it starts anything
        try:
            try:
                with open(node_dir / "node.log", "ab") as out:
                    # The lock fd is inherited: the node holds it from its first instant until it dies.
                    child = subprocess.Popen(
                        [sys.executable, "-m", "runner.providers.local.node", str(node_dir), str(gate_out)],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                        pass_fds=(lock_fd, gate_out), env=_node_environment(node_dir, self.durable_mb_per_s),
                    )
            finally:
                os.close(gate_out)  # the node's own copy is the only one left
            self._children[request.node_id] = child
            ref = process_ref(child.pid)
            _write_atomically(node_dir / "ref", ref)
        finally:
            os.close(gate_in)  # the gate opens (here, or at this process's death): the node starts only if recorded
        log.info("node launched", node=request.node_id, zone=request.offer.zone, pid=child.pid)
        return ref

    def _recorded_ref(self, node_dir: Path, timeout: float = GATE_SECONDS) -> str | None:
        """The ref of the node process that holds ``node_dir``'s lock, once its launcher has recorded it; None once
        the lock is free and no ref was recorded (the process ended at its gate: its launcher died first)."""
        deadline = time.monotonic() + timeout
        while True:
            if (node_dir / "ref").exists():
                return (node_dir / "ref").read_text()
            lock_fd = _try_lock(node_dir / "alive.lock")
            if lock_fd is not None:
                os.close(lock_fd)
                return (node_dir / "ref").read_text() if (node_dir / "ref").exists() else None
            if time.monotonic() > deadline:
                raise ProviderError(f"node {node_dir.name} is alive but neither recorded nor ended at its gate "
                                    f"after {timeout:.0f}s")
            time.sleep(0.05)

    def describe(self, node_id: str, provider_ref: str | None) -> NodeStatus:
        child = self._children.get(node_id)
        if child is not None and child.poll() is not None:
            self._children.pop(node_id, None)
        lock_fd = _try_lock(self.node_dir(node_id) / "alive.lock")
        if lock_fd is None:
            return NodeStatus(alive=True)
        os.close(lock_fd)
        reason = "preempted" if (self.node_dir(node_id) / "preempted").exists() else "not-found"
        return NodeStatus(alive=False, reason=reason)

    def terminate(self, node_id: str, provider_ref: str | None) -> None:
        node_dir = self.node_dir(node_id)
        if provider_ref is None and node_dir.exists():
            provider_ref = self._recorded_ref(node_dir)  # a node process at its gate: recorded, or it ends there
        if provider_ref:
            # Everything the node started dies, as at a power-off: its session, even processes that outlived the node
            # process, and their descendants in sessions of their own (torchrun's workers: a next attempt started
            # ahead on the node, waiting in restore(), outlived its node's end before).
            kill_node(provider_ref)
        child = self._children.pop(node_id, None)
        if child is not None:
            child.wait(timeout=10)
        shutil.rmtree(node_dir / "scratch", ignore_errors=True)

    # --- chaos ------------------------------------------------------------
    def grace_seconds(self, cloud: str) -> float:
        return GRACE_SECONDS[cloud] * self.time_scale

    def inject_notice(self, node_id: str, cloud: str, reclaim: bool = True) -> float:
        """Deliver a preemption notice through the node's metadata server; return the grace in seconds.
        ``reclaim=False``: a false notice (the caller does not reclaim the node at the deadline)."""
        from .metadata import inject_notice

        endpoints = json.loads((self.node_dir(node_id) / "metadata.json").read_text())
        grace = self.grace_seconds(cloud)
        inject_notice(cloud, endpoints[cloud], grace)
        if reclaim:
            (self.node_dir(node_id) / "preempted").write_text(cloud)
        log.info("notice injected", node=node_id, cloud=cloud, grace_seconds=grace)
        return grace


    def vanish(self, node_id: str) -> None:
        """The node vanishes without a notice: every process of it (the job's workers too) is killed at once. Its
        describe then says it is gone, not preempted, so its attempt counts it ``lost``."""
        node_dir = self.node_dir(node_id)
        if (node_dir / "ref").exists():
            kill_node((node_dir / "ref").read_text())
        log.info("node vanished", node=node_id)

    def inject_rebalance(self, node_id: str) -> None:
        """Deliver an AWS rebalance recommendation (an early sign, not a notice) through the node's metadata server."""
        from .metadata import admin_request

        endpoints = json.loads((self.node_dir(node_id) / "metadata.json").read_text())
        admin_request(endpoints["aws"], "notice", {"op": "rebalance"})
        log.info("rebalance recommendation injected", node=node_id)


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive lock on ``path``, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole or not at all, whenever its writer is killed."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _non_negative_number(key: str, value, positive: bool = False) -> float:
    """A finite number of clouds.local, checked: the error names the key (``.inf`` would be a node that never
    boots, a notice never reclaimed; an unlimited durable tier is the key left out)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (
            positive and value == 0):
        what = "a positive number" if positive else "a number of 0 or more"
        raise ValueError(f"clouds.local.{key}: {value!r} is not {what}")
    return float(value)


def _node_environment(node_dir: Path | None = None, durable_mb_per_s: float | None = None) -> dict[str, str]:
    """A node starts from the controller's environment less anything that is the controller's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "LOCAL_DURABLE_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if durable_mb_per_s is not None and node_dir is not None:
        # The node's share of the durable tier's bandwidth, held by every process of the node together.
        env.update(throttle_environment(durable_mb_per_s, node_dir / "durable-bandwidth"))
    # A local node's "image" is this Python: its `python` is the one the runner is installed in.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env
