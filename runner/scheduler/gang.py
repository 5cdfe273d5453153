"""Gangs (``resources.num_nodes`` > 1): pure decisions over a job's nodes, offers and exit reports.

- **Placement** (:func:`plan_gang`): a gang lives in one zone. Nodes kept from the previous attempt stay;
  the missing ranks are launched in the kept nodes' zone when it has room for all of them, otherwise the
  whole gang moves to the cheapest zone with room for every rank (the kept nodes are released).
- **Outcome** (:func:`gang_outcome`): how the nodes' exit reports end the attempt. A node's preemption,
  the job's failure or a cancel ends it at once; a node that stopped because a peer stopped waits for the
  peer's report; the attempt succeeds when every node's job exited 0.
- **Node ends** (:func:`node_end_reasons`): per rank, for the restart log: the node that ended the attempt
  gets the attempt's reason (``preempted``/``lost``), the others ``kept`` while the job goes on; a node whose part
  was done before the attempt ended otherwise is never blamed (``kept``, or ``released`` when its node goes).
- **Rendezvous** (:func:`unregistered_ranks`): the ranks still missing once the bounded wait is over.
- **The launcher's exit** (:func:`peers_exited`): every other node has reported, so none is coming to the exit
  barrier of a launcher still waiting there.
- **A node's part** (:func:`reported_end`): what a node's reports say of its part of the attempt; a node whose
  ranks all finished while its launcher still ran (node 0's hosts the others' store) succeeded from that report on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

from ..providers.offers import Offer
from ..state.rows import AttemptNode
from ..protocol.events import EndReason
from .policy import Candidate

GANG_FORM_SECONDS = 600.0  # default bound on launch-to-every-node-registered (config: scheduler.gang_timeout)


@dataclass(frozen=True)
class KeptNode:
    """A live node of the job that carries on into the next attempt with its rank."""

    rank: int
    node_id: str
    offer: Offer
    spot: bool


@dataclass(frozen=True)
class GangPlan:
    """The next attempt of a gang: who keeps which rank, which ranks are launched where, what is released."""

    keep: Mapping[int, KeptNode]
    launch: tuple[int, ...]
    candidate: Candidate | None  # where the launched ranks go; None when every rank is kept
    release: tuple[str, ...] = field(default=())  # node ids of kept nodes given up: the gang moves

    @property
    def zone(self) -> str:
        return self.candidate.offer.zone if self.candidate else next(iter(self.keep.values())).offer.zone


def plan_gang(num_nodes: int, kept: Iterable[KeptNode], candidates: list[Candidate],
              free_slots: Callable[[Offer], int]) -> GangPlan | None:
    """Where a gang's next attempt runs, or None when no zone has room for the ranks it needs.

    ``candidates`` come best first (runner/scheduler/policy.rank_offers); ``free_slots(offer)`` is how many
    more nodes the offer's zone takes now (kept nodes already counted as there).
    """
    kept = list(kept)
    beyond = sorted((k for k in kept if k.rank >= num_nodes), key=lambda k: k.rank)
    kept = {k.rank: k for k in kept if k.rank < num_nodes}
    # An elastic gang's replacement held a rank past num_nodes in its attempt: it takes a free rank now
    for node, rank in zip(beyond, [r for r in range(num_nodes) if r not in kept]):
        kept[rank] = replace(node, rank=rank)
    missing = tuple(rank for rank in range(num_nodes) if rank not in kept)
    if kept and not missing:
        return GangPlan(keep=kept, launch=(), candidate=None)
    if kept:
        home = next(iter(kept.values())).offer
        types = {k.offer.instance_type for k in kept.values()}
        same_zone = [c for c in candidates if (c.offer.cloud, c.offer.zone) == (home.cloud, home.zone)
                     and free_slots(c.offer) >= len(missing)]
        same_zone.sort(key=lambda c: c.offer.instance_type not in types)  # stable: the policy's order otherwise
        if same_zone:
            return GangPlan(keep=kept, launch=missing, candidate=same_zone[0])
    away = [c for c in candidates if free_slots(c.offer) >= num_nodes and not (
        kept and (c.offer.cloud, c.offer.zone) == (home.cloud, home.zone))]
    if not away:
        return None
    return GangPlan(keep={}, launch=tuple(range(num_nodes)), candidate=away[0],
                    release=tuple(k.node_id for k in kept.values()))


@dataclass(frozen=True)
class Outcome:
    """How a gang's attempt ends: the attempt's end reason and the ranks whose nodes ended it."""

    reason: str
    ranks: tuple[int, ...] = ()


DECISIVE = ("preempted", "failed", "cancelled", "drill", EndReason.MOVED)  # one node's report of these ends the attempt


def gang_outcome(reports: Mapping[int, str | None], num_nodes: int) -> Outcome | None:
    """The attempt's end given each rank's exit report so far (None: not reported), or None to wait.

    The first decisive report wins in the order of DECISIVE (a preemption explains a peer's failure). With
    every rank reported and none decisive, the attempt succeeded if every node's job exited 0; if some
    stopped for a peer while no node was preempted or drilled, the stop came from outside the runner (a
    SIGTERM to a launcher, say) and the job did not finish: the attempt failed, blamed on the ranks whose
    processes stopped by themselves.
    """
    for reason in DECISIVE:
        ranks = tuple(sorted(r for r, said in reports.items() if said == reason))
        if ranks:
            return Outcome(reason, ranks)
    if sum(1 for r in range(num_nodes) if reports.get(r)) < num_nodes:
        return None
    if all(reports[r] == "succeeded" for r in range(num_nodes)):
        return Outcome("succeeded")
    return Outcome("failed", tuple(r for r in range(num_nodes) if reports[r] != EndReason.STOPPED_BY_PEER))


def node_end_reasons(num_nodes: int, reason: str, ending_ranks: Iterable[int], job_goes_on: bool,
                     finished: Iterable[int] = (), going: Iterable[int] = ()) -> dict[int, str]:
    """Each rank's ``end_reason`` in the restart log's ``nodes``.

    While the job goes on, a node that was preempted or lost gets that reason and every other node is
    ``kept`` (a failure, a drill or a rendezvous that never formed keeps the healthy nodes too); a move to spot
    releases every node (``moved``), since the gang relaunches on spot. When the
    job ends, every node ends with the attempt, except a preempted or lost one, which keeps its own reason
    while the others are ``released``.

    A node whose part of the attempt was done (``finished``: it reported ``succeeded``, or its ranks finished) ended
    nothing, whatever ends the attempt after it: it is ``kept`` while the job goes on, unless its node goes
    (``going``: on notice, or gone already), and ``released`` otherwise, never ``preempted``, ``lost`` or
    ``failed``.
    """
    ending, finished, going = set(ending_ranks), set(finished), set(going)
    reasons = {}
    for rank in range(num_nodes):
        if reason == EndReason.MOVED:  # the whole gang leaves on-demand for spot: every node goes
            reasons[rank] = EndReason.MOVED
        elif rank in finished and reason != EndReason.SUCCEEDED:
            reasons[rank] = EndReason.KEPT if job_goes_on and rank not in going else EndReason.RELEASED
        elif reason in ("preempted", "lost") and rank in ending:
            reasons[rank] = reason
        elif job_goes_on:
            reasons[rank] = EndReason.KEPT
        elif reason in ("preempted", "lost"):
            reasons[rank] = EndReason.RELEASED
        else:
            reasons[rank] = reason
    return reasons


def reported_end(node: AttemptNode) -> str | None:
    """What the node's reports say of its part of the attempt (None: nothing yet). ``succeeded`` once it said every
    training process of it had finished and exited while its launcher still ran: the launcher's own exit, reported
    later (killed at the node's reclaim, say), changes nothing of that. Else its exit report's reason."""
    return EndReason.SUCCEEDED if node.ranks_finished_at is not None else node.exit_reason


def peers_exited(ranks: Iterable[AttemptNode], rank: int) -> bool:
    """Has every other node of the attempt (bar those that left an elastic world) reported its exit, or that its
    ranks finished (its launcher, left at its exit barrier, has arrived there)? Then none of them has a launcher
    left that could still reach the exit barrier ``rank``'s launcher may wait at."""
    others = [r for r in ranks if r.rank != rank and r.left_at is None]
    return bool(others) and all(reported_end(r) for r in others)


def unregistered_ranks(ranks: Iterable[AttemptNode], started_at: float, now: float, timeout: float) -> list[int]:
    """Ranks of an attempt not registered ``timeout`` seconds after it started ([] while the wait lasts)."""
    if now - started_at < timeout:
        return []
    return [r.rank for r in ranks if r.registered_at is None]


def gpus_per_node(accelerators: tuple[str, int] | None) -> int:
    """RUNNER_GPUS_PER_NODE: the accelerator count of ``resources.accelerators``, 1 for CPU-only nodes."""
    return accelerators[1] if accelerators else 1
