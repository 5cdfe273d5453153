"""Where the next attempt goes: the offer policy applied to a job's history (and to its deadline: runner/costpolicy)."""

from __future__ import annotations

import time

from ..costpolicy import Market, decide, observe
from ..providers.offers import Offer
from ..spec import Resources
from ..state.rows import Attempt, Job
from .policy import BackoffBook, Candidate, rank_offers

RECENT_PREEMPTION_SECONDS = 3600.0  # a zone that preempted the job this recently is tried last
AUTO_ON_DEMAND_AFTER_SECONDS = 600.0  # spot_policy auto: on-demand once spot has not launched this long (default)
PLACEMENT_EVENT = "placement"  # an attempt's event: why the cost policy chose its market (the restart log's message)
DEADLINE_MARGIN = 0.05  # a deadline job keeps this share of its work left spare: its measured speed varies


def recent_preempted_zones(attempts: list[Attempt], now: float | None = None) -> set[str]:
    """Zones whose node this job lost to a preemption (or without a trace) within the last hour."""
    now = now or time.time()
    return {
        a.zone for a in attempts
        if a.end_reason in ("preempted", "lost") and a.ended_at and now - a.ended_at < RECENT_PREEMPTION_SECONDS
    }


def choose(offers: list[Offer], resources: Resources, *, avoid_zones: set[str], backoff: BackoffBook,
           now: float, waiting_since: float | None = None, on_demand_backoff: BackoffBook | None = None,
           on_demand_after: float = AUTO_ON_DEMAND_AFTER_SECONDS) -> tuple[Offer, bool] | None:
    """The cheapest launchable (offer, spot) for a job, or None when everything fitting is backed off.

    spot_policy auto turns to on-demand offers once the job has waited ``on_demand_after`` seconds."""
    ranked = candidates(offers, resources, avoid_zones=avoid_zones, backoff=backoff, now=now,
                        waiting_since=waiting_since, on_demand_backoff=on_demand_backoff, on_demand_after=on_demand_after)
    if not ranked:
        return None
    return ranked[0].offer, ranked[0].spot


def candidates(offers: list[Offer], resources: Resources, *, avoid_zones: set[str], backoff: BackoffBook,
               now: float, waiting_since: float | None = None, on_demand_backoff: BackoffBook | None = None,
               on_demand_after: float = AUTO_ON_DEMAND_AFTER_SECONDS) -> list[Candidate]:
    """Every launchable candidate, best first (a gang picks the first with room for its nodes)."""
    fallback = waiting_since is not None and now - waiting_since > on_demand_after
    return rank_offers(offers, resources, avoid_zones=avoid_zones, backoff=backoff, now=now,
                       on_demand_fallback=fallback, on_demand_backoff=on_demand_backoff)


def choose_for_deadline(offers: list[Offer], resources: Resources, *, job: Job, attempts: list[Attempt],
                        zone_history: dict[str, tuple[int, float]], avoid_zones: set[str], backoff: BackoffBook,
                        now: float, on_demand_backoff: BackoffBook | None = None) -> tuple[tuple[Offer, bool] | None, str | None]:
    """spot_policy auto with recovery.deadline: the cost policy's (offer, spot), or None to wait, and why
    (no reason when every fitting offer is backed off).

    Progress is the job's committed step over total_steps at the speed its attempts measured; before a
    first checkpoint nothing is known of its speed, and it starts on spot like any auto job."""
    ranked = rank_offers(offers, resources, avoid_zones=avoid_zones, backoff=backoff, now=now,
                         on_demand_fallback=True, on_demand_backoff=on_demand_backoff)
    if not ranked:
        return None, None  # every fitting offer is backed off, as for any job
    total, step = job.spec["recovery"]["total_steps"], job.step
    speed = observe.steps_per_second(job, attempts)
    if speed is None:
        first = ranked[0]
        return (first.offer, first.spot), (f"{'spot' if first.spot else 'on-demand'}: step {step} of {total}, no "
                                           "speed measured yet; the deadline is weighed from the job's first "
                                           "checkpoint on")
    by_market = _markets(ranked, zone_history)
    markets = list(by_market)
    if any(m.spot and m.zone not in avoid_zones for m in markets):  # just preempted there: other zones first
        markets = [m for m in markets if not (m.spot and m.zone in avoid_zones)]
    work_left = max(0, total - step) / speed
    decision = decide(now=now, deadline=observe.job_deadline(job), work_left=work_left,
                      restart=observe.restart_seconds(attempts), markets=markets,
                      margin=DEADLINE_MARGIN * work_left)
    if decision.market is None:
        return None, decision.reason
    chosen = by_market[decision.market]
    return (chosen.offer, chosen.spot), decision.reason


def spot_markets_now(offers: list[Offer], resources: Resources, *, zone_history: dict[str, tuple[int, float]],
                     avoid_zones: set[str], backoff: BackoffBook, now: float) -> list[Market]:
    """The spot markets a job could launch in now (fitting, not backed off, not in a zone that preempted it
    within the hour), at their observed preemption rates: where a move back to spot would go."""
    ranked = [c for c in rank_offers(offers, resources, backoff=backoff, now=now) if c.spot]
    return [m for m in _markets(ranked, zone_history) if m.zone not in avoid_zones]


def _markets(ranked: list[Candidate], zone_history: dict[str, tuple[int, float]]) -> dict[Market, Candidate]:
    """The cost policy's markets of ranked candidates (each market's best candidate), with observed rates."""
    rates = observe.preemption_rates(zone_history)
    by_market: dict[Market, Candidate] = {}
    for candidate in ranked:  # best first: a market's first candidate is the one to launch
        rate = rates.get(candidate.offer.zone, 0.0) if candidate.spot else 0.0
        by_market.setdefault(Market(candidate.offer.zone, candidate.spot, candidate.price, rate), candidate)
    return by_market
