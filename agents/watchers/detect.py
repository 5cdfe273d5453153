"""Which cloud's metadata server is there, and the watchers for it.

Endpoints come from the variables of docs/environment.md when set; otherwise from the link-local
address, probed with short timeouts. The watchers never talk to anything but the link-local metadata
address unless a variable says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import requests

from runner.errors import RunnerError

from .aws import AWSWatcher
from .azure import AzureWatcher
from .base import Watcher, http_session
from .gcp import gcp_watchers

CLOUDS = ("aws", "gcp", "azure")
ENDPOINT_VARIABLES = {
    "aws": "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "gcp": "GCE_METADATA_HOST",
    "azure": "RUNNER_AZURE_METADATA_ENDPOINT",
}
LINK_LOCAL = {"aws": "http://169.254.169.254", "gcp": "169.254.169.254", "azure": "http://169.254.169.254"}
PROBE_TIMEOUT = 0.5


class NoMetadataServer(RunnerError, RuntimeError):
    """No cloud metadata server answered."""


def configured_endpoints(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """cloud -> endpoint for every endpoint variable that is set."""
    env = os.environ if env is None else env
    return {cloud: env[var] for cloud, var in ENDPOINT_VARIABLES.items() if env.get(var)}


def endpoint_for(cloud: str, env: Mapping[str, str] | None = None) -> str:
    if cloud not in CLOUDS:
        raise ValueError(f"unknown cloud {cloud!r}: use one of {', '.join(CLOUDS)}")
    return configured_endpoints(env).get(cloud, LINK_LOCAL[cloud])


def probe(cloud: str, endpoint: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Does ``endpoint`` speak ``cloud``'s metadata protocol? Read-only, one request, never raises."""
    base = endpoint if "://" in endpoint else f"http://{endpoint}"
    base = base.rstrip("/")
    session = http_session()
    try:
        if cloud == "aws":  # a GET, not the token PUT: a PUT may be dropped by the hop limit
            response = session.get(f"{base}/latest/meta-data/instance-id", timeout=timeout)
            return response.status_code in (200, 401) and "Metadata-Flavor" not in response.headers
        if cloud == "gcp":
            response = session.get(f"{base}/computeMetadata/v1/", headers={"Metadata-Flavor": "Google"},
                                   timeout=timeout)
            return response.headers.get("Metadata-Flavor") == "Google"
        response = session.get(f"{base}/metadata/instance", params={"api-version": "2021-02-01"},
                               headers={"Metadata": "true"}, timeout=timeout)
        return response.status_code == 200 and "compute" in response.json()
    except (requests.RequestException, ValueError):
        return False
    finally:
        session.close()


def detect(env: Mapping[str, str] | None = None, timeout: float = PROBE_TIMEOUT,
           candidates: Mapping[str, str] = LINK_LOCAL) -> dict[str, str]:
    """cloud -> endpoint to watch: the configured ones if any variable is set, else what answers at
    ``candidates`` (the link-local address), probed in parallel.

    A node of the local provider has all three variables set and watches all three fakes.
    """
    configured = configured_endpoints(env)
    if configured:
        return configured
    clouds = list(candidates)
    with ThreadPoolExecutor(len(clouds)) as pool:
        answers = dict(zip(clouds, pool.map(lambda c: probe(c, candidates[c], timeout), clouds)))
    found = {cloud: candidates[cloud] for cloud, ok in answers.items() if ok}
    if not found:
        raise NoMetadataServer(
            f"no cloud metadata server answered at {', '.join(sorted(set(candidates.values())))} within "
            f"{timeout:g} s. On a cloud VM, check that the metadata service is enabled and reachable "
            "(containers: host networking); elsewhere, name one with --cloud and "
            + ", ".join(ENDPOINT_VARIABLES.values()) + ".")
    return found


def watchers_for(endpoints: Mapping[str, str], gcp_spot_grace: float | None = None) -> list[Watcher]:
    """The watchers (with their default timing) for each cloud -> endpoint; ``gcp_spot_grace`` replaces the
    30 s a GCP preemption is assumed to leave (the protocol states no deadline)."""
    watchers: list[Watcher] = []
    for cloud, endpoint in endpoints.items():
        if cloud == "aws":
            watchers.append(AWSWatcher(endpoint))
        elif cloud == "gcp":
            watchers.extend(gcp_watchers(endpoint, **({"spot_grace": gcp_spot_grace} if gcp_spot_grace else {})))
        elif cloud == "azure":
            watchers.append(AzureWatcher(endpoint))
        else:
            raise ValueError(f"unknown cloud {cloud!r}: use one of {', '.join(CLOUDS)}")
    return watchers
