"""Notice.timing(): the precise figures an agent reports with a notice for the controller's metrics."""

from agents.watchers import AWSWatcher
from agents.watchers.base import Notice
from watcher_fixtures import imds  # noqa: F401 - pytest fixtures


def test_an_aws_rebalance_reports_its_notice_time_as_its_issue_time(imds):
    """A rebalance recommendation carries noticeTime, so its report says when it was issued and when it was seen."""
    imds.set_rebalance()
    [notice] = AWSWatcher(imds.endpoint, timeout=0.5, put_timeout=0.3).check()
    timing = notice.timing()
    assert 0 <= timing["received_unix"] - timing["issued_unix"] < 2  # noticeTime has whole seconds
    assert "deadline_unix" not in timing


def test_a_notice_without_an_issue_time_reports_when_it_was_seen_and_its_deadline():
    """A termination notice with a grace reports received and deadline times, and no issue time."""
    notice = Notice.create("gcp", "termination", "preempt", terminal=True, grace=30)
    timing = notice.timing()
    assert timing["deadline_unix"] - timing["received_unix"] == 30
    assert "issued_unix" not in timing


def test_a_replayed_notice_reports_no_timing():
    """A notice remembered from before an agent restart reports nothing: its times are no longer precise."""
    notice = Notice.from_state(Notice.create("aws", "termination", "terminate", terminal=True, grace=120).to_state())
    assert notice.timing() == {}
