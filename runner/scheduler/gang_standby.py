"""A gang's replacement prepared during a notice (runner/scheduler/standby.py has the single-node story).

A gang (``resources.num_nodes`` > 1, not elastic) whose node gets a notice that leaves time trains on, every
node of it, while one node is prepared for the rank on notice:

- :func:`choose_offer`: where it goes. A gang lives in one zone, so the replacement goes into the zone of the
  running attempt, on the same market (a gang never mixes spot and on-demand), the type of the node it
  replaces first; a zone with no room for it prepares nothing (the gang then stops at once and moves whole
  as it always did).
- :func:`kept_or_released`: when the gang's next attempt is planned (runner/scheduler/gang_workers.py), the
  prepared node holds its rank like a node kept from the attempt, unless another live node of the job still
  holds that rank (the attempt ended some other way, its node on notice was kept): then it is released.
- :func:`took_over` / :func:`released_by_plan`: what the plan's transaction records about it.

The old attempt ends as any gang's: every rank stops at one agreed step with the emergency checkpoint (the
node on notice asks for it once the replacement is ready, or its timer does), the node on notice reports
``preempted`` and the others are kept.
"""

from __future__ import annotations

import time

from ..providers.base import free_slots as provider_free_slots
from ..state.gangs import GangStore
from ..state.rows import Attempt, Job, Node
from ..state.standbys import PREPARED, StandbyStore
from . import placement

GANG_FIELDS = ("rank", "replaces")  # what a gang's standby record adds: the rank it replaces and that node


def applies(job: Job) -> bool:
    """A gang that stops and restarts together (an elastic gang shrinks instead: runner/scheduler/elastic.py)."""
    return job.num_nodes > 1 and not job.spec.resources.elastic


def choose_offer(ctx, job: Job, current: Attempt, node: Node, now: float):
    """``(offer, spot)`` for the replacement of ``node`` in the running attempt's zone, or None when it has no
    room (or no fitting offer is launchable there now)."""
    offers = [o for p in ctx.providers.values() for o in p.offers()]
    ranked = placement.candidates(offers, job.spec.resources, avoid_zones=set(), backoff=ctx.backoff, now=now,
                                  on_demand_backoff=ctx.on_demand_backoff,
                                  speed_of=placement.speeds(job, ctx.store.attempts(job.id), offers))
    counts = GangStore(ctx.store).live_nodes_per_zone()
    home = (current.cloud, current.zone)
    fitting = [c for c in ranked if (c.offer.cloud, c.offer.zone) == home and c.spot == node.spot
               and provider_free_slots(ctx.providers[c.offer.cloud], c.offer.zone, counts.get(home, 0)) >= 1]
    fitting.sort(key=lambda c: c.offer.instance_type != node.offer.instance_type)  # stable: the policy's order
    return (fitting[0].offer, fitting[0].spot) if fitting else None


def prepared_node(live: list[Node]) -> Node | None:
    return next((n for n in live if n.attempt == PREPARED and n.prepared_for is not None), None)


def kept_or_released(store, live: list[Node]) -> tuple[list[Node], bool]:
    """The job's live nodes as the next attempt's plan sees them, and whether a prepared node was released
    (its rank is still held by a live node, so the plan waits for the release to finish)."""
    prepared = prepared_node(live)
    if prepared is None or not any(n.rank == prepared.rank and n.id != prepared.id for n in live):
        return live, False
    standbys = StandbyStore(store)
    with store.db.transaction() as tx:
        standbys.release(tx, prepared)
        standbys.update_record(tx, prepared.job_id, prepared.prepared_for, outcome="released",
                               released_at=time.time())
        store.add_event(tx, prepared.job_id, "standby", f"replacement {prepared.id} released: the node of rank "
                        f"{prepared.rank} it was prepared for carries on", attempt=prepared.prepared_for)
    return [n for n in live if n.id != prepared.id], True


def took_over(store, tx, node: Node, attempt: int, now: float) -> None:
    """Inside the plan's transaction, after the attempt's rows: the prepared node is the attempt's rank."""
    ready = StandbyStore(store).record_take_over(tx, node, attempt, now)
    store.add_event(tx, node.job_id, "standby", f"attempt {attempt}: rank {node.rank} on the replacement {node.id} "
                    f"prepared during attempt {node.prepared_for} ({ready} at the handover)", attempt=attempt)


def released_by_plan(store, tx, node: Node, now: float) -> None:
    """Inside the plan's transaction: the gang moves whole, so the prepared node goes with the kept ones."""
    StandbyStore(store).update_record(tx, node.job_id, node.prepared_for, outcome="released", released_at=now)
