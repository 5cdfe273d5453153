"""What a job's page shows, gathered from the store: its restart log on a timeline, the drill, cost, logs."""

from __future__ import annotations

import time
from datetime import datetime

from .. import wire
from ..protocol.events import NOTICE_KINDS
from ..scheduler.states import TERMINAL
from ..state import web_sessions
from ..state.rows import Attempt
from . import timeline



def job_page(store, status: dict, now: float | None = None) -> dict:
    """The job's page, from its status (``GET /v1/jobs/JOB``, so fields added there show up here)."""
    now = now or time.time()
    job_id = status["id"]
    attempts = store.attempts(job_id)
    events = store.events(job_id)
    restored = _restored_at(events)
    rows = [{**row, "started": a.started_at, "ended": a.ended_at, "first_step_at": a.first_step_at,
             "last_step_at": a.last_step_at, "restored_at": restored.get(a.attempt)}
            for a, row in zip(attempts, wire.restart_rows(attempts, now, elastic=_elastic(store, job_id)))]
    return {
        "job": status,
        "terminal": status["state"] in TERMINAL,
        "rows": rows,
        "timeline": timeline.layout(rows, _notices(events, attempts),
                                    web_sessions.checkpoint_commits(store.db, job_id), now),
        "legend": timeline.LEGEND,
        "drills": [drill_verdict(r) for r in rows if r.get("drill")],
        "lost_seconds": sum(r["lost_seconds"] or 0.0 for r in rows),
        "logs": [source for r in rows for source in _log_sources(r)],
    }


def _elastic(store, job_id: str) -> bool:
    job = store.job(job_id)
    return job is not None and job.spec.resources.elastic


def _log_sources(row: dict) -> list[dict]:
    """The logs of an attempt: one, or one per node rank of a multi-node attempt, named by where it ran."""
    nodes = {n["rank"]: n for n in row.get("nodes") or []}
    if (row.get("num_nodes") or 1) == 1:
        return [{"attempt": row["attempt"], "node": 0,
                 "label": f"attempt {row['attempt']} · {row['zone']} · {row['end_reason']}"}]
    return [{"attempt": row["attempt"], "node": rank,
             "label": f"attempt {row['attempt']} · node {rank} · {nodes.get(rank, row)['zone']} · "
                      f"{nodes.get(rank, row)['end_reason']}"}
            for rank in range(row["num_nodes"])]


def drill_verdict(row: dict) -> dict:
    """The resume drill of a restart-log row in words: ``{"attempt", "outcome", "detail"}``."""
    drill = row["drill"]
    passed = drill.get("passed")
    if passed is None:
        outcome = "skipped" if drill.get("message") else "under way"
        detail = drill.get("message") or f"a checkpoint of step {drill.get('checkpoint_step')} is being restored"
    elif passed:
        outcome = "passed"
        seconds = drill.get("seconds")
        detail = (f"the emergency checkpoint of step {drill.get('checkpoint_step')} was restored at step "
                  f"{drill.get('resumed_step')}" + (f" in {seconds:.1f} s" if seconds is not None else ""))
    else:
        outcome = "failed"
        detail = drill.get("message") or "the job did not resume from its checkpoint"
    return {"attempt": row["attempt"], "outcome": outcome, "detail": detail}


def _restored_at(events) -> dict[int, float]:
    """Per attempt, when its training first reported its restore (where the restore phase ends)."""
    restored: dict[int, float] = {}
    for event in events:
        if event.kind == "restored" and event.attempt is not None:
            restored.setdefault(event.attempt, event.time)
    return restored


def _notices(events, attempts: list[Attempt]) -> dict[int, list[dict]]:
    """Per attempt, the notices it received (a gang's at the rank that received it)."""
    ranks = {a.attempt: a.notice.node_rank if a.notice else None for a in attempts}
    notices: dict[int, list[dict]] = {}
    for event in events:
        if event.kind in NOTICE_KINDS and event.attempt is not None:
            notices.setdefault(event.attempt, []).append(
                {"time": event.time, "title": event.message, "node_rank": ranks.get(event.attempt)})
    for attempt in attempts:  # a notice recorded on the attempt whose event was not kept
        notice = attempt.notice
        if attempt.attempt not in notices and notice and notice.received_at:
            received = _unix(notice.received_at)
            if received is not None:
                notices[attempt.attempt] = [{"time": received, "node_rank": notice.node_rank,
                                                "title": f"{notice.source} {notice.action} notice"}]
    return notices


def _unix(value) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
