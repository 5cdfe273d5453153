"""AWSWatcher reads spot, rebalance and scheduled notices over IMDSv2 and never mistakes a fault for one."""

import time
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from agents.watchers import AWSWatcher, WatcherError
from agents.watchers.aws import parse_aws_date
from agents.watchers.base import utcnow
from runner.providers.local.metadata import FakeIMDS
from watcher_fixtures import imds  # noqa: F401 - pytest fixtures


def watcher(imds, **options):
    options.setdefault("timeout", 0.5)
    options.setdefault("put_timeout", 0.3)
    return AWSWatcher(imds.endpoint, **options)


def puts(imds):
    return imds.stats()["by_path"].get("/latest/api/token", 0)


def test_no_notice_is_an_empty_list(imds):
    """With nothing pending (every path 404) a check returns no notice."""
    assert watcher(imds).check() == []


def test_spot_terminate_is_a_terminal_notice_with_the_notice_time_as_deadline(imds):
    """instance-action terminate becomes a terminal termination notice whose deadline is its time."""
    imds.set_instance_action("terminate", deadline_seconds=120)
    [notice] = watcher(imds).check()
    assert (notice.source, notice.kind, notice.action, notice.terminal) == ("aws", "termination", "terminate", True)
    assert 110 < notice.seconds_left() <= 121
    assert notice.to_json()["deadline"].endswith("Z")


def test_stop_is_terminal_too(imds):
    """A spot stop is as terminal as a terminate."""
    imds.set_instance_action("stop")
    assert watcher(imds).check()[0].action == "stop"


def test_hibernate_has_no_two_minute_window(imds):
    """A hibernate notice's deadline is now: hibernation gets no two-minute window."""
    imds.set_instance_action("hibernate", deadline_seconds=120)
    assert watcher(imds).check()[0].seconds_left() < 1


def test_rebalance_is_a_non_terminal_notice(imds):
    """A rebalance recommendation is reported, but is not a termination."""
    imds.set_rebalance()
    [notice] = watcher(imds).check()
    assert (notice.kind, notice.terminal, notice.deadline) == ("rebalance", False, None)


def test_slow_paths_are_polled_at_their_own_interval(imds):
    """Rebalance and scheduled events are read once per their interval, instance-action every check."""
    w = watcher(imds, rebalance_interval=60, scheduled_interval=60)
    for _ in range(4):
        w.check()
    by_path = imds.stats()["by_path"]
    assert by_path["/latest/meta-data/spot/instance-action"] == 4
    assert by_path["/latest/meta-data/events/recommendations/rebalance"] == 1
    assert by_path["/latest/meta-data/events/maintenance/scheduled"] == 1


def test_scheduled_event_deadline_is_read_in_the_aws_date_format(imds):
    """An active scheduled event is maintenance with NotBefore parsed from '21 Jan 2019 09:00:43 GMT'."""
    imds.add_scheduled_event("instance-retirement", not_before_seconds=86400, event_id="instance-event-1")
    [notice] = watcher(imds).check()
    assert (notice.kind, notice.action, notice.terminal) == ("maintenance", "instance-retirement", False)
    assert abs((notice.deadline - utcnow()) - timedelta(days=1)) < timedelta(seconds=5)
    assert notice.id == "aws:maintenance:instance-event-1"


def test_canceled_and_completed_scheduled_events_are_ignored(imds):
    """Scheduled events in state canceled or completed are no notice."""
    imds.add_scheduled_event("system-reboot", state="canceled")
    imds.add_scheduled_event("instance-stop", state="completed")
    assert watcher(imds).check() == []


def test_aws_date_parser_reads_the_documented_example():
    """'21 Jan 2019 09:00:43 GMT' parses to that moment in UTC."""
    assert parse_aws_date("21 Jan 2019 09:00:43 GMT").isoformat() == "2019-01-21T09:00:43+00:00"


def test_token_is_reused_until_near_expiry(imds):
    """One token serves many checks; it is not fetched per request."""
    w = watcher(imds)
    for _ in range(5):
        w.check()
    assert puts(imds) == 1


def test_token_is_refreshed_before_it_expires(imds):
    """A token with refresh_margin or less left is replaced before use, so no GET meets a 401."""
    w = watcher(imds, token_ttl=2, refresh_margin=1.5)
    w.check()
    time.sleep(0.6)
    w.check()
    assert puts(imds) == 2


def test_401_gets_a_new_token_and_retries_once(imds):
    """A GET refused with 401 (token revoked) fetches a new token and succeeds on the retry."""
    w = watcher(imds)
    w.check()
    imds.expire_tokens()
    imds.set_instance_action("terminate")
    assert w.check()[0].action == "terminate"
    assert puts(imds) == 2


def test_repeated_401_is_an_error_not_a_notice(imds):
    """When even a fresh token is refused, the check fails; it never reports a notice."""
    imds.add_fault("status", status=401, path="/latest/meta-data/")
    with pytest.raises(WatcherError, match="401"):
        watcher(imds).check()


def test_dropped_token_put_falls_back_to_imdsv1_and_says_the_fix():
    """A dropped token PUT (hop limit 1) is detected, logged loudly with the fix, and IMDSv1 is used."""
    with FakeIMDS(require_token=False) as imds:
        imds.add_fault("drop", method="PUT")
        imds.set_instance_action("terminate")
        w = watcher(imds)
        with capture_logs() as logs:
            assert w.check()[0].action == "terminate" and w.using_v1
        [entry] = logs
        assert entry["log_level"] == "error" and "hop-limit 2" in entry["fix"]
        w.check()
        assert puts(imds) == 1  # not retried on every check


def test_dropped_token_put_with_imdsv2_required_says_the_fix(imds):
    """A dropped PUT where IMDSv2 is required is a persistent error naming hop limit 2 and host networking."""
    imds.add_fault("drop", method="PUT")
    with pytest.raises(WatcherError, match="host networking") as error:
        watcher(imds).check()
    assert error.value.persistent


def test_slow_server_is_not_mistaken_for_a_dropped_put(imds):
    """When GETs are slow too, a PUT timeout is reported as a slow server, not as the hop limit."""
    imds.add_fault("slow", delay=1.5)
    with pytest.raises(WatcherError, match="did not answer") as error:
        watcher(imds).check()
    assert not error.value.persistent


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_are_errors_not_notices(imds, status):
    """5xx and throttling answers fail the check; they are never a notice."""
    imds.add_fault("status", status=status, path="/latest/meta-data/")
    with pytest.raises(WatcherError):
        watcher(imds).check()


def test_garbage_body_is_an_error_not_a_notice(imds):
    """A 200 whose body is not a valid instance-action fails the check instead of alarming."""
    imds.add_fault("garbage", path="/latest/meta-data/spot/")
    for _ in range(5):  # every kind of garbage the fake rotates through
        with pytest.raises(WatcherError, match="ignored"):
            watcher(imds).check()


def test_imds_disabled_is_a_persistent_error_with_the_fix(imds):
    """IMDS turned off (403) says how to enable it."""
    imds.set_disabled()
    with pytest.raises(WatcherError, match="http-endpoint enabled") as error:
        watcher(imds).check()
    assert error.value.persistent


def test_server_down_is_an_error_not_a_notice(imds):
    """A metadata server that does not listen fails the check with a hint about the endpoint."""
    w = watcher(imds)
    imds.stop()
    with pytest.raises(WatcherError, match="unreachable"):
        w.check()


def test_recomputed_time_keeps_the_same_notice_id(imds):
    """The official mock moves `time` on every request; the notice id stays the same."""
    fake = FakeIMDS(recompute_time=True).start()
    try:
        fake.set_instance_action("terminate")
        w = watcher(fake)
        first = w.check()[0]
        time.sleep(1.05)
        second = w.check()[0]
        assert first.id == second.id and first.deadline != second.deadline
    finally:
        fake.stop()
