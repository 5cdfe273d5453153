"""Endpoints for agents (node tokens): register, log offset, exit, workdir, drill (the heartbeat, log chunks and
events, sent most often, are answered in front of the framework: heartbeat_api.py, log_api.py, event_api.py).

The job is always taken from the token's node row, never from the request body.
"""

from __future__ import annotations

import time

import structlog
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, Field

from ..providers.base import default_checkpoint_url
from ..scheduler.attempts import catch_up, close_drained, end_attempt
from ..scheduler.spot_return import finish_move
from ..scheduler import failures
from ..scheduler.drill import drill_due, record_drill_result, restart_after_drill
from ..scheduler.standby import release_failed_standby
from ..scheduler.states import FAILED, PROVISIONING, RUNNING, TERMINAL
from ..ledger import boot_seconds
from ..state import ledger
from ..state.rows import Node
from ..state.standbys import PREPARED
from ..state.store import NODE_LAUNCHING, NODE_RUNNING
from ..scheduler.transitions import InvalidTransition, transition
from ..protocol.actions import Action, RegisterStatus
from ..protocol.events import AGENT_EXIT_REASONS, EndReason
from ..scheduler import gang_prestart
from ..scheduler.gang import gpus_per_node
from . import gang_agent, reports
from .gang_agent import node_accelerators
from .agent_wheel import WheelUnavailable
from .auth import Principal, require_node

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/v1/agent")


def _state(request: Request):
    return request.app.state.controller


class WorldChanged(BaseModel):
    generation: int = Field(ge=1, le=reports.MAX_INT, strict=True)
    step: int = Field(ge=0, le=reports.MAX_INT, strict=True)
    world_size: int = Field(ge=1, le=1 << 20, strict=True)
    previous_world_size: int | None = Field(default=None, ge=1, le=1 << 20, strict=True)


@router.post("/world")
def world_changed(body: WorldChanged, request: Request, who: Principal = Depends(require_node)):
    """An elastic gang's ranks moved to a new world at ``step``: appended to the attempt's ``world_sizes``. The
    job and attempt are the token's node's (a node's token reaches only its own job)."""
    from ..scheduler.elastic import record_world_change

    accepted = record_world_change(_state(request).store, who.node, body.generation, body.step, body.world_size,
                                   body.previous_world_size)
    return {"accepted": accepted}


class Registration(BaseModel):
    address: str | None = None  # where the other nodes of a gang reach this node


@router.post("/register")
def register(request: Request, who: Principal = Depends(require_node), body: Registration | None = None):
    """The node's assignment: what to run, where to checkpoint, what to resume from.

    A gang node gets ``{"status": "waiting"}`` until every node of its attempt has registered."""
    state = _state(request)
    address = body.address if body else None
    if who.node.attempt == PREPARED and who.node.prepared_for is not None:
        return _prepared_registration(state, who.node, address)
    if state.store.job(who.node.job_id).num_nodes > 1:
        attempt, wait = gang_agent.register(state, who.node, address or "127.0.0.1")
        return wait or _assignment(state, who.node.job_id, attempt, who.node, address)
    attempt = register_single_node(state, who.node)
    if attempt is None:
        raise HTTPException(409, "this node's attempt has ended; shut down")
    return _assignment(state, who.node.job_id, attempt, who.node, address)


def register_single_node(state, node: Node) -> int | None:
    """A single node's agent registered: its attempt runs (and its job); None when that attempt has ended."""
    now = time.time()
    with state.store.db.transaction() as tx:
        # Read inside the write: the attempt can end meanwhile (its node found gone), and a registration for the
        # attempt read before that would walk the job back to RUNNING with no attempt running (it would wait forever).
        attempt = state.store.current_attempt(node.job_id, tx)
        if attempt is None or attempt.attempt != node.attempt:
            return None
        job_id = node.job_id
        ledger.record_registration(tx, job_id, attempt.attempt, node.rank,
                                   boot_seconds(node.created_at, node.registered_at is not None, now))
        state.store.update_node(tx, node.id, registered_at=now, last_heartbeat=now)
        state.store.note_first_registration(tx, node.id, now)
        state.store.mark_attempt_running(tx, job_id, attempt.attempt, now)
        # PENDING or RECOVERING still when the launch's answer has not been applied yet: the node is up all the same
        if catch_up(tx, job_id, state.store.job(job_id, tx).state, RUNNING, attempt.attempt, now) == PROVISIONING:
            transition(tx, job_id, RUNNING, now=now, message=f"attempt {attempt.attempt} running")
    return attempt.attempt


def _prepared_registration(state, node: Node, address: str | None = None) -> dict:
    """A replacement prepared while the job still trains (runner/scheduler/standby.py): before it is ready, what
    to set up (the job as its next attempt will run it); once ready, to wait for the handover."""
    job = state.store.job(node.job_id)
    if job is None or job.state in TERMINAL or node.state not in (NODE_LAUNCHING, NODE_RUNNING):
        raise HTTPException(409, "this prepared node is no longer needed; shut down")
    now = time.time()
    with state.store.db.transaction() as tx:
        state.store.update_node(tx, node.id, registered_at=node.registered_at or now, last_heartbeat=now)
        state.store.note_first_registration(tx, node.id, now)  # the end of its boot, for the ledger
    if node.ready_at is None:
        assignment = _assignment(state, job.id, node.prepared_for + 1, node)
        # Its process may start before the handover and wait in restore() (agents/prestart.py) where the job is
        # known to restore through runner.checkpoint: the running attempt reported a restore.
        running = next((a for a in state.store.attempts(job.id) if a.attempt == node.prepared_for), None)
        assignment["prestart"] = running is not None and running.restore_seconds is not None and job.num_nodes == 1
        if job.num_nodes > 1:  # a gang's: only with the next attempt's gang, where it is started ahead on every node
            restored = state.store.last_event(job.id, "restored")  # (a gang's restore time comes later, batched)
            restores = running is not None and (running.restore_seconds is not None or (
                restored is not None and restored.attempt == running.attempt))
            prestart = gang_prestart.note_address(state.store, node, address, restores)
            gang = prestart and gang_prestart.gang_for(state.store, job, node.prepared_for, prestart, node.rank,
                                                       gpus_per_node(node_accelerators(node, job.spec.resources)))
            assignment["gang"], assignment["prestart"] = gang or None, bool(gang)
        return {"status": RegisterStatus.PREPARE, "assignment": assignment}
    return {"status": RegisterStatus.WAITING, "retry_seconds": 0.2,
            "message": "ready; waiting for the job's node on notice to hand over"}


def _assignment(state, job_id: str, attempt: int, node: Node, address: str | None = None,
                gang: dict | None = None) -> dict:
    """What an attempt runs, where it checkpoints, what it resumes from, whether it drills, its gang (``gang``: an
    attempt not created yet, whose processes start ahead: runner/scheduler/gang_prestart.py)."""
    job = state.store.job(job_id)
    spec = job.spec
    drill_seconds = spec.recovery.resume_drill_seconds()
    prepared = node.attempt == PREPARED  # setting up for an attempt not created yet: no gang fields, no port
    if gang is None and not prepared:
        gang = gang_agent.gang_fields(state, job, attempt, node, address)
    if gang is not None and (gang["node_rank"] != 0 or gang.get("elastic_join")):
        drill_seconds = None  # the drill runs once for the whole gang: node 0 drives it
    extra = {}
    if gang is not None and gang["num_nodes"] > 1:
        if (expected := gang_agent.drill_expected_step(state, job_id, attempt)) is not None:
            extra["drill_expected_step"] = expected
    placement = {"cloud": node.offer.cloud, "zone": node.offer.zone, "instance_type": node.offer.instance_type,
                 "spot": bool(node.spot)}
    return {**extra, "gang": gang, "placement": placement,
        "job_id": job.id,
        "attempt": attempt,
        "name": job.name,
        "setup": spec.setup,
        "run": spec.run,
        "env": dict(spec.env),
        "has_workdir": bool(spec.workdir_digest),
        "checkpoint": {
            "local_dir": spec.checkpoint.local_dir,
            "durable_url": spec.checkpoint.durable_url or _default_durable_url(state, node),
            "interval": spec.checkpoint.interval,
            "keep": spec.checkpoint.keep,
            "resume": job.checkpoint,
        },
        "resume_drill_seconds": drill_seconds if drill_due(state.store.attempts(job_id)) else None,
    }


def _default_durable_url(state, node: Node) -> str | None:
    """The node's provider default (submit refused jobs that could land where there is none)."""
    return default_checkpoint_url(state.scheduler.providers.get(node.provider), node.job_id)


@router.get("/workdir")
def workdir(request: Request, who: Principal = Depends(require_node)):
    state = _state(request)
    digest = state.store.job(who.node.job_id).spec.workdir_digest
    if not digest or not state.workdirs.has(digest):
        raise HTTPException(404, "this job has no workdir")
    return StreamingResponse(state.workdirs.stream(digest), media_type="application/gzip")


@router.get("/wheel")
def agent_wheel(request: Request, who: Principal = Depends(require_node)):
    """This controller's own wheel, which a cloud node's bootstrap script installs the runner from."""
    try:
        path = _state(request).agent_wheel.path()
    except WheelUnavailable as exc:
        log.error("agent wheel unavailable", node=who.node.id, error=str(exc))
        raise HTTPException(503, f"this controller cannot serve its wheel: {exc}") from None
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


@router.get("/logs/offset")
def log_offset(request: Request, who: Principal = Depends(require_node)):
    return {"offset": _state(request).logs.size(who.node.job_id, who.node.attempt, node=who.node.rank)}


class ExitReport(BaseModel):
    exit_code: int | None = None
    reason: str  # one of runner.protocol.events.AGENT_EXIT_REASONS
    message: str | None = None
    drill: dict | None = None  # reason drill: {"checkpoint_step", "seconds"} or {"passed": false, "message"}
    failure_kind: str | None = None  # reason failed: a FailureKind when no relaunch can fix it


@router.post("/exit")
def exit_report(body: ExitReport, request: Request, who: Principal = Depends(require_node)):
    """The job's process ended: close the attempt and move the job on (a drill continues on this node).

    A report the job's state cannot take (it has moved on in a way no report should meet) is a 409 that says
    so, logged: never a 500, and the job is left as it was."""
    try:
        return _exit_report(body, request, who)
    except InvalidTransition as exc:
        log.warning("exit report refused: the job's state cannot take it", node=who.node.id, job=who.node.job_id,
                    attempt=who.node.attempt, reason=body.reason, error=str(exc))
        raise HTTPException(409, f"this exit report ({body.reason}) does not fit the job's state now: {exc}; "
                                 "it was not applied") from None


def _exit_report(body: ExitReport, request: Request, who: Principal) -> dict:
    state = _state(request)
    if body.reason not in AGENT_EXIT_REASONS:
        raise HTTPException(422, f"reason: {body.reason!r} is not one of {', '.join(AGENT_EXIT_REASONS)}")
    if who.node.attempt == PREPARED and who.node.prepared_for is not None:  # its setup failed: it is not needed
        release_failed_standby(state.store, who.node, body.exit_code, body.message)
        state.scheduler.nudge.set()
        return {"state": None}
    if state.store.job(who.node.job_id).num_nodes > 1:
        return gang_agent.exit_report(state, who.node, body.reason, body.exit_code, body.message, body.drill)
    if body.reason == EndReason.STOPPED_BY_PEER:
        raise HTTPException(422, f"reason: '{EndReason.STOPPED_BY_PEER}' is for a node of a multi-node job only")
    if body.reason == "drill":
        return _drill_exit(state, who.node, body)
    if body.reason == EndReason.MOVED:
        new_state = finish_move(state.store, who.node, body.exit_code, body.message)
    elif body.reason == "failed" and failures.is_permanent(body.failure_kind):
        new_state = _end_permanent_failure(state, who.node, body)
    else:
        new_state = end_attempt(state.store, who.node.job_id, who.node.attempt, body.reason,
                                exit_code=body.exit_code, message=body.message)
    if new_state is None:
        close_drained(state.store, who.node, body.exit_code)  # a handed-over attempt's process has exited
    state.scheduler.nudge.set()
    return {"state": new_state}


def _end_permanent_failure(state, node: Node, body: ExitReport) -> str | None:
    """A failure no relaunch can fix: the job ends FAILED now, saying what failed and why it is not relaunched."""
    current = state.store.current_attempt(node.job_id)
    peak = current.peak_memory_gb if current is not None and current.attempt == node.attempt else None
    message = failures.failure_message(body.failure_kind, body.message, peak)
    log.warning("the job failed in a way no relaunch can fix", job=node.job_id, attempt=node.attempt,
                kind=body.failure_kind, why=message)
    return end_attempt(state.store, node.job_id, node.attempt, "failed", exit_code=body.exit_code, message=message,
                       force_state=FAILED, trained_nothing=failures.trained_nothing(body.failure_kind))


def _drill_exit(state, node: Node, body: ExitReport) -> dict:
    drill = body.drill or {}
    if drill.get("passed") is False:  # no checkpoint was taken: the drill attempt ends and the job fails
        new_state = end_attempt(state.store, node.job_id, node.attempt, "drill", exit_code=body.exit_code,
                                drill=drill, message=f"resume drill failed: {drill.get('message')}",
                                force_state=FAILED)
        state.scheduler.nudge.set()
        return {"state": new_state}
    reports.step(drill.get("checkpoint_step"), "drill.checkpoint_step")
    attempt = restart_after_drill(state.store, node, int(drill["checkpoint_step"]), float(drill.get("seconds", 0)),
                                  exit_code=body.exit_code)
    if attempt is None:
        return {"state": None}
    next_assignment = {**_assignment(state, node.job_id, attempt, node), "drill_expected_step": drill["checkpoint_step"]}
    return {"state": RUNNING, "next": next_assignment}


class DrillResult(BaseModel):
    passed: bool | None
    checkpoint_step: int | None = Field(default=None, ge=0, le=reports.MAX_INT)
    resumed_step: int | None = Field(default=None, ge=0, le=reports.MAX_INT)
    seconds: float | None = None
    message: str | None = None
    ranks: dict[str, int | None] | None = None  # of a gang: each global rank's restored step on this node


@router.post("/drill")
def drill_result(body: DrillResult, request: Request, who: Principal = Depends(require_node)):
    """The drill's verdict, from the attempt that resumed (or, when skipped, from the running one)."""
    state = _state(request)
    if state.store.job(who.node.job_id).num_nodes > 1:
        new_state = gang_agent.record_drill(state, who.node, body.model_dump(exclude_none=True))
    else:
        new_state = record_drill_result(state.store, who.node, body.model_dump(exclude={"ranks"}))
    state.scheduler.nudge.set()
    return {"state": new_state, "action": Action.SHUTDOWN if new_state == FAILED else Action.CONTINUE}


def peer_prestart(state, node: dict) -> dict | None:
    """The next attempt's assignment for a kept node of a gang on notice, once it is to start that attempt ahead
    (runner/scheduler/gang_prestart.py); None otherwise. ``node``: the heartbeat's view of it."""
    if node.get("rank") is None:
        return None
    prestart = gang_prestart.peer_may_start(state.store, node["job_id"], node["attempt"], node["rank"])
    if prestart is None:
        return None
    job, row = state.store.job(node["job_id"]), state.store.node(node["id"])
    if job is None or row is None:
        return None
    gang = gang_prestart.gang_for(state.store, job, node["attempt"], prestart, node["rank"],
                                  gpus_per_node(node_accelerators(row, job.spec.resources)))
    if gang is None:
        return None
    return {**_assignment(state, job.id, node["attempt"] + 1, row, gang=gang), "prestart": True}
