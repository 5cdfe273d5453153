"""Fixtures (imported by the tests here): a fake Compute Engine API on loopback and a GCPProvider pointed at it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[2] / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

from gce_api import FakeGCE  # noqa: E402

from runner.providers.base import LaunchRequest, NodeBootstrap  # noqa: E402
from runner.providers.offers import Offer  # noqa: E402

PROJECT = "test-project"
ZONE = "us-central1-a"
CONFIG = {
    "project": PROJECT,
    "zones": [ZONE, "us-central1-b"],
    "image": "projects/deeplearning-platform-release/global/images/family/common-cu124",
    "service_account": "runner-node@test-project.iam.gserviceaccount.com",
}
T4 = Offer("gcp", "us-central1", ZONE, "n1-standard-8", "T4", 1, 8, 30.0, 0.255, 0.73)
A100 = Offer("gcp", "us-central1", ZONE, "a2-highgpu-1g", "A100", 1, 12, 85.0, 1.73, 3.6695)


def launch_request(node_id: str = "n-0123456789ab", offer: Offer = T4, spot: bool = True,
                   token: str = "node-token-secret") -> LaunchRequest:
    return LaunchRequest(node_id=node_id, job_id="j-tiny-gpt", attempt=2, offer=offer, spot=spot,
                         bootstrap=NodeBootstrap("http://10.128.0.2:8470", node_id, token))


@pytest.fixture
def gce():
    with FakeGCE(project=PROJECT) as server:
        yield server


@pytest.fixture
def provider(gce, monkeypatch):
    from runner.providers.gcp import GCPProvider

    monkeypatch.setenv("RUNNER_GCP_COMPUTE_ENDPOINT", gce.endpoint)
    return GCPProvider(dict(CONFIG), retry_seconds=1.0)
