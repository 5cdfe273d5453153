"""Reads behind the cost policy: each zone's observed spot preemptions, over every job's restart log."""

from __future__ import annotations

from .db import Database


def zone_preemptions(db: Database, since: float, now: float) -> dict[str, tuple[int, float]]:
    """Per zone, (spot preemptions, seconds of spot held) of attempts started since ``since``.

    A node lost without a notice counts as a preemption; the running attempt counts up to ``now``."""
    rows = db.query(
        """SELECT zone,
                  SUM(CASE WHEN end_reason IN ('preempted', 'lost') THEN 1 ELSE 0 END) AS preemptions,
                  SUM(COALESCE(ended_at, ?) - started_at) AS seconds
           FROM attempts WHERE spot = 1 AND started_at >= ? AND zone IS NOT NULL GROUP BY zone""",
        (now, since),
    )
    return {row["zone"]: (int(row["preemptions"] or 0), max(0.0, float(row["seconds"] or 0.0))) for row in rows}
