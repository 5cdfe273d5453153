"""How much work an ended attempt lost, and what the job does next."""

from __future__ import annotations

from runner.scheduler.outcomes import lost_seconds, next_state


def test_work_after_the_last_commit_is_lost():
    """A node lost 40 s after its last checkpoint loses those 40 s."""
    assert lost_seconds("lost", ended_at=1100.0, working_since=1000.0, last_commit_at=1060.0) == 40.0


def test_without_a_commit_everything_since_training_began_is_lost():
    """An attempt that never committed loses the time from its restore to its end, not its start-up."""
    assert lost_seconds("lost", ended_at=1100.0, working_since=1030.0, last_commit_at=None) == 70.0


def test_a_commit_of_an_earlier_attempt_does_not_shorten_the_loss():
    """A checkpoint time older than this attempt's training start counts from the training start."""
    assert lost_seconds("preempted", ended_at=1100.0, working_since=1050.0, last_commit_at=900.0) == 50.0


def test_an_emergency_checkpoint_at_the_stop_loses_nothing():
    """When the loop stopped at its emergency checkpoint, the process's exit afterwards is not lost work."""
    assert lost_seconds("preempted", ended_at=1100.0, working_since=1000.0, last_commit_at=1099.0,
                        stopped_at_commit=True) == 0.0


def test_success_loses_nothing_and_a_never_started_attempt_has_no_figure():
    """A succeeded attempt lost 0 s; one that never ran has no lost_seconds at all."""
    assert lost_seconds("succeeded", 1100.0, 1000.0, None) == 0.0
    assert lost_seconds("lost", 1100.0, None, None) is None


def test_a_preemption_past_the_limit_fails_the_job_naming_the_limit():
    """The preemption that exceeds recovery.max_preemptions fails the job and says which limit."""
    state, why = next_state("preempted", preemptions=3, failures=0, max_preemptions=3, max_failures=2)
    assert state == "FAILED" and "max_preemptions" in why
