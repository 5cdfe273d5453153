"""A metadata server that trickles its answer one byte at a time cannot blind a watcher: every request has a
total deadline, so the watcher gives up on it, retries, and sees the notice that comes meanwhile."""

import time

import pytest

from agents.watchers import AWSWatcher, gcp_watchers
from agents.watchers.deadline import DeadlineExceeded, DeadlineSession
from watcher_fixtures import imds, gce, recorder, run_loop  # noqa: F401 - pytest fixtures

BYTE_EVERY = 0.5  # inside every watcher's read timeout: only a total deadline ends such an answer
NOTICE_WITHIN = 15.0  # a trickled answer of ~150 bytes alone takes over a minute


def _wait_for_request(server, path: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.stats()["by_path"].get(path, 0) == 0:
        assert time.monotonic() < deadline, f"the watcher never asked for {path}"
        time.sleep(0.02)


def test_a_trickled_answer_ends_at_the_requests_deadline(imds):
    """One request to a server trickling its answer fails with DeadlineExceeded at connect + read timeouts."""
    path = "/latest/meta-data/spot/instance-action"
    imds.add_fault("trickle", delay=BYTE_EVERY, path=path)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        DeadlineSession().get(imds.url + path, timeout=(1.0, 1.0))
    assert time.monotonic() - started < NOTICE_WITHIN


def test_aws_watcher_sees_a_notice_after_a_trickled_answer(imds, recorder, run_loop):
    """IMDS trickling an instance-action answer delays the AWS notice by a deadline, not by the trickle."""
    path = "/latest/meta-data/spot/instance-action"
    imds.add_fault("trickle", count=1, delay=BYTE_EVERY, path=path, method="GET")
    run_loop([AWSWatcher(imds.endpoint)])
    _wait_for_request(imds, path)
    imds.preempt(120)
    recorder.wait_for(lambda r: any(n.terminal for _, n in r.notices), timeout=NOTICE_WITHIN)


def test_gcp_watcher_sees_a_notice_after_a_trickled_answer(gce, recorder, run_loop):
    """A GCE metadata server trickling the preempted value delays the notice by a deadline, not by the trickle."""
    path = "/computeMetadata/v1/instance/preempted"
    gce.add_fault("trickle", count=1, delay=BYTE_EVERY, path=path)
    run_loop(gcp_watchers(gce.endpoint))
    _wait_for_request(gce, path)
    gce.preempt(30)
    recorder.wait_for(lambda r: any(n.terminal for _, n in r.notices), timeout=NOTICE_WITHIN)
