"""AzureWatcher reads Scheduled Events; Preempt and Terminate end the VM, the rest is maintenance."""

import pytest

from agents.watchers import AzureWatcher, WatcherError
from watcher_fixtures import azure  # noqa: F401 - pytest fixtures


def watcher(azure, **options):
    return AzureWatcher(azure.endpoint, timeout=0.5, first_timeout=1.0, **options)


def test_no_events_no_notice(azure):
    """An empty Events list is no notice."""
    assert watcher(azure).check() == []


def test_preempt_is_terminal_with_not_before_as_deadline(azure):
    """A Preempt event is a terminal termination notice whose deadline is its NotBefore."""
    event_id = azure.add_event("Preempt", deadline_seconds=30)
    [notice] = watcher(azure).check()
    assert (notice.source, notice.kind, notice.action, notice.terminal) == ("azure", "termination", "preempt", True)
    assert 28 < notice.seconds_left() <= 31 and notice.id == f"azure:termination:{event_id}"


def test_started_preempt_is_due_now(azure):
    """A Preempt that has Started (no NotBefore) is due immediately."""
    azure.add_event("Preempt", status="Started")
    azure._events[0]["NotBefore"] = ""
    assert watcher(azure).check()[0].seconds_left() < 1


def test_reboot_and_freeze_are_maintenance(azure):
    """Reboot and Freeze are reported as non-terminal maintenance."""
    azure.add_event("Reboot")
    azure.add_event("Freeze")
    assert [(n.kind, n.action, n.terminal) for n in watcher(azure).check()] == [
        ("maintenance", "reboot", False), ("maintenance", "freeze", False)]


def test_acknowledge_starts_the_event(azure):
    """acknowledge() posts StartRequests for the event."""
    event_id = azure.add_event("Preempt")
    watcher(azure).acknowledge(event_id)
    assert azure.acknowledged == [event_id]


def test_garbage_is_an_error_not_a_notice(azure):
    """A body that is not a Scheduled Events document fails the check."""
    azure.add_fault("garbage")
    for _ in range(5):
        with pytest.raises(WatcherError):
            watcher(azure).check()


def test_missing_header_answer_is_a_persistent_error(azure):
    """A 400 (what Azure answers without Metadata: true) is reported as persistent, never as a notice."""
    azure.add_fault("status", status=400)
    with pytest.raises(WatcherError, match="400") as error:
        watcher(azure).check()
    assert error.value.persistent


def test_server_down_is_an_error(azure):
    """A server that does not listen fails the check, naming RUNNER_AZURE_METADATA_ENDPOINT."""
    w = watcher(azure)
    azure.stop()
    with pytest.raises(WatcherError, match="RUNNER_AZURE_METADATA_ENDPOINT"):
        w.check()
