"""Shapes that cross processes: timestamps, and the JSON views of jobs and attempts (CONTRACT §1, §4)."""

from __future__ import annotations

import time
from datetime import datetime, timezone


def iso(ts: float | None) -> str | None:
    """Unix seconds as ISO-8601 UTC with a trailing Z."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def attempt_cost(attempt: dict, now: float | None = None) -> float:
    """Per-second billing from launch to end (or to now for the running attempt)."""
    end = attempt["ended_at"] or now or time.time()
    return round(attempt["price_per_hour"] * max(0.0, end - attempt["started_at"]) / 3600.0, 6)


def restart_row(attempt: dict, now: float | None = None) -> dict:
    """One row of the restart log."""
    row = {
        "attempt": attempt["attempt"],
        "node": attempt["node_id"],
        "cloud": attempt["cloud"],
        "region": attempt["region"],
        "zone": attempt["zone"],
        "instance_type": attempt["instance_type"],
        "spot": attempt["spot"],
        "price_per_hour": attempt["price_per_hour"],
        "started_at": iso(attempt["started_at"]),
        "ended_at": iso(attempt["ended_at"]),
        "end_reason": attempt["end_reason"],
        "notice": attempt["notice"],
        "checkpoint_step": attempt["checkpoint_step"],
        "resumed_from_step": attempt["resumed_from_step"],
        "lost_seconds": attempt["lost_seconds"],
        "cost_usd": attempt_cost(attempt, now),
        "exit_code": attempt["exit_code"],
        "message": attempt["message"],
    }
    if attempt.get("drill") is not None:
        row["drill"] = attempt["drill"]
    return row


def job_summary(job: dict, attempts: list[dict], now: float | None = None) -> dict:
    """A job as ``runner jobs --json`` and ``runner status --json`` show it."""
    now = now or time.time()
    current = attempts[-1] if attempts and attempts[-1]["end_reason"] == "running" else None
    return {
        "id": job["id"],
        "name": job["name"],
        "state": job["state"],
        "attempts": len(attempts),
        "preemptions": job["preemptions"],
        "failures": job["failures"],
        "step": job["step"],
        "cost_usd": round(sum(attempt_cost(a, now) for a in attempts), 6),
        "created_at": iso(job["created_at"]),
        "updated_at": iso(job["updated_at"]),
        "ended_at": iso(job["ended_at"]),
        "age_seconds": round(now - job["created_at"], 1),
        "message": job["message"],
        "checkpoint": job["checkpoint"],
        "current_attempt": restart_row(current, now) if current else None,
        "cancel_requested": bool(job["cancel_requested"]),
    }
