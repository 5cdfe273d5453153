"""The reconciler: small workers, one per kind of pending work, each load → decide → apply.

Launches are here; watching running nodes is :mod:`.node_watch`, releasing nodes :mod:`.releases`, gangs
:mod:`.gang_workers`. No worker waits on a cloud: provider calls go out through :mod:`.cloud_calls`.

Every step is idempotent and keyed on rows written *before* the side effect (a node row exists
before its launch), so the controller can be killed at any moment and, once restarted, neither
loses nor duplicates a job, an attempt or a node.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import structlog

from ..providers.base import LaunchRequest, NodeBootstrap, Provider
from ..providers.errors import ProviderError
from ..state import Store
from ..state.rows import Attempt, Job, Node
from ..state.store import NODES_HOLDING_A_JOB, NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATED, NODE_TERMINATING
from ..costpolicy import observe
from ..state.spot_history import zone_preemptions
from . import elastic, placement
from .attempts import end_attempt, release_standbys
from .gang import GANG_FORM_SECONDS
from .cloud_calls import DESCRIBE_WORKERS, LAUNCH_WORKERS, TERMINATE_WORKERS, Answer, CloudCalls
from .gang_workers import abandon_gang_launch, plan_gang_attempt, watch_gang_formation
from .isolation import UnitGuard
from .node_watch import describe_wakes, watch_running_nodes
from .policy import BackoffBook
from .releases import release_nodes, terminate_wakes
from .spot_return import move_to_spot
from .standby import launch_refused, release_unneeded, take_over
from .states import ALLOWED, CANCELLED, FAILED, PENDING, PROVISIONING, RECOVERING, RUNNING, TERMINAL

ACTIVE_STATES = tuple(state for state in ALLOWED if state not in TERMINAL)
from .transitions import transition

log = structlog.get_logger(__name__)

# How long after a cancel the node is released even if its agent has not reported the job's end. The agent
# hears of the cancel on its next heartbeat and gives the job its stop_grace_seconds (10 s, agents/cancel.py) to take
# its checkpoint and exit; this leaves room for that, the heartbeat and the log flush.
CANCEL_GRACE_SECONDS = 20.0


@dataclass
class SchedulerContext:
    store: Store
    providers: dict[str, Provider]
    controller_url: str  # the URL(s) nodes reach the controller at, comma-separated
    node_token: Callable[[str], str]  # node id -> that node's token (derived, so a restart can re-derive it)
    token_hasher: Callable[[str], str]
    nudge: threading.Event = field(default_factory=threading.Event)
    described_at: dict[str, float] = field(default_factory=dict)  # node id -> last describe (monotonic)
    watched_at: float = float("-inf")  # when the running nodes were last read for describes (monotonic)
    backoff: BackoffBook = field(default_factory=BackoffBook)  # capacity errors of spot launches
    on_demand_backoff: BackoffBook = field(default_factory=BackoffBook)  # and of on-demand ones (another pool)
    auto_on_demand_after: float = placement.AUTO_ON_DEMAND_AFTER_SECONDS  # config.yaml scheduler.auto_on_demand_after
    gang_timeout: float = GANG_FORM_SECONDS  # config.yaml scheduler.gang_timeout: launch to every node registered
    # Cloud calls out, by kind: inline by default (a tick's calls answered within it); threaded in the daemon
    launches: CloudCalls = field(default_factory=CloudCalls)
    describes: CloudCalls = field(default_factory=lambda: CloudCalls(wakes=describe_wakes))
    terminates: CloudCalls = field(default_factory=lambda: CloudCalls(wakes=terminate_wakes))
    clock: Callable[[], float] = time.time  # unix seconds now (a test moves its own through the cancel grace)
    # Every live controller of a shared database, this one first (runner/controller/discovery.py); else
    # ``controller_url`` alone
    controller_urls: Callable[[], str] | None = None
    spot_checked_at: dict[str, float] = field(default_factory=dict)  # job id -> last weighed for a move to spot
    guard: UnitGuard = field(default_factory=UnitGuard)  # one job's failure is logged and backed off, never the tick's

    def __post_init__(self):
        for calls in (self.launches, self.describes, self.terminates):
            if calls.on_answer is None:
                calls.on_answer = self.nudge.set  # an answer is work for the next tick: wake it


def threaded_calls(workers: int | None = None) -> dict[str, CloudCalls]:
    """The controller's cloud calls: each kind on daemon threads of its own, so describes hung on a throttled
    API never take the threads that launches and terminates need (``workers``: per kind, for tests)."""
    return {"launches": CloudCalls.threaded(workers or LAUNCH_WORKERS, "launch"),
            "describes": CloudCalls.threaded(workers or DESCRIBE_WORKERS, "describe", wakes=describe_wakes),
            "terminates": CloudCalls.threaded(workers or TERMINATE_WORKERS, "terminate", wakes=terminate_wakes)}


class Reconciler:
    """Runs the workers in a loop until stopped; ``ctx.nudge`` wakes it early."""

    def __init__(self, ctx: SchedulerContext, interval: float = 0.5):
        self.ctx = ctx
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.ctx.nudge.set()
        if self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a worker bug must not stop the controller; it retries next tick
                log.exception("reconciler tick failed")
            self.ctx.nudge.wait(self.interval)
            self.ctx.nudge.clear()

    def tick(self) -> None:
        """One pass of every worker. None waits on a cloud: launches, describes and terminates are asked for here
        and answered later (:mod:`.cloud_calls`)."""
        ctx = self.ctx
        for worker in TICK_WORKERS:  # each on its own: a bug in one never keeps the others from running
            ctx.guard.step(worker.__name__, lambda: worker(ctx))


@dataclass(frozen=True)
class Queue:
    """The waiting jobs' nodes and attempts, read once a tick: a queue of 10,000 jobs then costs a few reads, not
    two round trips a job (seconds a tick on Postgres, during which nothing else of the tick runs). Only a
    first look: a launch re-checks the job's nodes in its own transaction."""
    holding: set[str]  # jobs that a node still holds (launching, running or terminating)
    attempts: dict[str, list[Attempt]]

    @classmethod
    def read(cls, store: Store, states: tuple[str, ...]) -> "Queue":
        return cls(store.jobs_with_nodes_in(NODES_HOLDING_A_JOB, states), store.attempts_of_jobs_in(states))


def launch_pending_jobs(ctx: SchedulerContext) -> None:
    """PENDING and RECOVERING jobs with no live node get a node row and an attempt, then a launch."""
    waiting = (PENDING, RECOVERING)
    jobs = ctx.store.jobs(waiting)
    if not jobs:
        return
    queue = Queue.read(ctx.store, waiting)
    for job in jobs:
        ctx.guard.run("launch", job.id, _launch_job, ctx, job, queue)


def _launch_job(ctx: SchedulerContext, job: Job, queue: Queue) -> None:
    """One waiting job: choose an offer, write its attempt and node rows, and ask for the launch."""
    store = ctx.store
    if not job.cancel_requested and job.num_nodes > 1:
        for node_id in plan_gang_attempt(ctx, job):
            node = store.node(node_id)
            if node.state == NODE_LAUNCHING:  # not released by a failed launch of its gang
                _launch(ctx, node)
        return
    if job.state == RECOVERING and take_over(ctx, job):  # a replacement prepared during the last attempt
        return
    if job.cancel_requested or job.id in queue.holding:
        return
    resources = job.spec.resources
    attempts = queue.attempts.get(job.id, [])
    avoid = placement.recent_preempted_zones(attempts)
    offers = [o for p in ctx.providers.values() for o in p.offers()]
    speed_of = placement.speeds(job, attempts, offers)  # where a step is cheapest, not an hour
    if observe.has_deadline(job.spec):  # spot or on-demand from progress and deadline (runner/costpolicy)
        now = time.time()
        picked, reason = placement.choose_for_deadline(
            offers, resources, job=job, attempts=attempts, avoid_zones=avoid,
            zone_history=zone_preemptions(store.db, now - observe.RATE_HISTORY_SECONDS, now),
            backoff=ctx.backoff, on_demand_backoff=ctx.on_demand_backoff, now=now, speed_of=speed_of)
        choice = (picked.offer, picked.spot) if picked else None
    else:
        choice, reason = placement.choose_with_figures(
            offers, resources, avoid_zones=avoid, backoff=ctx.backoff, now=time.time(),
            waiting_since=job.updated_at, on_demand_after=ctx.auto_on_demand_after,
            on_demand_backoff=ctx.on_demand_backoff, speed_of=speed_of)
    if choice is None:
        if reason and reason != job.message:
            with store.db.transaction() as tx:
                store.set_job_message(tx, job.id, reason)
        return  # every fitting offer is backed off (or the deadline policy waits for spot); try again later
    offer, spot = choice
    node_id = f"n-{secrets.token_hex(6)}"
    token = ctx.node_token(node_id)
    with store.db.transaction() as tx:
        fresh = store.job(job.id, tx)
        if fresh.state != job.state or store.has_unterminated_node(tx, job.id):
            return
        resumed = (fresh.checkpoint or {}).get("step", 0)
        attempt = store.insert_attempt(tx, job.id, node_id, offer, spot, resumed, time.time())
        if reason:
            store.add_event(tx, job.id, placement.PLACEMENT_EVENT, reason, attempt=attempt)
        store.insert_node(tx, node_id, job.id, attempt, offer.cloud, ctx.token_hasher(token),
                          offer, spot, time.time())
    _launch(ctx, store.node(node_id))


def finish_launches(ctx: SchedulerContext) -> None:
    """Nodes in ``launching`` with no launch out (their controller died mid-launch) are asked for again:
    a provider's launch is idempotent per node id."""
    for node in ctx.store.nodes((NODE_LAUNCHING,)):
        # (a node whose answer could not be applied waits out that failure's backoff: no launch call every tick)
        if not ctx.launches.in_flight(node.id) and not ctx.guard.backed_off("launch answer", node.job_id):
            ctx.guard.run("launch", node.job_id, _launch, ctx, node)


def _launch(ctx: SchedulerContext, node: Node) -> None:
    """Ask the node's provider for it and return; :func:`collect_launches` applies the answer."""
    provider = ctx.providers[node.provider]
    gang_size = ctx.store.job(node.job_id).num_nodes
    request = LaunchRequest(node.id, node.job_id, node.attempt, node.offer, node.spot,
                            NodeBootstrap(ctx.controller_urls() if ctx.controller_urls else ctx.controller_url,
                                          node.id, ctx.node_token(node.id)),
                            gang_size=gang_size)
    ctx.launches.request(node.id, lambda: provider.launch(request))


# Launch answers applied in one transaction at most: at start-up a tick brings hundreds, and each in a transaction
# of its own paid its BEGIN, the write lock and a commit (a flush of the database's log) while others waited for
# the lock; a small bound keeps one such transaction from holding the lock much longer than one answer did (ten:
# about 13 ms on Postgres on a quiet 2-vCPU machine, against 2 ms for one; benchmarks/launch_answers.py).
LAUNCH_ANSWERS_A_TRANSACTION = 10


def collect_launches(ctx: SchedulerContext) -> None:
    """Apply every launch answer that has come back, in order: the launched nodes' that come one after another
    together (:func:`_apply_launched`), a failed launch's in a transaction of its own (after those before it: its
    gang's release and the zone's backoff see the same order as the cloud's answers)."""
    unexpected = None
    launched: list[tuple[Node, Answer]] = []
    for answer in ctx.launches.answers():
        if answer.error is not None and not isinstance(answer.error, ProviderError):
            unexpected = unexpected or answer.error  # a bug, or the process stopping: the node is asked for again
            continue
        node = ctx.store.node(answer.key)
        if node is None:
            continue
        if answer.error is None and not ctx.guard.backed_off("launch answer", node.job_id):
            launched.append((node, answer))
            if len(launched) == LAUNCH_ANSWERS_A_TRANSACTION:
                _apply_launched(ctx, launched)
                launched = []
            continue
        _apply_launched(ctx, launched)
        launched = []
        ctx.guard.run("launch answer", node.job_id, _apply_launch, ctx, node, answer)
    _apply_launched(ctx, launched)
    if unexpected is not None:
        raise unexpected


def _apply_launched(ctx: SchedulerContext, answers: list[tuple[Node, Answer]]) -> None:
    """Launched nodes' answers in one transaction. Where one fails (or the transaction does), none of them is kept,
    and each is applied again in a transaction of its own, so only the failing one's job is backed off."""
    if len(answers) > 1:
        try:
            with ctx.store.db.transaction() as tx:
                for node, answer in answers:
                    _record_launch(ctx, tx, node, answer)
        except Exception as exc:  # noqa: BLE001 - applied one by one below, each failure logged with its job
            log.warning("launch answers applied one by one after one failed", answers=len(answers), error=str(exc))
        else:
            for node, _ in answers:
                ctx.guard.succeeded("launch answer", node.job_id)
            return
    for node, answer in answers:
        ctx.guard.run("launch answer", node.job_id, _apply_launch, ctx, node, answer)


def _apply_launch(ctx: SchedulerContext, node: Node, answer: Answer) -> None:
    store = ctx.store
    offer = node.offer
    backoff = ctx.backoff if node.spot else ctx.on_demand_backoff
    if answer.error is not None:
        key = (offer.cloud, offer.zone, offer.instance_type)
        exc = answer.error
        backoff.record_failure(key, time.time())
        if elastic.replacement_failed(store, node, str(exc)):  # its gang trains on; another is launched
            return
        with store.db.transaction() as tx:
            store.update_node(tx, node.id, state=NODE_TERMINATED, terminated_at=time.time())
            store.delete_running_attempt(tx, node.job_id, node.attempt)
            store.add_event(tx, node.job_id, "launch-failed",
                            f"{offer.cloud} {offer.zone} {offer.instance_type}: {exc}", attempt=node.attempt)
            if node.prepared_for is not None:  # a replacement prepared during a notice (the next attempt, taken back)
                launch_refused(store, tx, node, exc)
            waiting = store.job(node.job_id, tx).state in (PENDING, RECOVERING)
            if not exc.retryable:  # credentials or permissions: retrying cannot help; the user must act
                if waiting:
                    transition(tx, node.job_id, FAILED, now=time.time(), message=f"launch failed: {exc}")
            elif waiting:  # no state change (updated_at stays: it is when the wait began); `status` shows why
                store.set_job_message(tx, node.job_id,
                                      "waiting to launch (other offers next, this one again after a backoff); "
                                      f"last failure: {offer.cloud} {offer.zone} {offer.instance_type}: {exc}")
            if store.job(node.job_id, tx).num_nodes > 1:
                abandon_gang_launch(ctx, tx, node, exc)  # all or none: the rest of its gang goes too
        log.warning("launch failed", node=node.id, zone=offer.zone, error=str(exc))
        return
    with store.db.transaction() as tx:
        _record_launch(ctx, tx, node, answer)


def _record_launch(ctx: SchedulerContext, tx, node: Node, answer: Answer) -> None:
    """A launched node's answer, in ``tx``: the node runs (or, released meanwhile, goes), its job provisions."""
    store, offer = ctx.store, node.offer
    (ctx.backoff if node.spot else ctx.on_demand_backoff).record_success((offer.cloud, offer.zone, offer.instance_type),
                                                                        time.time())
    # Billed from the launch: the first ask of the provider (a launch asked again after a failover adopts the node).
    launched = {"launched_at": answer.started_at or time.time()} if node.launched_at is None else {}
    if store.node(node.id, tx).state != NODE_LAUNCHING:  # released while its launch was out: let it go
        store.update_node(tx, node.id, state=NODE_TERMINATING, provider_ref=answer.value, **launched)
        return
    store.update_node(tx, node.id, state=NODE_RUNNING, provider_ref=answer.value, **launched)
    job = store.job(node.job_id, tx)
    if job.state in (PENDING, RECOVERING):
        transition(tx, job.id, PROVISIONING, now=time.time(),
                   message=f"attempt {node.attempt} on {offer.instance_type} in {offer.zone}")
        # Its agent may have registered before this answer was applied (a launch asked for again by the next
        # leader after a failover, or a tick late under load): the job is running already.
        if store.node(node.id, tx).registered_at is not None and job.num_nodes == 1:
            transition(tx, job.id, RUNNING, now=time.time(), message=f"attempt {node.attempt} running")


def grow_elastic_gangs(ctx: SchedulerContext) -> None:
    """Elastic gangs training on with fewer nodes: launch their replacements, and let in those that are ready."""
    for job, current in elastic.elastic_attempts(ctx.store):
        ctx.guard.run("elastic", job.id, _grow_elastic_gang, ctx, job, current)


def _grow_elastic_gang(ctx: SchedulerContext, job: Job, current) -> None:
    for node_id in elastic.plan_replacements(ctx, job, current):
        _launch(ctx, ctx.store.node(node_id))
    elastic.admit_joiners(ctx, job, current)


WAIT_FOR_AGENT, END_ATTEMPT, CANCEL_JOB = "wait for the agent", "end the attempt", "cancel the job"


def cancel_step(cancel_requested: float, now: float, attempt_running: bool, agent_registered: bool,
                grace: float = CANCEL_GRACE_SECONDS) -> str:
    """What a cancelled job needs now. Its agent, told on its next heartbeat, sends the job SIGTERM and asks for
    its checkpoint, and reports the exit: until ``grace`` has passed the node is left to it. After that, or with
    no agent to tell, the attempt ends here and its node goes; a job with no attempt is simply cancelled."""
    if not attempt_running:
        return CANCEL_JOB
    if agent_registered and now - cancel_requested < grace:
        return WAIT_FOR_AGENT
    return END_ATTEMPT


def apply_cancellations(ctx: SchedulerContext) -> None:
    """Cancelled jobs: load each, decide with :func:`cancel_step`, apply in one transaction."""
    for job in ctx.store.cancelled_jobs(ACTIVE_STATES):
        ctx.guard.run("cancel", job.id, _apply_cancellation, ctx, job)


def _apply_cancellation(ctx: SchedulerContext, job: Job) -> None:
    store = ctx.store
    current = store.current_attempt(job.id)
    agents = [n for n in store.nodes((NODE_RUNNING,), job_id=job.id) if n.registered_at]
    now = ctx.clock()
    step = cancel_step(job.cancel_requested, now, current is not None, bool(agents))
    if step == END_ATTEMPT:
        end_attempt(store, job.id, current.attempt, "cancelled", now=now,
                    message=f"cancelled by the user; the job had not stopped {CANCEL_GRACE_SECONDS:.0f}s later"
                    if agents else None)
    elif step == CANCEL_JOB:
        with store.db.transaction() as tx:
            if store.job(job.id, tx).state not in TERMINAL:
                transition(tx, job.id, CANCELLED, now=now, message="cancelled by the user")
                release_standbys(store, tx, job.id, now)  # (between a handover and the attempt on its replacement)
                store.release_job_nodes(tx, job.id)


# One tick, in order. collect_launches comes again last: what came back meanwhile (every launch of this tick, when
# launches run inline).
TICK_WORKERS = (collect_launches, finish_launches, watch_running_nodes, watch_gang_formation, apply_cancellations,
                move_to_spot, release_unneeded, release_nodes, launch_pending_jobs, grow_elastic_gangs, collect_launches)
