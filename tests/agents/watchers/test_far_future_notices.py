"""A notice whose time is near the end of the calendar (year 9999) is delivered, its deadline clamped."""

import io
import threading
from datetime import timedelta

from agents.watchers import AWSWatcher, watch
from agents.watchers.base import MAX_DEADLINE_AHEAD
from runner.providers.local.metadata import serve_all
from watcher_fixtures import imds, recorder, run_loop  # noqa: F401 - pytest fixtures


def test_agent_watch_prints_an_azure_eviction_dated_in_the_year_9999():
    """An Azure Preempt with NotBefore in 9999 (10000 in UTC) is printed and ends the watch, instead of killing it."""
    with serve_all(clouds=("azure",)) as node:
        node["azure"].add_event("Preempt", not_before="Fri, 31 Dec 9999 23:59:59 -0500")
        out, stop = io.StringIO(), threading.Event()
        safety = threading.Timer(20, stop.set)  # never hang the test run
        safety.start()
        code = watch("azure", out, env=node.environment(), stop=stop)
        safety.cancel()
    assert code == 0
    assert '"action": "preempt"' in out.getvalue(), out.getvalue()


def test_aws_watcher_delivers_a_spot_notice_dated_in_the_year_9999_with_a_clamped_deadline(imds, recorder, run_loop):
    """An instance-action time of 9999-12-31T23:59:59-05:00 is a terminal notice, due at most a year ahead."""
    imds.set_instance_action("terminate", time_text="9999-12-31T23:59:59-05:00")
    run_loop([AWSWatcher(imds.endpoint)])
    recorder.wait_for(lambda r: any(n.terminal for _, n in r.notices), timeout=10)
    (_, notice), = [(at, n) for at, n in recorder.notices if n.terminal]
    assert notice.deadline - notice.received_at <= MAX_DEADLINE_AHEAD
    assert notice.deadline - notice.received_at > MAX_DEADLINE_AHEAD - timedelta(minutes=1)
