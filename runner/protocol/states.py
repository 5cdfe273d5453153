"""The states of a job and of a node, as the controller stores them. The allowed changes between job states are
the scheduler's (runner/scheduler/states.py)."""

from __future__ import annotations

from .enums import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        """The job is over: no attempt will follow."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @property
    def is_active(self) -> bool:
        """An attempt of the job is launching or running."""
        return self in (JobState.PROVISIONING, JobState.RUNNING)


class NodeState(StrEnum):
    LAUNCHING = "launching"      # row written, provider launch may or may not have happened
    RUNNING = "running"          # provider confirmed the launch
    DRAINING = "draining"        # its attempt was handed over; released at its exit report
    TERMINATING = "terminating"  # release requested
    TERMINATED = "terminated"    # provider confirmed it is gone

    @property
    def is_up(self) -> bool:
        """Launched or launching, and not being given up: it may run (or be about to run) a job."""
        return self in (NodeState.LAUNCHING, NodeState.RUNNING)

    @property
    def is_released(self) -> bool:
        """Its release was asked for or is done."""
        return self in (NodeState.TERMINATING, NodeState.TERMINATED)
