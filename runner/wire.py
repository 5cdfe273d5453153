"""Shapes that cross processes over HTTP: timestamps, the setup report, and the JSON views of jobs and attempts
(docs/restart-log.md). The names they carry (actions, event kinds, end reasons, states) are runner/protocol's."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from . import ledger
from .protocol.events import EndReason


# What a standby record keeps for the controller alone, not shown in the restart log: a gang's next attempt started
# ahead (runner/scheduler/gang_prestart.py), its rendezvous port and its nodes' progress.
CONTROLLER_ONLY_STANDBY_FIELDS = frozenset({"prestart"})


def iso(ts: float | None) -> str | None:
    """Unix seconds as ISO-8601 UTC with a trailing Z."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# An agent's report (POST /v1/agent/events, kind ``setup``) of the job's `setup` on its node: once when it starts
# (``ended_at`` null) and once when it ends. Setup runs on every new node, before `run`; a node kept for a gang's
# next attempt, or a drill's restart on the same node, does not run it again. A new node of a job without setup
# reports one of 0 s: ``setup_ended_at`` set means the node is ready to run the job. Restart-log rows show it as
# ``setup_seconds``.
@dataclass(frozen=True)
class SetupReport:
    started_at: float  # unix seconds, the node's clock
    ended_at: float | None = None
    exit_code: int | None = None

    def to_json(self) -> dict:
        return {"started_at": self.started_at, "ended_at": self.ended_at, "exit_code": self.exit_code}

    @classmethod
    def from_json(cls, data: dict) -> "SetupReport":
        """Raise ValueError naming the field that is missing or of the wrong type."""
        started, ended, code = data.get("started_at"), data.get("ended_at"), data.get("exit_code")
        if not _is_time(started):
            raise ValueError("data.started_at: a unix time in seconds is required")
        if ended is not None and (not _is_time(ended) or ended < started):
            raise ValueError("data.ended_at: a unix time in seconds, not before data.started_at, or null")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise ValueError("data.exit_code: a whole number or null")
        return cls(float(started), None if ended is None else float(ended), code)


def _is_time(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e11


# The restart log and job summaries as JSON, from the controller's rows (runner/state/rows.py: Attempt, Job; not
# imported here, since the agent imports this module and never the controller's state).
def _iso_ms(ts: float | None) -> str | None:
    """ISO-8601 UTC to the millisecond: a standby's launch and the handover are often within one second."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def attempt_cost(attempt: Attempt, now: float | None = None) -> float:
    """Per-second billing from launch to end (or to now for the running attempt), summed over every node."""
    end = attempt.ended_at or now or time.time()
    if not attempt.nodes:
        return round(attempt.price_per_hour * max(0.0, end - attempt.started_at) / 3600.0
                     + standby_cost(attempt, now), 6)
    # each node billed while it was in the attempt (an elastic gang's nodes join and leave)
    seconds = [(n.price_per_hour, max(0.0, min(end, n.left_at or end) - max(attempt.started_at, n.joined_at or 0.0)))
               for n in attempt.nodes]
    return round(sum(price * s for price, s in seconds) / 3600.0 + standby_cost(attempt, now), 6)


def standby_cost(attempt: Attempt, now: float | None = None) -> float:
    """A replacement prepared during this attempt is billed from its launch until it took over (its own attempt
    bills it from then) or was released; a node still preparing, until now."""
    standby = attempt.standby
    if not standby or not standby.get("launched_at"):
        return 0.0
    end = standby.get("took_over_at") or standby.get("released_at") or now or time.time()
    return float(standby.get("price_per_hour") or 0.0) * max(0.0, end - standby["launched_at"]) / 3600.0


def node_rows(attempt: Attempt) -> list[dict]:
    """The restart-log ``nodes`` of a multi-node attempt: one object per node rank."""
    return [{"rank": n.rank, "node": n.node_id, "zone": n.zone, "instance_type": n.instance_type,
             "price_per_hour": n.price_per_hour, "spot": n.spot, "end_reason": n.end_reason,
             "boot_seconds": n.boot_seconds, "setup_seconds": n.setup_seconds, "restore_seconds": n.restore_seconds,
             **({"joined_at": iso(n.joined_at), "left_at": iso(n.left_at)} if n.joined_at or n.left_at else {})}
            for n in attempt.nodes]


def restart_rows(attempts: list[Attempt], now: float | None = None, elastic: bool = False) -> list[dict]:
    """The restart log: the job's attempts in order, each with its gap from the training before it
    (``elastic``: the job is an elastic gang, whose every row has ``world_sizes``)."""
    gap = ledger.gaps(attempts)
    return [restart_row(a, now, gap_seconds=gap[a.attempt], elastic=elastic) for a in attempts]


def restart_row(attempt: Attempt, now: float | None = None, gap_seconds: float | None = None,
                elastic: bool = False) -> dict:
    """One row of the restart log (``gap_seconds`` needs the attempts before it: see :func:`restart_rows`)."""
    row = {
        "attempt": attempt.attempt,
        "node": attempt.node_id,
        "cloud": attempt.cloud,
        "region": attempt.region,
        "zone": attempt.zone,
        "instance_type": attempt.instance_type,
        "spot": attempt.spot,
        "price_per_hour": attempt.price_per_hour,
        "started_at": iso(attempt.started_at),
        "ended_at": iso(attempt.ended_at),
        "end_reason": attempt.end_reason,
        "notice": attempt.notice.to_json() if attempt.notice else None,
        "checkpoint_step": attempt.checkpoint_step,
        "resumed_from_step": attempt.resumed_from_step,
        "lost_seconds": attempt.lost_seconds,
        "cost_usd": attempt_cost(attempt, now),
        "exit_code": attempt.exit_code,
        "message": attempt.message,
        "steps": attempt.steps,
        "peak_memory_gb": attempt.peak_memory_gb,
        "nan_steps": attempt.nan_steps,
        "gap_seconds": gap_seconds,
        "boot_seconds": attempt.boot_seconds,
        "setup_seconds": attempt.setup_seconds,
        "restore_seconds": attempt.restore_seconds,
    }
    if attempt.drill is not None:
        row["drill"] = attempt.drill
    if attempt.standby is not None:  # the replacement prepared while this attempt trained (its times in ISO)
        row["standby"] = {k: _iso_ms(v) if k.endswith("_at") or k == "deadline" else v
                          for k, v in attempt.standby.items() if k not in CONTROLLER_ONLY_STANDBY_FIELDS}
    if attempt.num_nodes > 1:
        row["num_nodes"] = attempt.num_nodes
        row["nodes"] = node_rows(attempt)
    if elastic or attempt.world_sizes is not None or any(n.joined_at or n.left_at for n in attempt.nodes):
        # an elastic gang's: each change with its step ([] until its training has reported its first world)
        row["world_sizes"] = attempt.world_sizes or []
    return row


def latest_rate(attempts: list[Attempt]) -> float | None:
    """The job's newest reported steps/s: its current attempt's, else the last attempt's that reported one."""
    return next((a.steps_per_second for a in reversed(attempts) if a.steps_per_second is not None), None)


def cost_per_1000_steps(cost_usd: float, steps_kept: int) -> float | None:
    """USD per 1,000 of the steps the job has kept (its last committed step); None before any."""
    return round(cost_usd / steps_kept * 1000, 6) if steps_kept else None


def job_summary(job: Job, attempts: list[Attempt], now: float | None = None) -> dict:
    """A job as ``runner jobs --json`` and ``runner status --json`` show it."""
    now = now or time.time()
    current = attempts[-1] if attempts and attempts[-1].end_reason == EndReason.RUNNING else None
    current_gap = ledger.gaps(attempts)[current.attempt] if current else None
    cost = round(sum(attempt_cost(a, now) for a in attempts), 6)
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "attempts": len(attempts),
        "preemptions": job.preemptions,
        "failures": job.failures,
        "step": job.step,
        "cost_usd": cost,
        "steps_per_second": latest_rate(attempts),
        "cost_per_1000_steps": cost_per_1000_steps(cost, job.step),
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
        "ended_at": iso(job.ended_at),
        "age_seconds": round(now - job.created_at, 1),
        "message": job.message,
        "checkpoint": job.checkpoint,
        "current_attempt": (restart_row(current, now, gap_seconds=current_gap, elastic=job.spec.resources.elastic)
                            if current else None),
        "cancel_requested": bool(job.cancel_requested),
    }
