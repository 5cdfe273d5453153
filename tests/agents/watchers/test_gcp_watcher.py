"""GCPWatcher follows preempted and maintenance-event by hanging GET and never alarms on a fault."""

import threading
import time

import pytest
from structlog.testing import capture_logs

from agents.watchers import GCPWatcher, WatcherError, gcp_watchers
from agents.watchers.gcp import MAINTENANCE, PREEMPTED
from watcher_fixtures import imds, gce  # noqa: F401 - pytest fixtures


def watcher(gce, key=PREEMPTED, **options):
    options.setdefault("wait_seconds", 2)
    options.setdefault("timeout", 0.5)
    return GCPWatcher(key, gce.endpoint, **options)


def test_first_check_is_a_plain_get_then_hanging_gets(gce):
    """The first check reads at once (a notice may be pending); later ones wait on the etag."""
    w = watcher(gce, wait_seconds=60)
    start = time.monotonic()
    assert w.check() == []
    assert time.monotonic() - start < 30  # not held as a hanging GET would be (60 s)
    threading.Timer(0.3, gce.set_preempted).start()
    [notice] = w.check()
    assert notice.action == "preempt" and time.monotonic() - start > 0.25


def test_pending_preemption_is_seen_by_the_first_plain_get(gce):
    """A preemption already pending when the watcher starts is reported by its first check."""
    gce.preempt(30)
    [notice] = watcher(gce).check()
    assert (notice.kind, notice.terminal) == ("termination", True)


def test_preemption_deadline_is_thirty_seconds(gce):
    """preempted TRUE gives about 30 s until power-off; that is the deadline."""
    gce.preempt(30)
    assert 29 < watcher(gce).check()[0].seconds_left() <= 30


def test_a_shorter_known_grace_replaces_the_thirty_seconds(gce):
    """Where the power-off comes sooner (a simulated node), spot_grace sets the deadline instead."""
    gce.preempt(3)
    assert 2 < watcher(gce, spot_grace=3.0).check()[0].seconds_left() <= 3


def test_hanging_get_detects_a_change_within_a_round_trip(gce):
    """A change ends the hanging GET: it is seen then, not at the end of the GET's wait."""
    w = watcher(gce, wait_seconds=60)
    w.check()
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(notices=w.check(), at=time.monotonic()))
    thread.start()
    time.sleep(0.2)
    changed = time.monotonic()
    gce.set_preempted()
    thread.join(60)
    # Far below the 60 s wait, whatever the machine's load: the answer came with the change.
    assert seen["notices"] and seen["at"] - changed < 30


def test_hanging_get_uses_a_client_timeout_above_timeout_sec(gce):
    """A hanging GET that times out server-side returns normally: the client waits a little longer."""
    w = watcher(gce, wait_seconds=1, timeout_margin=1.0)
    w.check()
    start = time.monotonic()
    # Returned normally (no client timeout) and only after the server's own 1 s.
    assert w.check() == [] and time.monotonic() - start > 0.9


def test_stale_etag_returns_at_once(gce):
    """A change between two waits is not missed: the stale etag makes the next wait return at once."""
    w = watcher(gce, wait_seconds=60)
    w.check()
    gce.set_preempted()  # happens while no request is in flight
    start = time.monotonic()
    assert w.check() and time.monotonic() - start < 30  # not held for the 60 s wait


def test_migrate_is_log_only(gce):
    """MIGRATE_ON_HOST_MAINTENANCE is logged and gives no notice."""
    gce.set_maintenance_event("MIGRATE_ON_HOST_MAINTENANCE")
    with capture_logs() as logs:
        assert watcher(gce, MAINTENANCE).check() == []
    assert any("live migration" in entry["event"] for entry in logs)


def test_terminate_on_host_maintenance_is_an_early_non_terminal_notice(gce):
    """TERMINATE_ON_HOST_MAINTENANCE is maintenance about an hour ahead, not an emergency."""
    gce.set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
    [notice] = watcher(gce, MAINTENANCE).check()
    assert (notice.kind, notice.action, notice.terminal) == ("maintenance", "terminate", False)
    assert notice.seconds_left() > 3000


def test_503_is_an_error_then_the_watcher_resyncs(gce):
    """A 503 fails the check; the next check starts again with a plain GET and works."""
    w = watcher(gce)
    w.check()
    gce.add_fault("status", status=503, count=1)
    with pytest.raises(WatcherError, match="503"):
        w.check()
    gce.set_preempted()
    assert w.check()[0].action == "preempt"


def test_garbage_is_an_error_not_a_notice(gce):
    """A value that is neither TRUE nor FALSE fails the check instead of alarming."""
    gce.add_fault("garbage")
    w = watcher(gce)
    for _ in range(5):
        with pytest.raises(WatcherError):
            w.check()


def test_slow_server_is_an_error_not_a_notice(gce):
    """An answer slower than the timeout fails the check."""
    gce.add_fault("slow", delay=1.5)
    with pytest.raises(WatcherError, match="did not answer"):
        watcher(gce).check()


def test_not_a_gce_server_is_a_persistent_error(imds):
    """Something that is not a GCE metadata server (here: IMDS) is an error, never a notice."""
    with pytest.raises(WatcherError):
        GCPWatcher(PREEMPTED, imds.endpoint, timeout=0.5).check()


def test_server_down_is_an_error(gce):
    """A server that does not listen fails the check, naming GCE_METADATA_HOST."""
    w = watcher(gce)
    gce.stop()
    with pytest.raises(WatcherError, match="GCE_METADATA_HOST"):
        w.check()


def test_gcp_watchers_cover_both_keys(gce):
    """gcp_watchers() gives one watcher per key, for the loop to run concurrently."""
    assert [w.key for w in gcp_watchers(gce.endpoint)] == [PREEMPTED, MAINTENANCE]
