"""Fixtures, imported by the tests here: fakes on loopback and a loop runner that records its notices."""

import threading
import time

import pytest

from agents.watchers import WatchLoop
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


class Recorder:
    """A notice callback that remembers every notice and when it came."""

    def __init__(self):
        self.notices = []
        self.changed = threading.Condition()

    def __call__(self, notice):
        with self.changed:
            self.notices.append((time.monotonic(), notice))
            self.changed.notify_all()

    @property
    def ids(self):
        return [notice.id for _, notice in self.notices]

    def wait_for(self, predicate, timeout=3.0):
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self), timeout), f"only saw {self.ids}"


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def run_loop(recorder):
    """Start a WatchLoop (fast backoff) with the recorder as callback; stopped after the test."""
    loops = []

    def start(watchers, **options):
        options.setdefault("backoff_initial", 0.05)
        options.setdefault("backoff_max", 0.2)
        loop = WatchLoop(watchers, recorder, **options).start()
        loops.append(loop)
        return loop

    yield start
    for loop in loops:
        loop.stop(timeout=0.5)
