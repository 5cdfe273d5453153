"""A GCE metadata server that ignores wait_for_change is polled about once a second, not hammered."""

import time

from agents.watchers import gcp_watchers
from agents.watchers.gcp import IGNORED_WAIT_POLL
from watcher_fixtures import gce, recorder, run_loop  # noqa: F401 - pytest fixtures

WINDOW = 3.0


def test_a_server_ignoring_wait_for_change_gets_about_one_request_a_second_per_key(gce, run_loop):
    """Answering every hanging GET at once draws at most a few requests a second, where it drew dozens."""
    gce.ignore_wait_for_change = True
    run_loop(gcp_watchers(gce.endpoint))
    time.sleep(WINDOW)  # a rate is measured over a window; a slower machine only makes fewer requests
    keys = 2
    assert gce.requests <= keys * (WINDOW / IGNORED_WAIT_POLL + 3), gce.stats()


def test_a_notice_is_still_seen_from_a_server_ignoring_wait_for_change(gce, recorder, run_loop):
    """While polled instead of waited on, preempted TRUE is still delivered as a terminal notice."""
    gce.ignore_wait_for_change = True
    run_loop(gcp_watchers(gce.endpoint))
    gce.preempt(30)
    recorder.wait_for(lambda r: any(n.terminal for _, n in r.notices), timeout=10)
