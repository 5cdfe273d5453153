"""The local provider: every node is a process tree under ``DATA_DIR/nodes/NODE_ID``.

The node's ``scratch/`` folder is its local NVMe: it is deleted when the node is terminated.
Terminating a node kills its whole session at once, as a power-off would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import structlog
import yaml

from ..base import LaunchRequest, NodeStatus, Provider
from ..offers import Offer
from .processes import kill_session, process_ref, ref_alive

log = structlog.get_logger(__name__)

DEFAULT_ZONES = ("local-a", "local-b", "local-c")
# Seconds from a notice to the loss of the node, per cloud (FIELD-NOTES §1).
GRACE_SECONDS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}


class LocalProvider(Provider):
    """A simulated spot market on this machine."""

    name = "local"

    def __init__(self, data_dir: Path, zones: list[str] | None = None, time_scale: float = 1.0):
        self.nodes_dir = Path(data_dir) / "nodes"
        self.nodes_dir.mkdir(parents=True, exist_ok=True)
        self.zones = list(zones or DEFAULT_ZONES)
        self.time_scale = time_scale
        self._children: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def offers(self) -> list[Offer]:
        try:
            from ..catalog import local_offers
        except ImportError:  # the catalog is optional for the simulated market
            return [Offer("local", "local", zone, "sim-cpu-2", None, 0, 2, 4.0, 0.01, 0.03) for zone in self.zones]
        return local_offers(self.zones)

    def node_dir(self, node_id: str) -> Path:
        return self.nodes_dir / node_id

    def launch(self, request: LaunchRequest) -> str:
        node_dir = self.node_dir(request.node_id)
        ref_file = node_dir / "ref"
        with self._lock:
            if ref_file.exists() and ref_alive(ref_file.read_text()):
                return ref_file.read_text()  # launched before a controller restart: adopt it
            if ref_file.exists():
                raise RuntimeError(f"node {request.node_id} was launched before and is gone")
            scratch = node_dir / "scratch"
            scratch.mkdir(parents=True, exist_ok=True)
            config = node_dir / "agent.yaml"
            _write_private(config, yaml.safe_dump({
                "controller_url": request.bootstrap.controller_url,
                "node_id": request.node_id,
                "token": request.bootstrap.token,
                "scratch_dir": str(scratch),
                "cloud": "local",
                "zone": request.offer.zone,
            }))
            out = open(node_dir / "node.log", "ab")
            child = subprocess.Popen(
                [sys.executable, "-m", "runner.providers.local.node", str(node_dir)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, env=_node_environment(),
            )
            out.close()
            self._children[request.node_id] = child
            ref = process_ref(child.pid)
            ref_file.write_text(ref)
            log.info("node launched", node=request.node_id, zone=request.offer.zone, pid=child.pid)
            return ref

    def describe(self, node_id: str, provider_ref: str | None) -> NodeStatus:
        child = self._children.get(node_id)
        if child is not None and child.poll() is not None:
            self._children.pop(node_id, None)
        if ref_alive(provider_ref):
            return NodeStatus(alive=True)
        reason = "preempted" if (self.node_dir(node_id) / "preempted").exists() else "not-found"
        return NodeStatus(alive=False, reason=reason)

    def terminate(self, node_id: str, provider_ref: str | None) -> None:
        if provider_ref and ref_alive(provider_ref):
            kill_session(int(provider_ref.split(":")[0]))
        child = self._children.pop(node_id, None)
        if child is not None:
            child.wait(timeout=10)
        shutil.rmtree(self.node_dir(node_id) / "scratch", ignore_errors=True)

    # --- chaos ------------------------------------------------------------
    def grace_seconds(self, cloud: str) -> float:
        return GRACE_SECONDS[cloud] * self.time_scale

    def inject_notice(self, node_id: str, cloud: str) -> float:
        """Deliver a preemption notice through the node's metadata server; return the grace in seconds."""
        from .metadata import inject_notice

        endpoints = json.loads((self.node_dir(node_id) / "metadata.json").read_text())
        grace = self.grace_seconds(cloud)
        inject_notice(cloud, endpoints[cloud], grace)
        (self.node_dir(node_id) / "preempted").write_text(cloud)
        log.info("notice injected", node=node_id, cloud=cloud, grace_seconds=grace)
        return grace


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _node_environment() -> dict[str, str]:
    """A node starts from the controller's environment less anything that is the controller's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env
