"""Fixtures (imported by the tests here): each test gets fresh fake metadata servers on ephemeral loopback ports."""

import pytest
import requests

from runner.providers.local.metadata import FakeGCEMetadata, FakeIMDS, FakeScheduledEvents


@pytest.fixture
def imds():
    with FakeIMDS() as server:
        yield server


@pytest.fixture
def gce():
    with FakeGCEMetadata() as server:
        yield server


@pytest.fixture
def azure():
    with FakeScheduledEvents() as server:
        yield server


@pytest.fixture
def http():
    session = requests.Session()
    session.trust_env = False
    yield session
    session.close()
