"""The rows of the controller's tables as frozen dataclasses, one per table, typed whichever database read them.

Each class has one ``from_row`` that turns a database row (a dict) into it: a REAL column becomes a float, a
flag a bool, a JSON column its decoded value (typed where it has a type: a job's spec a ``StoredJob``, a
node's offer an ``Offer``, an attempt's notice a ``Notice``), and ``cancel_requested`` (0 for "never") a timestamp or None,
so no field changes type by accident. A column that a later migration adds and the class does not know yet
is ignored. The fields are in the table's column order and ``from_row`` passes them by position: a controller
with 2,000 nodes builds many rows a second, and keyword arguments cost 10-15 % more per row
(tests/state/test_rows.py checks that every field comes from its own column).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from ..spec.stored import StoredJob, load_stored_job
from .values import Notice, Offer

Row = Mapping[str, Any]

_loads = json.loads


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    name: str
    spec: StoredJob  # the validated job file (with the uploaded ``workdir_digest``), fixed at submit
    state: str
    created_at: float
    updated_at: float
    ended_at: float | None
    preemptions: int
    failures: int
    step: int
    checkpoint: dict | None  # the last committed checkpoint's report (step, attempt, time, ...)
    cancel_requested: float | None  # when the user asked to cancel; None while not asked
    message: str | None

    @classmethod
    def from_row(cls, row: Row) -> Job:
        ended_at, checkpoint, cancel = row["ended_at"], row["checkpoint"], row["cancel_requested"]
        return cls(row["id"], row["name"], load_stored_job(row["spec"]), row["state"], float(row["created_at"]),
                   float(row["updated_at"]), None if ended_at is None else float(ended_at), row["preemptions"],
                   row["failures"], row["step"], _loads(checkpoint) if checkpoint else None,
                   float(cancel) if cancel else None, row["message"])

    @property
    def num_nodes(self) -> int:
        """How many nodes each attempt runs on (``resources.num_nodes``; more than one: a gang)."""
        return self.spec.resources.num_nodes


@dataclass(frozen=True, slots=True)
class AttemptNode:
    """One node rank of a gang's attempt (``attempt_nodes``)."""

    job_id: str
    attempt: int
    rank: int
    node_id: str
    zone: str | None
    instance_type: str | None
    spot: bool
    price_per_hour: float
    address: str | None
    registered_at: float | None
    exit_reason: str | None
    exit_code: int | None
    end_reason: str
    boot_seconds: float | None = None  # the ledger: this node's start for the attempt (0: kept from the last)
    setup_seconds: float | None = None
    restore_seconds: float | None = None
    joined_at: float | None = None  # an elastic gang's replacement: when it was launched into the running attempt
    left_at: float | None = None    # an elastic gang's node that left the running attempt (preempted or lost)
    # when the node said every training process of it had finished and exited while its launcher still ran (its part
    # of the attempt succeeded: runner/scheduler/gang.py, reported_end)
    ranks_finished_at: float | None = None

    @classmethod
    def from_row(cls, row: Row) -> AttemptNode:
        registered_at = row["registered_at"]
        return cls(row["job_id"], row["attempt"], row["rank"], row["node_id"], row["zone"], row["instance_type"],
                   bool(row["spot"]), float(row["price_per_hour"]), row["address"],
                   None if registered_at is None else float(registered_at), row["exit_reason"], row["exit_code"],
                   row["end_reason"], _float_or_none(row["boot_seconds"]), _float_or_none(row["setup_seconds"]),
                   _float_or_none(row["restore_seconds"]), _float_or_none(row.get("joined_at")),
                   _float_or_none(row.get("left_at")), _float_or_none(row.get("ranks_finished_at")))


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job, a row of the restart log. A gang's (``num_nodes`` > 1) carries its ranks in
    ``nodes``, in rank order, when read by ``Store.attempts``."""

    job_id: str
    attempt: int
    node_id: str | None
    cloud: str | None
    region: str | None
    zone: str | None
    instance_type: str | None
    spot: bool
    price_per_hour: float
    started_at: float
    running_at: float | None
    ended_at: float | None
    end_reason: str
    notice: Notice | None
    checkpoint_step: int | None
    resumed_from_step: int
    lost_seconds: float | None
    exit_code: int | None
    drill: dict | None
    message: str | None
    num_nodes: int
    master_port: int | None
    steps: int | None
    steps_per_second: float | None
    peak_memory_gb: float | None
    nan_steps: int | None
    first_step: int | None  # the ledger (runner/ledger.py): the attempt's first and last training step and when
    first_step_at: float | None
    last_step: int | None
    last_step_at: float | None
    boot_seconds: float | None  # its start: a gang's slowest node's (each node's in ``nodes``)
    setup_seconds: float | None
    restore_seconds: float | None
    nodes: tuple[AttemptNode, ...] = ()
    standby: dict | None = None  # the replacement prepared while this attempt ran (runner/state/standbys.py)
    # An elastic gang's world sizes within the attempt, [{"step", "world_size"}, ...] (runner/state/elastic.py),
    # and the newest generation the training side reported
    world_sizes: list | None = None
    world_generation: int = 0

    @classmethod
    def from_row(cls, row: Row, nodes: tuple[AttemptNode, ...] = ()) -> Attempt:
        running_at, ended_at, notice, lost = row["running_at"], row["ended_at"], row["notice"], row["lost_seconds"]
        drill, rate, memory = row["drill"], row["steps_per_second"], row["peak_memory_gb"]
        return cls(row["job_id"], row["attempt"], row["node_id"], row["cloud"], row["region"], row["zone"],
                   row["instance_type"], bool(row["spot"]), float(row["price_per_hour"]), float(row["started_at"]),
                   None if running_at is None else float(running_at), None if ended_at is None else float(ended_at),
                   row["end_reason"], Notice.from_json(_loads(notice)) if notice else None, row["checkpoint_step"],
                   row["resumed_from_step"], None if lost is None else float(lost), row["exit_code"],
                   _loads(drill) if drill else None, row["message"], row["num_nodes"], row["master_port"],
                   row["steps"], None if rate is None else float(rate), None if memory is None else float(memory),
                   row["nan_steps"], row["first_step"], _float_or_none(row["first_step_at"]), row["last_step"],
                   _float_or_none(row["last_step_at"]), _float_or_none(row["boot_seconds"]), _float_or_none(row["setup_seconds"]),
                   _float_or_none(row["restore_seconds"]), nodes,
                   _loads(row["standby"]) if row.get("standby") else None,
                   _loads(row["world_sizes"]) if row.get("world_sizes") else None, row.get("world_generation") or 0)


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    job_id: str
    attempt: int
    provider: str
    state: str
    token_hash: str
    offer: Offer  # the provider's offer it was launched from
    spot: bool
    provider_ref: str | None
    created_at: float
    registered_at: float | None
    last_heartbeat: float | None
    progress: dict | None  # the newest heartbeat's phase and training progress
    terminate_at: float | None
    terminated_at: float | None
    rank: int
    launched_at: float | None = None  # when the provider was asked for it: the node exists and is billed from then
    first_registered_at: float | None = None  # its agent's first registration (``registered_at``: the latest)
    setup_started_at: float | None = None  # the job's `setup` on this node (0 s long for a job without one)
    setup_ended_at: float | None = None
    prepared_for: int | None = None  # a prepared replacement (attempt 0): the attempt it may take over from
    ready_at: float | None = None     # when a prepared replacement's agent had run setup

    @classmethod
    def from_row(cls, row: Row) -> Node:
        registered_at, last_heartbeat, progress = row["registered_at"], row["last_heartbeat"], row["progress"]
        terminate_at, terminated_at = row["terminate_at"], row["terminated_at"]
        return cls(row["id"], row["job_id"], row["attempt"], row["provider"], row["state"], row["token_hash"],
                   Offer.from_json(_loads(row["offer"])), bool(row["spot"]), row["provider_ref"], float(row["created_at"]),
                   None if registered_at is None else float(registered_at),
                   None if last_heartbeat is None else float(last_heartbeat), _loads(progress) if progress else None,
                   None if terminate_at is None else float(terminate_at),
                   None if terminated_at is None else float(terminated_at), row["rank"],
                   _float_or_none(row["launched_at"]), _float_or_none(row["first_registered_at"]),
                   _float_or_none(row["setup_started_at"]), _float_or_none(row["setup_ended_at"]),
                   row.get("prepared_for"), _float_or_none(row.get("ready_at")))

    @property
    def boot_seconds(self) -> float | None:
        """From the launch to its agent's first registration (a VM's boot and the agent's start)."""
        if self.launched_at is None or self.first_registered_at is None:
            return None
        return round(max(0.0, self.first_registered_at - self.launched_at), 3)

    @property
    def setup_seconds(self) -> float | None:
        """How long the job's `setup` took on this node (0 for a job without one; None: not ended, or unknown)."""
        if self.setup_started_at is None or self.setup_ended_at is None:
            return None
        return round(max(0.0, self.setup_ended_at - self.setup_started_at), 3)


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    job_id: str
    attempt: int | None
    time: float
    kind: str
    from_state: str | None
    to_state: str | None
    message: str | None

    @classmethod
    def from_row(cls, row: Row) -> Event:
        return cls(row["id"], row["job_id"], row["attempt"], float(row["time"]), row["kind"], row["from_state"],
                   row["to_state"], row["message"])

    def to_json(self) -> dict:
        """Every field, in the table's order (``GET /v1/jobs/{id}/events`` shows ``time`` as ISO-8601)."""
        return {"id": self.id, "job_id": self.job_id, "attempt": self.attempt, "time": self.time, "kind": self.kind,
                "from_state": self.from_state, "to_state": self.to_state, "message": self.message}
