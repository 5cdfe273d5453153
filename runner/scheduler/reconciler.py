"""The reconciler: small workers, one per kind of pending work, each load → decide → apply.

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
from ..providers.offers import Offer
from ..spec import Resources
from ..state import Store
from ..state.store import NODES_HOLDING_A_JOB, NODE_DRAINING, NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATED, NODE_TERMINATING
from ..costpolicy import observe
from ..state.spot_history import zone_preemptions
from . import placement
from .attempts import end_attempt
from .gang import GANG_FORM_SECONDS
from .gang_workers import abandon_gang_launch, gang_node_gone, plan_gang_attempt, watch_gang_formation
from .policy import BackoffBook
from .states import ALLOWED, CANCELLED, FAILED, PENDING, PROVISIONING, RECOVERING, TERMINAL

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
    controller_url: str
    node_token: Callable[[str], str]  # node id -> that node's token (derived, so a restart can re-derive it)
    token_hasher: Callable[[str], str]
    nudge: threading.Event = field(default_factory=threading.Event)
    described_at: dict[str, float] = field(default_factory=dict)  # node id -> last describe (monotonic)
    backoff: BackoffBook = field(default_factory=BackoffBook)  # capacity errors of spot launches
    on_demand_backoff: BackoffBook = field(default_factory=BackoffBook)  # and of on-demand ones (another pool)
    auto_on_demand_after: float = placement.AUTO_ON_DEMAND_AFTER_SECONDS  # config.yaml scheduler.auto_on_demand_after
    gang_timeout: float = GANG_FORM_SECONDS  # config.yaml scheduler.gang_timeout: launch to every node registered


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
        finish_launches(self.ctx)
        watch_running_nodes(self.ctx)
        watch_gang_formation(self.ctx)
        apply_cancellations(self.ctx)
        release_nodes(self.ctx)
        launch_pending_jobs(self.ctx)


def launch_pending_jobs(ctx: SchedulerContext) -> None:
    """PENDING and RECOVERING jobs with no live node get a node row and an attempt, then a launch."""
    store = ctx.store
    for job in store.jobs((PENDING, RECOVERING)):
        if not job["cancel_requested"] and job["spec"]["resources"].get("num_nodes", 1) > 1:
            for node_id in plan_gang_attempt(ctx, job):
                node = store.node(node_id)
                if node["state"] == NODE_LAUNCHING:  # not released by a failed launch of its gang
                    _launch(ctx, node)
            continue
        if job["cancel_requested"] or store.nodes(NODES_HOLDING_A_JOB, job_id=job["id"]):
            continue
        resources = Resources.model_validate(job["spec"]["resources"])
        avoid = placement.recent_preempted_zones(store.attempts(job["id"]))
        offers = [o for p in ctx.providers.values() for o in p.offers()]
        choice = placement.choose(offers, resources, avoid_zones=avoid, backoff=ctx.backoff, now=time.time(),
                                  waiting_since=job["updated_at"], on_demand_after=ctx.auto_on_demand_after,
                                  on_demand_backoff=ctx.on_demand_backoff)
        reason = None
        if observe.has_deadline(job["spec"]):  # spot or on-demand from progress and deadline (runner/costpolicy)
            now = time.time()
            choice, reason = placement.choose_for_deadline(
                offers, resources, job=job, attempts=store.attempts(job["id"]), avoid_zones=avoid,
                zone_history=zone_preemptions(store.db, now - observe.RATE_HISTORY_SECONDS, now),
                backoff=ctx.backoff, on_demand_backoff=ctx.on_demand_backoff, now=now)
        if choice is None:
            if reason and reason != job["message"]:
                with store.db.transaction() as tx:
                    store.set_job_message(tx, job["id"], reason)
            continue  # every fitting offer is backed off (or the deadline policy waits for spot); try again later
        offer, spot = choice
        node_id = f"n-{secrets.token_hex(6)}"
        token = ctx.node_token(node_id)
        with store.db.transaction() as tx:
            fresh = store.job(job["id"], tx)
            if fresh["state"] != job["state"] or store.has_unterminated_node(tx, job["id"]):
                continue
            resumed = (fresh["checkpoint"] or {}).get("step", 0)
            attempt = store.insert_attempt(tx, job["id"], node_id, offer.to_json(), spot, resumed, time.time())
            if reason:
                store.add_event(tx, job["id"], placement.PLACEMENT_EVENT, reason, attempt=attempt)
            store.insert_node(tx, node_id, job["id"], attempt, offer.cloud, ctx.token_hasher(token),
                              offer.to_json(), spot, time.time())
        _launch(ctx, store.node(node_id))


def finish_launches(ctx: SchedulerContext) -> None:
    """Nodes left in ``launching`` by a controller that died mid-launch are launched again (idempotently)."""
    for node in ctx.store.nodes((NODE_LAUNCHING,)):
        _launch(ctx, node)


def _launch(ctx: SchedulerContext, node: dict) -> None:
    store = ctx.store
    provider = ctx.providers[node["provider"]]
    token = ctx.node_token(node["id"])
    offer = Offer(**node["offer"])
    gang_size = store.job(node["job_id"])["spec"]["resources"].get("num_nodes", 1)
    request = LaunchRequest(node["id"], node["job_id"], node["attempt"], offer, node["spot"],
                            NodeBootstrap(ctx.controller_url, node["id"], token), gang_size=gang_size)
    key = (offer.cloud, offer.zone, offer.instance_type)
    backoff = ctx.backoff if node["spot"] else ctx.on_demand_backoff
    try:
        ref = provider.launch(request)
    except ProviderError as exc:
        backoff.record_failure(key, time.time())
        with store.db.transaction() as tx:
            store.update_node(tx, node["id"], state=NODE_TERMINATED, terminated_at=time.time())
            store.delete_running_attempt(tx, node["job_id"], node["attempt"])
            store.add_event(tx, node["job_id"], "launch-failed",
                            f"{offer.cloud} {offer.zone} {offer.instance_type}: {exc}", attempt=node["attempt"])
            waiting = store.job(node["job_id"], tx)["state"] in (PENDING, RECOVERING)
            if not exc.retryable:  # credentials or permissions: retrying cannot help; the user must act
                if waiting:
                    transition(tx, node["job_id"], FAILED, now=time.time(), message=f"launch failed: {exc}")
            elif waiting:  # no state change (updated_at stays: it is when the wait began); `status` shows why
                store.set_job_message(tx, node["job_id"],
                                      "waiting to launch (other offers next, this one again after a backoff); "
                                      f"last failure: {offer.cloud} {offer.zone} {offer.instance_type}: {exc}")
            if store.job(node["job_id"], tx)["spec"]["resources"].get("num_nodes", 1) > 1:
                abandon_gang_launch(ctx, tx, node, exc)  # all or none: the rest of its gang goes too
        log.warning("launch failed", node=node["id"], zone=offer.zone, error=str(exc))
        return
    backoff.record_success(key, time.time())
    with store.db.transaction() as tx:
        store.update_node(tx, node["id"], state=NODE_RUNNING, provider_ref=ref)
        job = store.job(node["job_id"], tx)
        if job["state"] in (PENDING, RECOVERING):
            transition(tx, job["id"], PROVISIONING, now=time.time(),
                       message=f"attempt {node['attempt']} on {offer.instance_type} in {offer.zone}")


def watch_running_nodes(ctx: SchedulerContext) -> None:
    """A node the provider's API says is gone ends its attempt as preempted (after a notice) or lost."""
    store = ctx.store
    for node in store.watched_nodes((NODE_RUNNING, NODE_DRAINING)):  # a draining node's attempt has ended already
        provider = ctx.providers[node["provider"]]
        reclaim = bool(node["terminate_at"]) and node["terminate_at"] <= time.time()
        last = ctx.described_at.get(node["id"], 0.0)
        if not reclaim and time.monotonic() - last < provider.describe_interval:
            continue
        ctx.described_at[node["id"]] = time.monotonic()
        try:
            if reclaim:
                provider.terminate(node["id"], node["provider_ref"])  # the simulated spot market reclaims it
            status = provider.describe(node["id"], node["provider_ref"])
        except ProviderError as exc:  # an API hiccup is never a lost node
            log.warning("describe failed; will retry", node=node["id"], error=str(exc))
            continue
        if status.alive:
            continue
        ctx.described_at.pop(node["id"], None)
        reason = "preempted" if status.reason == "preempted" else "lost"
        if store.job(node["job_id"])["spec"]["resources"].get("num_nodes", 1) > 1:
            gang_node_gone(ctx, node, reason, f"node {node['id']} (rank {node['rank']}) is gone ({status.reason})")
        else:
            end_attempt(store, node["job_id"], node["attempt"], reason,
                        message=f"node {node['id']} is gone ({status.reason})")
        with store.db.transaction() as tx:
            store.update_node(tx, node["id"], state=NODE_TERMINATING)
        ctx.nudge.set()


def apply_cancellations(ctx: SchedulerContext) -> None:
    """Cancelled jobs: the agent stops the job first; after a grace period the node is released anyway."""
    store = ctx.store
    for job in store.cancelled_jobs(ACTIVE_STATES):
        current = store.current_attempt(job["id"])
        waited = time.time() - job["cancel_requested"]
        agents = [n for n in store.nodes((NODE_RUNNING,), job_id=job["id"]) if n["registered_at"]]
        if current and waited < CANCEL_GRACE_SECONDS and agents:
            continue  # the agent hears about it on its next heartbeat and stops the job itself
        if current:
            end_attempt(store, job["id"], current["attempt"], "cancelled")
        else:
            with store.db.transaction() as tx:
                if store.job(job["id"], tx)["state"] not in TERMINAL:
                    transition(tx, job["id"], CANCELLED, now=time.time(), message="cancelled by the user")
                    store.release_job_nodes(tx, job["id"])


def release_nodes(ctx: SchedulerContext) -> None:
    """Nodes marked for release are terminated through their provider, then recorded as terminated."""
    store = ctx.store
    for node in store.nodes((NODE_TERMINATING,)):
        try:
            ctx.providers[node["provider"]].terminate(node["id"], node["provider_ref"])
        except ProviderError as exc:
            log.warning("terminate failed; will retry", node=node["id"], error=str(exc))
            continue
        with store.db.transaction() as tx:
            store.update_node(tx, node["id"], state=NODE_TERMINATED, terminated_at=time.time())
        log.info("node released", node=node["id"], job=node["job_id"])
