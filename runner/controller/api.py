"""Endpoints for the CLI (admin token): jobs, logs, restarts, cancel, chaos, offers."""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from .. import ledger, wire
from ..protocol.environment import hide_values
from ..protocol.urls import redact
from ..providers.base import InjectsNotices, RefreshesPrices, default_checkpoint_url, gang_capacity
from ..scheduler.placement import PLACEMENT_EVENT
from ..scheduler.states import ALLOWED, TERMINAL
from ..spec import SpecError, validate_job
from ..spec.stored import stored_job
from ..state import ledger as stored_ledger, telemetry
from ..state.rows import Job
from ..state.store import NODE_RUNNING
from .auth import Principal, require_admin, require_job_access
from .reports import MAX_INT

router = APIRouter(prefix="/v1")
MAX_WORKDIR_BYTES = 256 << 20


def _state(request: Request):
    return request.app.state.controller


def _job_or_404(state, job_id: str) -> Job:
    job = state.store.job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}; `runner jobs` lists the jobs")
    return job


@router.get("/health")
def health(request: Request, who: Principal = Depends(require_admin)):
    return {"ok": True, "data_dir": str(_state(request).data_dir)}


@router.put("/workdirs")
async def upload_workdir(request: Request, who: Principal = Depends(require_admin)):
    """Store a gzipped tarball of a job's workdir, addressed by its sha256."""
    body = await request.body()
    if len(body) > MAX_WORKDIR_BYTES:
        raise HTTPException(413, f"workdir is {len(body) >> 20} MiB packed; the limit is 256 MiB")
    digest = hashlib.sha256(body).hexdigest()
    _state(request).workdirs.put(digest, body)
    return {"digest": digest, "bytes": len(body)}


WORKDIR_DIGEST = re.compile(r"[0-9a-f]{64}")  # what upload_workdir answers; it names a file under the data dir


class SubmitRequest(BaseModel):
    spec: dict
    workdir_digest: str | None = None


@router.post("/jobs", status_code=201)
def submit(body: SubmitRequest, request: Request, who: Principal = Depends(require_admin)):
    state = _state(request)
    spec = _runnable_spec(state, body.spec)
    if body.workdir_digest is not None and not WORKDIR_DIGEST.fullmatch(body.workdir_digest):
        raise HTTPException(422, f"workdir_digest: must be the sha256 that PUT /v1/workdirs answered (64 lowercase "
                                 f"hex digits), not a string of {len(body.workdir_digest)} characters")
    if body.workdir_digest and not state.workdirs.has(body.workdir_digest):
        raise HTTPException(422, "workdir_digest: upload the workdir first (PUT /v1/workdirs)")
    stored = stored_job(spec, body.workdir_digest)
    with state.store.db.transaction() as tx:
        job_id = _new_job_id(state.store, tx, spec.name)
        state.store.insert_job(tx, job_id, spec.name, stored, "PENDING", time.time())
    state.scheduler.nudge.set()
    return {"id": job_id}


JOB_ID_BYTES = 5  # 40 random bits: two of 10,000 submits with one name once collided on 24


def _new_job_id(store, tx, name: str) -> str:
    """``NAME-xxxxxxxxxx``, never one that exists: a collision draws again (one in 10**8 at 10,000 jobs)."""
    for _ in range(8):
        job_id = f"{name[:40]}-{secrets.token_hex(JOB_ID_BYTES)}"
        if store.job(job_id, tx) is None:
            return job_id
    raise RuntimeError("could not draw an unused job id in 8 tries")  # 2**-300: the random source is broken


class CheckRequest(BaseModel):
    spec: dict


@router.post("/jobs/check")
def check(body: CheckRequest, request: Request, who: Principal = Depends(require_admin)):
    """What a submit would refuse, without submitting (``runner validate``): the file, and the offers."""
    spec = _runnable_spec(_state(request), body.spec)
    return {"ok": True, "name": spec.name}


def _runnable_spec(state, raw: dict):
    """The job as validated, or the 422 that names why it is invalid or can never run here."""
    try:
        spec = validate_job(raw, "job")
    except SpecError as exc:
        raise HTTPException(422, "\n".join(exc.problems)) from None
    problem = unsatisfiable(state, spec) or gang_too_big(state, spec) or missing_durable_url(state, spec)
    if problem:
        raise HTTPException(422, problem)
    return spec


def unsatisfiable(state, spec) -> str | None:
    """Why no configured provider can ever run this job, or None."""
    from ..scheduler.policy import explain_unsatisfiable

    offers = [o for p in state.scheduler.providers.values() for o in p.offers()]
    return explain_unsatisfiable(offers, spec.resources)


def gang_too_big(state, spec) -> str | None:
    """Why ``resources.num_nodes`` nodes can never run together in one zone of an allowed provider, or None."""
    wanted = spec.resources.num_nodes
    if wanted <= 1:
        return None
    allowed = {name: p for name, p in state.scheduler.providers.items()
               if spec.resources.cloud is None or name in spec.resources.cloud}
    most = {name: gang_capacity(p) for name, p in allowed.items()}
    if any(capacity >= wanted for capacity in most.values()):
        return None
    limits = "; ".join(f"{name} holds at most {n} nodes of a gang in one zone"
                       + (" (clouds.local.zone_capacity in config.yaml)" if name == "local" else "")
                       for name, n in sorted(most.items()))
    return (f"resources.num_nodes: {wanted} nodes cannot run together in one zone: {limits}; "
            f"use at most {max(most.values(), default=1)} nodes, or raise the capacity")


def missing_durable_url(state, spec) -> str | None:
    """Why the job needs a checkpoint.durable_url it does not have, or None."""
    if spec.checkpoint.durable_url:
        return None
    for name, provider in state.scheduler.providers.items():
        allowed = spec.resources.cloud is None or name in spec.resources.cloud
        if allowed and default_checkpoint_url(provider, spec.name) is None:
            return (f"checkpoint.durable_url: required for a job that may run on {name}, where a node's disk goes "
                    f"with the node; set it to a bucket (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX), or set "
                    f"clouds.{name}.checkpoint_url in config.yaml as the default for every job")
    return None


# What `runner jobs` shows by default: the active jobs and those that ended in the last day, at most this many.
RECENT_SECONDS = 24 * 3600.0
DEFAULT_LIST_LIMIT = 100
HIDDEN_HEADER = "X-Runner-Jobs-Hidden"  # how many jobs the listing left out (the body stays a plain list)
ACTIVE_STATES = tuple(sorted(state for state in ALLOWED if state not in TERMINAL))


@router.get("/jobs")
def list_jobs(request: Request, state: list[str] | None = Query(None),
              limit: int | None = Query(None, ge=1, le=MAX_INT), everything: bool = Query(False, alias="all"),
              who: Principal = Depends(require_admin)):
    """The jobs, oldest first: by default the active ones and those ended in the last day (at most
    DEFAULT_LIST_LIMIT, the newest); ``state`` (repeatable) only those in it; ``all`` every job."""
    jobs, hidden = job_listing(_state(request).store, states=_states(state), limit=limit, everything=everything)
    # Plain JSON already: straight out, without FastAPI's generic encoder (4 s of 10,000 jobs' 8 s with --all).
    return JSONResponse(jobs, headers={HIDDEN_HEADER: str(hidden)})


def job_listing(store, *, states: tuple[str, ...] | None = None, limit: int | None = None,
                everything: bool = False, now: float | None = None) -> tuple[list[dict], int]:
    """The listing's job summaries and how many jobs it left out."""
    now = now or time.time()
    if limit is None and not everything:
        limit = DEFAULT_LIST_LIMIT
    recent = None if states or everything else now - RECENT_SECONDS
    jobs, total = store.job_listing(states=states, active=ACTIVE_STATES, ended_since=recent, limit=limit)
    attempts = store.attempts_of([job.id for job in jobs])
    summaries = [wire.job_summary(job, attempts[job.id], now) for job in jobs]
    running = [s["id"] for s in summaries if s["current_attempt"] is not None]
    if running:  # each current attempt as `runner status` shows it: with why it was placed, its launch failures
        events = store.running_attempts_events(running, ROW_EVENT_KINDS)
        for summary in summaries:
            if summary["current_attempt"] is not None:
                summary["current_attempt"] = annotated_rows([summary["current_attempt"]], events[summary["id"]])[0]
    return summaries, total - len(jobs)


def failure_summary(job: Job, attempts: list) -> str | None:
    """Of a FAILED job: why, with the last attempt's exit code, and where its output is; else None."""
    if job.state != "FAILED":
        return None
    last = next((a for a in reversed(attempts) if a.end_reason != "running"), None)
    why = (last.message if last is not None and last.message else None) or job.message or "the job failed"
    code = f" (exit code {last.exit_code})" if last is not None and last.exit_code is not None else ""
    return f"{why}{code}; `runner logs {job.id}` shows its output"


def _states(names: list[str] | None) -> tuple[str, ...] | None:
    if not names:
        return None
    wanted = tuple(dict.fromkeys(name.strip().upper() for name in names))
    unknown = [name for name in wanted if name not in ALLOWED]
    if unknown:
        raise HTTPException(422, f"state: {unknown[0]!r} is not a job state; use one of {', '.join(ALLOWED)}")
    return wanted


@router.get("/jobs/{job_id}")
def get_job(job_id: str, request: Request, who: Principal = Depends(require_job_access)):
    state = _state(request)
    job = _job_or_404(state, job_id)
    attempts = state.store.attempts(job_id)
    summary = wire.job_summary(job, attempts)
    if summary["current_attempt"] is not None:  # the running attempt's row as `runner restarts` shows it
        summary["current_attempt"] = restart_log(state.store, job, attempts)[-1]
    spans = stored_ledger.node_spans(state.store.db, job_id)
    summary["goodput"] = ledger.goodput(attempts, spans, time.time()).to_json()
    summary["spec"] = job.spec.model_dump(exclude={"env"})  # env may hold secrets: only its names
    summary["spec"]["env"] = sorted(job.spec.env)
    if job.spec.checkpoint.durable_url:  # so may the URL: its credentials show as ***
        summary["spec"]["checkpoint"]["durable_url"] = redact(job.spec.checkpoint.durable_url)
    failure = state.store.last_event(job_id, "checkpoint_failed")
    placed = state.store.last_event(job_id, PLACEMENT_EVENT)  # the cost policy's last choice, for a deadline job
    summary["cost_policy"] = placed.message if placed else None
    summary["manifest"] = _without_env_values(telemetry.latest_manifest(state.store.db, job_id), job.spec.env)
    summary["failure"] = failure_summary(job, state.store.attempts(job_id))
    summary["last_checkpoint_failure"] = ({"time": wire.iso(failure.time), "attempt": failure.attempt,
                                           "message": failure.message} if failure else None)
    nodes = state.store.nodes(job_id=job_id)
    summary["node"] = ({"id": nodes[-1].id, "state": nodes[-1].state, "zone": nodes[-1].offer.zone,
                        "last_heartbeat": wire.iso(nodes[-1].last_heartbeat), "progress": nodes[-1].progress}
                       if nodes else None)
    if job.num_nodes > 1:  # a gang: every live node, in rank order
        summary["num_nodes"] = job.num_nodes
        summary["nodes"] = [{"rank": n.rank, "id": n.id, "state": n.state, "zone": n.offer.zone,
                             "last_heartbeat": wire.iso(n.last_heartbeat), "progress": n.progress}
                            for n in sorted(nodes, key=lambda n: (n.rank, n.created_at))]
    return summary


def _without_env_values(manifest: dict | None, env: dict[str, str]) -> dict | None:
    """The run manifest with the job's env values in its argv shown as ``***`` (``run: python train.py --token
    $HF_TOKEN`` hands the training process the value itself)."""
    if not manifest or not manifest.get("argv"):
        return manifest
    return {**manifest, "argv": [hide_values(arg, env.values()) for arg in manifest["argv"]]}


@router.get("/jobs/{job_id}/restarts")
def restarts(job_id: str, request: Request, who: Principal = Depends(require_job_access)):
    state = _state(request)
    job = _job_or_404(state, job_id)
    return restart_log(state.store, job, state.store.attempts(job_id))


def restart_log(store, job: Job, attempts: list) -> list[dict]:
    """The job's restart-log rows (``attempts`` in order), each with its launch failures, notable events and, for a
    placement the cost policy chose, why it was chosen."""
    return annotated_rows(wire.restart_rows(attempts, elastic=job.spec.resources.elastic), store.events(job.id))


def annotated_rows(rows: list[dict], events: list) -> list[dict]:
    """Restart-log ``rows`` with what the job's ``events`` say of each attempt (of the kinds in ROW_EVENT_KINDS)."""
    failures: dict[int, list[str]] = {}
    notable: dict[int, list[dict]] = {}
    placed: dict[int, str] = {}
    for event in events:
        if event.kind == "launch-failed":
            failures.setdefault(event.attempt, []).append(event.message)
        elif event.kind in ATTEMPT_EVENT_KINDS:
            notable.setdefault(event.attempt, []).append(
                {"kind": event.kind, "time": wire.iso(event.time), "message": event.message})
        elif event.kind == PLACEMENT_EVENT:
            placed[event.attempt] = event.message
    return [{**_placement_first(row, placed.get(row["attempt"])),
             "launch_failures": failures.get(row["attempt"], []),
             "events": notable.get(row["attempt"], [])}
            for row in rows]


def _placement_first(row: dict, reason: str | None) -> dict:
    """A deadline job's row says first why its market was chosen (runner/costpolicy), then how it ended."""
    if reason:
        row["message"] = "; ".join(part for part in (reason, row["message"]) if part)
    return row


# Events shown on their attempt's restart-log row (state changes and log noise are not).
ATTEMPT_EVENT_KINDS = ("notice", "rebalance", "maintenance", "chaos")
# Every kind of event that a restart-log row shows.
ROW_EVENT_KINDS = ("launch-failed", PLACEMENT_EVENT, *ATTEMPT_EVENT_KINDS)


@router.get("/jobs/{job_id}/events")
def events(job_id: str, request: Request, after: int = Query(0, ge=0, le=MAX_INT),
           who: Principal = Depends(require_job_access)):
    state = _state(request)
    _job_or_404(state, job_id)
    return [{**e.to_json(), "time": wire.iso(e.time)} for e in state.store.events(job_id, after)]


@router.get("/jobs/{job_id}/logs")
def logs(job_id: str, request: Request, attempt: int = Query(ge=1, le=MAX_INT),
         offset: int = Query(0, ge=0, le=MAX_INT), node: int = Query(0, ge=0, le=MAX_INT),
         who: Principal = Depends(require_job_access)):
    """A slice of one attempt's output (of one node rank, for a multi-node job); ``complete`` once the
    attempt has ended and all of it was read."""
    state = _state(request)
    job = _job_or_404(state, job_id)
    attempts = {a.attempt: a for a in state.store.attempts(job_id)}
    if attempt not in attempts:
        raise HTTPException(404, f"job {job_id} has no attempt {attempt} (it has {len(attempts)})")
    if not 0 <= node < attempts[attempt].num_nodes and node not in {n.rank for n in attempts[attempt].nodes}:
        raise HTTPException(404, f"attempt {attempt} of job {job_id} has no node of rank {node}")
    data = state.logs.read(job_id, attempt, offset, node=node)
    ended = attempts[attempt].end_reason != "running" or job.state in TERMINAL
    size = state.logs.size(job_id, attempt, node)
    return {"attempt": attempt, "offset": offset + len(data), "data": data.decode("utf-8", "replace"),
            "complete": ended and offset + len(data) >= size}


@router.post("/jobs/{job_id}/cancel")
def cancel(job_id: str, request: Request, who: Principal = Depends(require_admin)):
    state = _state(request)
    with state.store.db.transaction() as tx:
        job = state.store.job(job_id, tx)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}; `runner jobs` lists the jobs")
        if job.state in TERMINAL:
            return {"id": job_id, "state": job.state, "changed": False}
        state.store.request_cancel(tx, job_id, time.time())
    state.scheduler.nudge.set()
    return {"id": job_id, "state": job.state, "changed": True}


class PreemptRequest(BaseModel):
    notice: str = "aws"  # or "none": the node vanishes without a notice
    node: int = 0  # the node rank of a multi-node job
    reclaim: bool = True  # False: a false notice (the node is not reclaimed at its deadline)
    rebalance: bool = False  # only an AWS rebalance recommendation: no notice, no reclaim


@router.post("/jobs/{job_id}/preempt")
def preempt(job_id: str, body: PreemptRequest, request: Request, who: Principal = Depends(require_admin)):
    """Chaos for the local provider: a notice through the node's metadata server, then the node's loss."""
    state = _state(request)
    job = _job_or_404(state, job_id)
    # Bad input first: it is bad whatever the job's state.
    if body.notice not in ("aws", "gcp", "azure", "none"):
        raise HTTPException(422, f"notice: {body.notice!r} is not one of aws, gcp, azure, none")
    if body.notice == "none" and (body.rebalance or not body.reclaim):
        raise HTTPException(422, "notice: none makes the node vanish; it takes neither rebalance nor reclaim: false")
    num_nodes = job.num_nodes
    live_ranks = {n.rank for n in state.store.nodes((NODE_RUNNING,), job_id=job_id) if n.attempt > 0}
    if not 0 <= body.node < num_nodes and body.node not in live_ranks:  # (an elastic gang's replacement: past them)
        ranks = "0" if num_nodes == 1 else f"0 to {num_nodes - 1}"
        raise HTTPException(422, f"node: job {job_id} has no node of rank {body.node}; its node ranks are {ranks}")
    if job.state in TERMINAL:  # as cancel says it
        raise HTTPException(409, f"{job_id} already ended ({job.state}); there is no node to preempt")
    nodes = [n for n in state.store.nodes((NODE_RUNNING,), job_id=job_id) if n.rank == body.node and n.attempt > 0]
    if not nodes:
        running = ", ".join(str(rank) for rank in sorted(live_ranks)) or "none"
        raise HTTPException(409, f"job {job_id} has no running node of rank {body.node} to preempt (its running "
                                 f"node ranks: {running}; an elastic gang's replacement takes a rank of its own)")
    node = nodes[-1]
    provider = state.scheduler.providers[node.provider]
    if not isinstance(provider, InjectsNotices):
        raise HTTPException(409, f"the {node.provider} provider cannot inject notices; only local can")
    if body.notice == "none":
        if not hasattr(provider, "vanish"):
            raise HTTPException(409, f"the {node.provider} provider cannot make a node vanish; only local can")
        provider.vanish(node.id)
        with state.store.db.transaction() as tx:
            state.store.add_event(tx, job_id, "chaos", f"node {node.id} (rank {node.rank}) vanished without a notice",
                                  attempt=node.attempt)
        state.scheduler.nudge.set()
        return {"node": node.id, "rank": node.rank, "notice": "none", "grace_seconds": None}
    if body.rebalance:
        if body.notice != "aws":
            raise HTTPException(422, "rebalance: a rebalance recommendation is an AWS signal; use notice aws")
        provider.inject_rebalance(node.id)
        with state.store.db.transaction() as tx:
            state.store.add_event(tx, job_id, "chaos", f"AWS rebalance recommendation sent to {node.id} "
                                  f"(rank {node.rank})", attempt=node.attempt)
        return {"node": node.id, "rank": node.rank, "notice": "aws-rebalance", "grace_seconds": None}
    grace = provider.inject_notice(node.id, body.notice, reclaim=body.reclaim)
    with state.store.db.transaction() as tx:
        if body.reclaim:
            state.store.update_node(tx, node.id, terminate_at=time.time() + grace)
        what = f"node reclaimed in {grace:.1f}s" if body.reclaim else "a false notice: the node is not reclaimed"
        state.store.add_event(tx, job_id, "chaos", f"{body.notice} notice sent to {node.id} (rank {node.rank}); "
                              f"{what}", attempt=node.attempt)
    return {"node": node.id, "rank": node.rank, "notice": body.notice, "grace_seconds": grace}


@router.get("/offers")
def offers(request: Request, accelerators: list[str] | None = Query(None), cloud: str | None = None,
           on_demand: bool = False, refresh: bool = False, who: Principal = Depends(require_admin)):
    """Offers of the configured providers that fit the filters, cheapest first (``refresh``: live prices now).

    ``accelerators`` may be repeated (or comma-separated): offers with any of them."""
    from ..scheduler.policy import filter_offers

    providers = _state(request).scheduler.providers.values()
    if refresh:
        for provider in providers:
            if isinstance(provider, RefreshesPrices):
                provider.refresh_prices()
    every = [o for p in providers for o in p.offers()]
    try:
        wanted = [part.strip() for text in accelerators or [] for part in text.split(",") if part.strip()]
        fitting = filter_offers(every, accelerators=wanted, cloud=cloud, on_demand=on_demand)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return [o.to_json() for o in fitting]
