"""The explicit table of allowed changes between job states (the states themselves: runner/protocol/states.py)."""

from __future__ import annotations

from ..protocol.events import EndReason
from ..protocol.states import JobState

# The scheduler's short names for the states.
PENDING = JobState.PENDING
PROVISIONING = JobState.PROVISIONING
RUNNING = JobState.RUNNING
RECOVERING = JobState.RECOVERING
SUCCEEDED = JobState.SUCCEEDED
FAILED = JobState.FAILED
CANCELLED = JobState.CANCELLED

TERMINAL = frozenset(state for state in JobState if state.is_terminal)
ACTIVE = frozenset(state for state in JobState if state.is_active)

ALLOWED: dict[str, frozenset[str]] = {
    PENDING: frozenset({PROVISIONING, CANCELLED, FAILED}),
    PROVISIONING: frozenset({RUNNING, RECOVERING, FAILED, CANCELLED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, RECOVERING, CANCELLED}),
    RECOVERING: frozenset({PROVISIONING, FAILED, CANCELLED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}

# Why an attempt ended (docs/restart-log.md), and ``running`` for one that has not.
END_REASONS = frozenset(reason for reason in EndReason if reason.ends_attempt or reason == EndReason.RUNNING)
