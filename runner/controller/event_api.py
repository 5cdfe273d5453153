"""The agent's reports (POST /v1/agent/events): notices, durable checkpoints, restores, telemetry, setup
timing, the handover, a gang node's ranks finished, messages. Answered by the front door
(runner/controller/front_door.py): on a shared database (Postgres) each report is written with the others that
arrive meanwhile, in one transaction on a thread of its own (runner/controller/group_commit.py), and answered once
that commits; on SQLite, and for the handover, a replacement's ``ready``, a gang's start ahead and a gang node's ranks
finished (which take their own transaction), each runs in a transaction of its own on the loop's threads."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import structlog
from fastapi import HTTPException

from ..scheduler import elastic, gang_prestart, standby
from ..scheduler.attempts import hand_over
from ..protocol.events import NOTICE_KINDS, EventKind
from ..state.checkpoints import CheckpointReport
from ..state.standbys import PREPARED
from ..state.values import Notice
from ..wire import SetupReport
from . import gang_agent, metrics, reports, telemetry
from .auth import live_node, node_caller, node_token_hash
from .front_door import AWAITED, LeanRoute, json_object
from .group_commit import Outcome, all_at_once

# What an agent's notice report adds for the controller alone (kept out of the restart log's notice): whether
# it trains on while a replacement gets ready, and how long it expects its emergency checkpoint to take.
PREPARE_FIELDS = ("prepare", "checkpoint_seconds")

EVENTS_PATH = "/v1/agent/events"
log = structlog.get_logger(__name__)


async def agent_event(state, authorization: str, body: bytes) -> dict:
    """Record one report of the calling node's attempt; ``accepted`` says whether it was kept."""
    loop = asyncio.get_running_loop()
    if _takes_its_own_transaction(body):
        return await loop.run_in_executor(None, own_transaction_report, state, authorization, body)
    if state.report_commits is None:  # SQLite: a transaction of its own, on a thread
        return await loop.run_in_executor(None, report_alone, state, authorization, body)
    token_hash = node_token_hash(authorization, state)  # a missing or admin token is refused before the wait
    answer, then = await state.report_commits.run(ReportRequest(token_hash, body))
    if then is not None:  # after the commit, as on SQLite
        await loop.run_in_executor(None, then)
    return answer


def own_transaction_report(state, authorization: str, body: bytes) -> dict:
    """The handover, a replacement's ``ready``, a gang's start ahead and a gang node's ranks finished: each takes a
    transaction of its own (the last may end the attempt)."""
    node = node_caller(authorization, state)
    kind, data = _event(json_object(body))
    if kind == EventKind.READY:  # a prepared replacement has run setup: the node on notice may stop now
        return {"accepted": standby.mark_ready(state.store, node)}
    if kind == EventKind.PRESTART:  # a gang node's next attempt started ahead: how far it got
        return {"accepted": gang_prestart.record_report(state.store, node, data, time.time())}
    if kind == EventKind.RANKS_FINISHED:  # a gang node's part is done, its launcher still running: may end the attempt
        message = data.get("message")
        return gang_agent.ranks_finished(state, node, message if isinstance(message, str) else None)
    reports.step(data.get("step"), "data.step")
    new_state = hand_over(state.store, node, data["step"])
    if new_state is not None:
        state.scheduler.nudge.set()  # launch the next attempt now
    return {"accepted": new_state is not None}


def _takes_its_own_transaction(body: bytes) -> bool:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(value, dict) and value.get("kind") in (EventKind.HANDOVER, EventKind.READY, EventKind.PRESTART,
                                                             EventKind.RANKS_FINISHED)


def report_alone(state, authorization: str, body: bytes) -> dict:
    with state.store.db.transaction() as tx:
        answer, then = record_report(state, authorization, body, tx)
    if then is not None:
        then()
    return answer


@dataclass(frozen=True)
class ReportRequest:
    """A report as it waits for its group: the caller's token hash and the body."""

    token_hash: str
    body: bytes


def record_reports(state, tx, requests: Sequence[ReportRequest]) -> list[Outcome]:
    """The report lane's ``write_group``: the callers' nodes in one read; the group's durable checkpoints all at
    once (:func:`_write_checkpoints`), then every other report (runner/controller/group_commit.py, ``all_at_once``).
    A report refused for its token or its body (a 401, a 422) is answered without writing anything.

    The checkpoints go first, wherever they stand in the group: no other report of this lane starts an attempt or
    moves a job's step, so what a checkpoint's fence and step compare with is the same either way. In a group of
    checkpoints alone (the common case) their statement is the transaction's last, and goes out with its COMMIT
    (``metrics.record_commits``): the group takes two round trips on Postgres."""
    nodes = state.store.nodes_by_token_hashes(tx, list(dict.fromkeys(r.token_hash for r in requests)))
    outcomes: list[Outcome | None] = [None] * len(requests)
    checkpoints: list[tuple[int, CheckpointReport]] = []
    others: list[tuple[int, Callable]] = []
    for i, request in enumerate(requests):
        try:
            node = live_node(nodes.get(request.token_hash))
            kind, data = _event(json_object(request.body))
            if kind != EventKind.CHECKPOINT:
                others.append((i, functools.partial(_record_for, state, node, request.body)))
                continue
            report = _checkpoint_report(node, data)
        except HTTPException as refused:
            outcomes[i] = (False, refused)
            continue
        if report is None:
            outcomes[i] = (True, ({"accepted": False}, None))
        else:
            checkpoints.append((i, report))
    written = _write_checkpoints(state, tx, [report for _, report in checkpoints], last=not others)
    for (i, _), outcome in zip(checkpoints, written):
        outcomes[i] = outcome
    if others:
        for (i, _), outcome in zip(others, all_at_once(tx, [work for _, work in others])):
            outcomes[i] = outcome
    return outcomes  # type: ignore[return-value]


def _record_for(state, node, body: bytes, tx):
    return record_report(state, "", body, tx, node=node)


def _checkpoint_report(node, data: dict) -> CheckpointReport | None:
    """A checkpoint report as the store takes it; None for one the controller does not keep (not on the durable
    tier: it does not survive the node). A step that is not one is refused (422)."""
    reports.step(data.get("step"), "data.step")
    if not data.get("durable"):
        return None
    checkpoint = {**data, "attempt": node.attempt, "time": data.get("time", time.time())}
    return CheckpointReport(node.job_id, node.attempt, checkpoint,
                            metrics.commit_measurement(node.job_id, node.attempt, checkpoint))


def _write_checkpoints(state, tx, checkpoints: list[CheckpointReport], last: bool = False) -> list[Outcome]:
    """A group's checkpoints and their commit seconds at once, in a savepoint (metrics.record_commits); where that
    fails, each in a savepoint of its own, so one report's error loses only its own write. ``last``: nothing follows
    in ``tx`` (its COMMIT may go out with them; where the statement fails, it does not, and the fallback runs in the
    transaction still open). A COMMIT that fails fails every statement after it and the transaction's end: the
    whole group is then answered with that error (runner/controller/group_commit.py)."""
    if not checkpoints:
        return []
    try:
        recorded = metrics.record_commits(state.store, tx, checkpoints, last=last)
        return [(True, ({"accepted": accepted}, None)) for accepted in recorded.accepted]
    except Exception as exc:
        if len(checkpoints) == 1:
            return [(False, exc)]
    outcomes: list[Outcome] = []
    for checkpoint in checkpoints:
        try:
            recorded = metrics.record_commits(state.store, tx, [checkpoint])
        except Exception as exc:  # this report's own error: its savepoint undid its writes
            outcomes.append((False, exc))
            continue
        outcomes.append((True, ({"accepted": recorded.accepted[0]}, None)))
    return outcomes


def _record_checkpoint(state, tx, checkpoint: CheckpointReport) -> bool:
    ok, value = _write_checkpoints(state, tx, [checkpoint])[0]
    if not ok:
        raise value
    return value[0]["accepted"]


def record_report(state, authorization: str, body: bytes, tx, node=None) -> tuple[dict, Callable[[], None] | None]:
    """Any report but the handover and ``ready``, written in ``tx`` (every read in it too: a group holds the write
    lock); with what to do once it is committed (prepare a replacement), if anything. ``node``: the caller's, where
    already read (else read from ``authorization``)."""
    node = node or node_caller(authorization, state, tx)
    kind, data = _event(json_object(body))
    job_id, attempt = node.job_id, node.attempt
    if kind == EventKind.TELEMETRY:  # frequent: stored on the attempt, never as an event
        telemetry.record_report(tx, job_id, attempt, data, rank=node.rank)
        return {"accepted": True}, None
    if kind == EventKind.SETUP:  # on the node's row (when it is ready) and the ledger's setup phase of the attempt
        return {"accepted": _record_setup(state, tx, node, data)}, None
    if kind == EventKind.MANIFEST:
        return {"accepted": telemetry.record_manifest(tx, job_id, attempt, data)}, None
    if kind == EventKind.CHECKPOINT:
        report = _checkpoint_report(node, data)
        return {"accepted": report is not None and _record_checkpoint(state, tx, report)}, None
    if kind in NOTICE_KINDS:
        metrics.record_notice(tx, job_id, attempt, data)
    if kind == "notice":
        notice = Notice.from_json({k: v for k, v in metrics.without_timing(data).items() if k not in PREPARE_FIELDS})
        if state.store.job(job_id, tx).num_nodes > 1:
            notice = notice.with_rank(node.rank)
        state.store.add_event(tx, job_id, "notice", f"{data.get('source')} {data.get('action')} "
                              f"notice, deadline {data.get('deadline')}", attempt=attempt)
        # An elastic gang trains on without the node where enough remain (the attempt is then not on notice);
        # otherwise the notice is the attempt's, and its heartbeat tells the node to checkpoint and stop
        if elastic.node_leaves(state.store, state.scheduler.providers, job_id, attempt, node.rank, "preempted",
                               f"node {node.id} (rank {node.rank}) got a {data.get('source')} notice", tx=tx):
            return {"accepted": True}, state.scheduler.nudge.set  # launch its replacement now
        state.store.set_attempt_notice(tx, job_id, attempt, notice)
        if elastic.is_elastic(state.store.job(job_id, tx)):
            return {"accepted": True}, None
    else:
        if kind == "restored":
            _record_restored_step(state, tx, job_id, attempt, data)
            elastic.record_first_world_size(state.store, tx, node, data)
        state.store.add_event(tx, job_id, kind, str(data.get("message", data)), attempt=attempt)
    prepares = (kind == "notice" and data.get("prepare")) or kind == "rebalance"  # as _prepare_replacement asks
    return {"accepted": True}, functools.partial(_prepare_replacement, state, node, kind, data) if prepares else None


def _prepare_replacement(state, node, kind: str, data: dict) -> None:
    """A notice whose deadline leaves time (the agent trains on: ``prepare``), or an AWS rebalance
    recommendation: launch the replacement now where the job's ``recovery.prepare_on`` asks for it."""
    try:
        if kind == "notice" and data.get("prepare"):
            deadline = data.get("deadline_unix")
            standby.prepare(state.scheduler, node, standby.NOTICE,
                            deadline=float(deadline) if isinstance(deadline, (int, float)) else None)
        elif kind == "rebalance":
            standby.prepare(state.scheduler, node, standby.REBALANCE)
    except Exception:  # the report is kept; with no replacement the node on notice is told to stop now
        log.exception("preparing a replacement failed", job=node.job_id, kind=kind)


ROUTE = LeanRoute(agent_event, max_body=1 << 20, runs=AWAITED)


def _event(body: dict) -> tuple[str, dict]:
    """``kind`` (notice | checkpoint | restored | telemetry | manifest | setup | handover | message) and ``data``,
    refused (422) naming the field as FastAPI would."""
    kind, data = body.get("kind"), body.get("data", {})
    if kind is None:
        raise HTTPException(422, "body.kind: Field required")
    if not isinstance(kind, str):
        raise HTTPException(422, "body.kind: Input should be a valid string")
    if not isinstance(data, dict):
        raise HTTPException(422, "body.data: Input should be a valid dictionary")
    return kind, data


def _record_restored_step(state, tx, job_id: str, attempt: int, data: dict) -> None:
    """A restore that fell short of the handed-over step is written into the restart log, never hidden."""
    step, expected = data.get("step"), data.get("expected")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return
    if isinstance(expected, int) and not isinstance(expected, bool) and 0 <= step < expected:
        state.store.set_resumed_from(tx, job_id, attempt, step)
        state.store.add_event(tx, job_id, "message", f"the checkpoint of step {expected} was missing or did not "
                              f"verify; resumed from step {step} instead", attempt=attempt)


def _record_setup(state, tx, node, data: dict) -> bool:
    """When the job's `setup` started and ended on the calling node (the restart log's ``setup_seconds``)."""
    try:
        report = SetupReport.from_json(data)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    state.store.record_setup(tx, node.id, report.started_at, report.ended_at)
    # A prepared replacement sets up before its attempt exists: its node row keeps the times, and the attempt
    # that takes it over reads them there (runner/scheduler/standby.py's take_over).
    prepared = node.attempt == PREPARED and node.prepared_for is not None
    if not prepared:
        telemetry.record_setup(tx, node.job_id, node.attempt, report.to_json(), rank=node.rank)
    if report.ended_at is not None and report.exit_code is not None:  # a job without setup reports 0 s, no code
        how = "" if report.exit_code == 0 else f", exit code {report.exit_code}"
        whose = " (the prepared replacement)" if prepared else ""
        state.store.add_event(tx, node.job_id, "setup", f"setup on node {node.id}{whose} took "
                              f"{report.ended_at - report.started_at:.1f}s{how}",
                              attempt=node.prepared_for if prepared else node.attempt)
    return True
