"""Protocol-faithful fake metadata servers: one set per simulated node of the local provider.

A node runs all three (:func:`serve_all`) and its agent finds them through the endpoint variables of
docs/environment.md. ``runner preempt JOB --notice aws|gcp|azure`` reaches a node's server from another
process through :func:`inject_notice`, which speaks the servers' admin API (``/_fake/``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .aws import FakeIMDS
from .azure import FakeScheduledEvents
from .base import Fault, FakeMetadataServer
from .gcp import FakeGCEMetadata

__all__ = [
    "ENDPOINT_VARIABLES", "FakeGCEMetadata", "FakeIMDS", "FakeMetadataServer", "FakeScheduledEvents",
    "Fault", "NodeMetadata", "admin_request", "inject_fault", "inject_notice", "serve_all",
]

ENDPOINT_VARIABLES = {
    "aws": "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "gcp": "GCE_METADATA_HOST",
    "azure": "RUNNER_AZURE_METADATA_ENDPOINT",
}
SERVERS: dict[str, type[FakeMetadataServer]] = {"aws": FakeIMDS, "gcp": FakeGCEMetadata, "azure": FakeScheduledEvents}


class NodeMetadata:
    """The three fake metadata servers of one simulated node."""

    def __init__(self, servers: dict[str, FakeMetadataServer]):
        self.servers = servers

    def __getitem__(self, cloud: str) -> FakeMetadataServer:
        return self.servers[cloud]

    def endpoints(self) -> dict[str, str]:
        """cloud -> endpoint, in the form of that cloud's endpoint variable."""
        return {cloud: server.endpoint for cloud, server in self.servers.items()}

    def environment(self) -> dict[str, str]:
        """The variables that point the node's clients (ours, botocore, google-auth) at the fakes."""
        env = {ENDPOINT_VARIABLES[cloud]: server.endpoint for cloud, server in self.servers.items()}
        if "gcp" in self.servers:
            env["GCE_METADATA_IP"] = self.servers["gcp"].endpoint  # google-auth's ping() reads this one
        return env

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def __enter__(self) -> "NodeMetadata":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_all(host: str = "127.0.0.1", clouds: tuple[str, ...] = ("aws", "gcp", "azure")) -> NodeMetadata:
    """Start one fake per cloud on ephemeral loopback ports."""
    servers: dict[str, FakeMetadataServer] = {}
    try:
        for cloud in clouds:
            servers[cloud] = SERVERS[cloud](host).start()
    except BaseException:
        NodeMetadata(servers).stop()
        raise
    return NodeMetadata(servers)


def admin_request(endpoint: str, name: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> dict:
    """POST to a running fake's admin API (``name``: notice, fault or reset); GET for ``stats``."""
    base = endpoint if "://" in endpoint else f"http://{endpoint}"
    data = None if name == "stats" else json.dumps(body or {}).encode()
    request = urllib.request.Request(f"{base.rstrip('/')}/_fake/{name}", data=data,
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    try:
        with opener.open(request, timeout=timeout) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"fake metadata server at {endpoint} refused {name}: {exc.read().decode()}") from exc
    except OSError as exc:
        raise RuntimeError(f"fake metadata server at {endpoint} is unreachable ({exc}); "
                           "is the node still running?") from exc


def inject_notice(cloud: str, endpoint: str, deadline_seconds: float) -> None:
    """Deliver ``cloud``'s spot preemption notice through the fake serving at ``endpoint``.

    aws: a rebalance recommendation and ``instance-action`` terminate at now + deadline;
    gcp: ``instance/preempted`` turns TRUE; azure: a Preempt event with NotBefore now + deadline.
    """
    if cloud not in SERVERS:
        raise ValueError(f"unknown cloud {cloud!r}: use one of {', '.join(SERVERS)}")
    admin_request(endpoint, "notice", {"op": "preempt", "deadline_seconds": deadline_seconds})


def inject_fault(endpoint: str, kind: str, **options: Any) -> None:
    """Make a running fake misbehave (see :class:`Fault` for kinds and options)."""
    admin_request(endpoint, "fault", {"kind": kind, **options})
