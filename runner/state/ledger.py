"""Reads and writes of the ledger: how long each attempt's start took on its node(s), when it trained, and
how long every node of a job was paid for (runner/ledger.py turns them into gaps and goodput).

An attempt's ``boot_seconds``, ``setup_seconds`` and ``restore_seconds`` are its own for a single node; a
gang keeps each node rank's in ``attempt_nodes`` and the attempt's is the slowest node's. The first and last
training step keep the earliest and the newest reported, so reports that arrive out of order (a retry) or
from two processes of one attempt never move them the wrong way.
"""

from __future__ import annotations

from .db import Database, Tx

START_PHASES = ("boot_seconds", "setup_seconds", "restore_seconds")


def record_start_phase(tx: Tx, job_id: str, attempt: int, rank: int, phase: str, seconds: float,
                       keep_first: bool = False) -> None:
    """One node's ``phase`` (boot, setup or restore) for an attempt; ``keep_first``: a value already recorded
    stays (a boot is measured at the node's first registration only), else the largest is kept."""
    if phase not in START_PHASES:
        raise ValueError(f"unknown start phase {phase!r}")
    keep = (f"COALESCE({phase}, ?)" if keep_first else
            f"CASE WHEN {phase} IS NULL OR {phase} < ? THEN ? ELSE {phase} END")
    values = (seconds,) if keep_first else (seconds, seconds)
    ranked = tx.execute(f"UPDATE attempt_nodes SET {phase} = {keep} WHERE job_id = ? AND attempt = ? AND rank = ?",
                        (*values, job_id, attempt, rank))
    if ranked:  # a gang's attempt: the slowest node's
        tx.execute(f"UPDATE attempts SET {phase} = (SELECT MAX({phase}) FROM attempt_nodes WHERE job_id = ? "
                   "AND attempt = ?) WHERE job_id = ? AND attempt = ?", (job_id, attempt, job_id, attempt))
    else:
        tx.execute(f"UPDATE attempts SET {phase} = {keep} WHERE job_id = ? AND attempt = ?",
                   (*values, job_id, attempt))


def record_registration(tx: Tx, job_id: str, attempt: int, rank: int, boot_seconds: float | None) -> None:
    """A node joins an attempt: its boot (launch to this, its first registration; the first value recorded for
    the attempt stays). None: the node was up already (a drill's restart, a gang's kept node, an agent that
    registers again): it booted 0 s for this attempt, and runs no setup for it either."""
    record_start_phase(tx, job_id, attempt, rank, "boot_seconds", boot_seconds or 0.0, keep_first=True)
    if boot_seconds is None:
        record_start_phase(tx, job_id, attempt, rank, "setup_seconds", 0.0)  # the largest stays: a setup that ran


def record_steps(tx: Tx, job_id: str, attempt: int, *, first: tuple[int, float] | None = None,
                 last: tuple[int, float] | None = None) -> None:
    """The attempt's first and last training step, each ``(step, unix time)``: the earliest first and the
    newest last reported are kept."""
    if first is not None:
        tx.execute("UPDATE attempts SET first_step = ?, first_step_at = ? WHERE job_id = ? AND attempt = ? "
                   "AND (first_step_at IS NULL OR first_step_at > ?)", (*first, job_id, attempt, first[1]))
    if last is not None:
        tx.execute("UPDATE attempts SET last_step = ?, last_step_at = ? WHERE job_id = ? AND attempt = ? "
                   "AND (last_step_at IS NULL OR last_step_at <= ?)", (*last, job_id, attempt, last[1]))


def node_spans(db: Database, job_id: str) -> list[tuple[float, float | None]]:
    """Every node the job ever had, standbys and draining ones included: (launched, released or None). A node whose
    launch the cloud refused (it never had a cloud id nor a launch time) never ran and is not billed."""
    rows = db.query("SELECT created_at, terminated_at FROM nodes WHERE job_id = ? AND NOT (launched_at IS NULL "
                    "AND provider_ref IS NULL AND terminated_at IS NOT NULL) ORDER BY created_at", (job_id,))
    return [(float(r["created_at"]), None if r["terminated_at"] is None else float(r["terminated_at"]))
            for r in rows]
