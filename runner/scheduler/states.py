"""Job states and the explicit table of allowed changes between them."""

from __future__ import annotations

PENDING = "PENDING"
PROVISIONING = "PROVISIONING"
RUNNING = "RUNNING"
RECOVERING = "RECOVERING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"

TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE = frozenset({PROVISIONING, RUNNING})

ALLOWED: dict[str, frozenset[str]] = {
    PENDING: frozenset({PROVISIONING, CANCELLED, FAILED}),
    PROVISIONING: frozenset({RUNNING, RECOVERING, FAILED, CANCELLED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, RECOVERING, CANCELLED}),
    RECOVERING: frozenset({PROVISIONING, FAILED, CANCELLED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}

# Why an attempt ended (docs/restart-log.md).
# "moved": the cost policy stopped it to move the job from on-demand back to spot (runner/scheduler/spot_return.py).
END_REASONS = frozenset({"succeeded", "failed", "preempted", "lost", "drill", "cancelled", "moved", "running"})
