"""The agent's telemetry reports, checked and stored (docs/restart-log.md).

A ``telemetry`` report: ``{"steps", "steps_per_second", "nan_steps", "peak_memory_bytes", "restore_seconds",
"first_step", "first_step_at", "last_step", "last_step_at"}``, each optional (a step with its time).
A ``setup`` report: ``{"started_at", "ended_at"}``, the job's setup on a new node (``ended_at`` null while it runs).
A ``manifest`` report: ``{"manifest": {...}}``; only the contract's keys are kept, with bounded sizes, so
a node cannot fill the database through it. A value of the wrong kind is a 422 naming the field.
The job's figures derived from them (steps/s, $/1000 steps) are computed in runner/wire.py.
"""

from __future__ import annotations

import math

from fastapi import HTTPException

from ..state import ledger, telemetry as stored
from .reports import MAX_INT

BYTES_PER_GB = 1e9
MANIFEST_KEYS = ("git_commit", "git_dirty", "python", "torch", "cuda", "gpus", "packages_sha256", "argv")
MAX_TEXT = 200  # characters of one manifest string
MAX_ITEMS = 256  # entries of a manifest list (argv, gpus)


def _count(value, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise HTTPException(422, f"{key}: a count must be a whole number from 0 (got {str(value)[:40]!r})")
    return value


def _rate(value, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise HTTPException(422, f"{key}: a rate must be a finite number from 0 (got {str(value)[:40]!r})")
    return float(value)


def _step_at(data: dict, which: str) -> tuple[int, float] | None:
    """``(step, unix time)`` of the report's ``{which}_step`` and ``{which}_step_at``, both or neither."""
    step = _count(data.get(f"{which}_step"), f"data.{which}_step")
    at = _rate(data.get(f"{which}_step_at"), f"data.{which}_step_at")
    if (step is None) != (at is None):
        raise HTTPException(422, f"data.{which}_step and data.{which}_step_at: send both or neither")
    return None if step is None else (step, at)


def record_report(tx, job_id: str, attempt: int, data: dict, rank: int = 0) -> None:
    """Store one ``telemetry`` report of node ``rank`` on the attempt."""
    peak = _count(data.get("peak_memory_bytes"), "data.peak_memory_bytes")
    restore = _rate(data.get("restore_seconds"), "data.restore_seconds")
    first, last = _step_at(data, "first"), _step_at(data, "last")
    stored.record_telemetry(
        tx, job_id, attempt,
        steps=_count(data.get("steps"), "data.steps"),
        steps_per_second=_rate(data.get("steps_per_second"), "data.steps_per_second"),
        nan_steps=_count(data.get("nan_steps"), "data.nan_steps"),
        peak_memory_gb=None if peak is None else round(peak / BYTES_PER_GB, 3))
    ledger.record_steps(tx, job_id, attempt, first=first, last=last)
    if restore is not None:
        ledger.record_start_phase(tx, job_id, attempt, rank, "restore_seconds", round(restore, 3))


def record_setup(tx, job_id: str, attempt: int, data: dict, rank: int = 0) -> None:
    """Store how long the job's ``setup`` took on node ``rank`` for the attempt, once it has ended."""
    started = _rate(data.get("started_at"), "data.started_at")
    ended = _rate(data.get("ended_at"), "data.ended_at")
    if started is None:
        raise HTTPException(422, "data.started_at: required, when the setup started (unix seconds)")
    if ended is not None and ended < started:
        raise HTTPException(422, "data.ended_at: not before data.started_at (or null while the setup runs)")
    if ended is not None:
        ledger.record_start_phase(tx, job_id, attempt, rank, "setup_seconds", round(ended - started, 3))


def _text(value) -> str | None:
    return None if value is None else str(value)[:MAX_TEXT]


def clean_manifest(manifest) -> dict:
    """The contract's keys of a reported manifest, bounded; a manifest that is not an object is a 422."""
    if not isinstance(manifest, dict):
        raise HTTPException(422, "data.manifest: expected an object with git_commit, python, torch, ...")
    lists = {key: manifest.get(key) if isinstance(manifest.get(key), list) else None for key in ("gpus", "argv")}
    dirty = manifest.get("git_dirty")
    return {
        "git_commit": _text(manifest.get("git_commit")),
        "git_dirty": dirty if isinstance(dirty, bool) else None,
        "python": _text(manifest.get("python")),
        "torch": _text(manifest.get("torch")),
        "cuda": _text(manifest.get("cuda")),
        "gpus": None if lists["gpus"] is None else [_text(g) for g in lists["gpus"][:MAX_ITEMS]],
        "packages_sha256": _text(manifest.get("packages_sha256")),
        "argv": None if lists["argv"] is None else [str(a)[:4 * MAX_TEXT] for a in lists["argv"][:MAX_ITEMS]],
    }


def record_manifest(tx, job_id: str, attempt: int, data: dict) -> bool:
    return stored.set_manifest(tx, job_id, attempt, clean_manifest(data.get("manifest")))

