"""Reads and writes of job telemetry (docs/restart-log.md): per-attempt training figures and run manifests.

An attempt's ``steps`` and ``nan_steps`` only grow (the training's counters do, within an attempt): a report
that arrives late, after a newer one, never takes them back, and ``steps_per_second`` is taken only from a
report at least as far along as the stored one. ``peak_memory_gb`` keeps the largest reported, so the nodes of
a multi-node attempt each report their own and the row shows the largest. A field a report leaves out stays.
"""

from __future__ import annotations

import json

from .db import Database, Tx


def record_telemetry(tx: Tx, job_id: str, attempt: int, *, steps: int | None = None,
                     steps_per_second: float | None = None, nan_steps: int | None = None,
                     peak_memory_gb: float | None = None) -> None:
    # Every column on the right is the row's value before this update (both databases).
    tx.execute(
        """UPDATE attempts SET
               steps_per_second = CASE WHEN COALESCE(?, steps, 0) >= COALESCE(steps, 0)
                                       THEN COALESCE(?, steps_per_second) ELSE steps_per_second END,
               steps = CASE WHEN steps IS NULL OR steps < ? THEN ? ELSE steps END,
               nan_steps = CASE WHEN nan_steps IS NULL OR nan_steps < ? THEN ? ELSE nan_steps END,
               peak_memory_gb = CASE WHEN peak_memory_gb IS NULL OR peak_memory_gb < ? THEN ? ELSE peak_memory_gb END
           WHERE job_id = ? AND attempt = ?""",
        (steps, steps_per_second, steps, steps, nan_steps, nan_steps, peak_memory_gb, peak_memory_gb,
         job_id, attempt),
    )


def set_manifest(tx: Tx, job_id: str, attempt: int, manifest: dict) -> bool:
    """Record an attempt's run manifest unless it has one (the first restore's); True when stored now."""
    return tx.execute("INSERT INTO attempt_manifests (job_id, attempt, manifest) VALUES (?,?,?) "
                      "ON CONFLICT (job_id, attempt) DO NOTHING",
                      (job_id, attempt, json.dumps(manifest, sort_keys=True))) == 1


def latest_manifest(db: Database, job_id: str) -> dict | None:
    """The manifest of the job's newest attempt that reported one."""
    rows = db.query("SELECT manifest FROM attempt_manifests WHERE job_id = ? ORDER BY attempt DESC LIMIT 1",
                    (job_id,))
    return json.loads(rows[0]["manifest"]) if rows else None
