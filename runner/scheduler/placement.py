"""Where the next attempt goes: the offer policy applied to a job's history (and to its deadline: runner/costpolicy)."""

from __future__ import annotations

import time
from typing import Callable

from ..costpolicy import Market, decide, observe
from ..costpolicy.throughput import Speed, describe, expected_speed
from ..providers.offers import Offer
from ..spec import Resources
from ..state.rows import Attempt, Job
from .policy import BackoffBook, Candidate, rank_offers

SpeedOf = Callable[[Offer], "Speed | None"]  # a job's expected steps/s on an offer (None: unknown)

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


def speeds(job: Job, attempts: list[Attempt], offers: list[Offer]) -> SpeedOf:
    """The job's expected steps/s on each offer: measured there, else estimated from its measurements on other
    types with the catalog's relative-throughput table, else unknown (runner/costpolicy/throughput.py)."""
    from ..providers.catalog import relative_throughput

    measured = observe.measurements(job, attempts, offers)
    table = relative_throughput()
    return lambda offer: expected_speed(offer, measured, table)


def choose(offers: list[Offer], resources: Resources, *, avoid_zones: set[str], backoff: BackoffBook,
           now: float, waiting_since: float | None = None, on_demand_backoff: BackoffBook | None = None,
           on_demand_after: float = AUTO_ON_DEMAND_AFTER_SECONDS,
           speed_of: SpeedOf | None = None) -> tuple[Offer, bool] | None:
    """The launchable (offer, spot) with the cheapest step (else hour) for a job, or None when everything fitting
    is backed off.

    spot_policy auto turns to on-demand offers once the job has waited ``on_demand_after`` seconds."""
    choice, _ = choose_with_figures(offers, resources, avoid_zones=avoid_zones, backoff=backoff, now=now,
                                    waiting_since=waiting_since, on_demand_backoff=on_demand_backoff,
                                    on_demand_after=on_demand_after, speed_of=speed_of)
    return choice


def choose_with_figures(offers: list[Offer], resources: Resources, *, avoid_zones: set[str],
                        backoff: BackoffBook, now: float, waiting_since: float | None = None,
                        on_demand_backoff: BackoffBook | None = None,
                        on_demand_after: float = AUTO_ON_DEMAND_AFTER_SECONDS,
                        speed_of: SpeedOf | None = None) -> tuple[tuple[Offer, bool] | None, str | None]:
    """:func:`choose`, and the figures that decided when the job's alternatives were compared (else None)."""
    ranked = candidates(offers, resources, avoid_zones=avoid_zones, backoff=backoff, now=now,
                        waiting_since=waiting_since, on_demand_backoff=on_demand_backoff,
                        on_demand_after=on_demand_after, speed_of=speed_of)
    if not ranked:
        return None, None
    return (ranked[0].offer, ranked[0].spot), step_figures(ranked, ranked[0], speed_of)


def candidates(offers: list[Offer], resources: Resources, *, avoid_zones: set[str], backoff: BackoffBook,
               now: float, waiting_since: float | None = None, on_demand_backoff: BackoffBook | None = None,
               on_demand_after: float = AUTO_ON_DEMAND_AFTER_SECONDS,
               speed_of: SpeedOf | None = None) -> list[Candidate]:
    """Every launchable candidate, best first (a gang picks the first with room for its nodes): zones to avoid
    last, spot before on-demand, then by price per step when the job's speed on every candidate is known
    (measured or estimated), else by price per hour."""
    fallback = waiting_since is not None and now - waiting_since > on_demand_after
    ranked = rank_offers(offers, resources, avoid_zones=avoid_zones, backoff=backoff, now=now,
                         on_demand_fallback=fallback, on_demand_backoff=on_demand_backoff)
    return by_step_cost(ranked, avoid_zones, speed_of)


def by_step_cost(ranked: list[Candidate], avoid_zones: set[str], speed_of: SpeedOf | None) -> list[Candidate]:
    """``ranked`` reordered by price per step when every candidate's speed is known; else as it was."""
    if speed_of is None or not ranked:
        return ranked
    known = {c: speed_of(c.offer) for c in ranked}
    if any(speed is None for speed in known.values()):
        return ranked
    return sorted(ranked, key=lambda c: (c.offer.zone in avoid_zones, not c.spot,
                                         c.price / known[c].steps_per_second))  # stable: the policy's order on ties


def _kinds(ranked: list[Candidate]) -> set[tuple]:
    return {(c.offer.accelerator, c.offer.accelerator_count, c.offer.instance_type) for c in ranked}


def label(candidate: Candidate) -> str:
    """How a message names a candidate: "L4 spot in us-east-1b (g6.xlarge)"."""
    offer = candidate.offer
    gpus = "CPU" if not offer.accelerator else (
        offer.accelerator if offer.accelerator_count == 1 else f"{offer.accelerator_count}x{offer.accelerator}")
    return f"{gpus} {'spot' if candidate.spot else 'on-demand'} in {offer.zone} ({offer.instance_type})"


def step_figures(ranked: list[Candidate], chosen: Candidate, speed_of: SpeedOf | None, nodes: int = 1) -> str | None:
    """The figures that decided between a job's alternatives: the chosen candidate's price, expected steps/s
    and price per 1,000 steps, then the best candidate of each other instance type (up to three); None when
    every candidate is the same kind of node (nothing but the price per hour told them apart)."""
    if speed_of is None or len(_kinds(ranked)) < 2:
        return None
    shown, seen = [chosen], {(chosen.offer.instance_type, chosen.spot)}
    for c in ranked:
        if len(shown) >= 4:
            break
        if (c.offer.instance_type, c.spot) not in seen and c.offer.instance_type != chosen.offer.instance_type:
            seen.add((c.offer.instance_type, c.spot))
            shown.append(c)
    figures = "; ".join(describe(label(c), c.price * nodes, speed_of(c.offer)) for c in shown)
    if all(speed_of(c.offer) is None for c in shown):
        return f"the cheapest hour, no steps/s known yet: {figures}"
    return figures


def choose_for_deadline(offers: list[Offer], resources: Resources, *, job: Job, attempts: list[Attempt],
                        zone_history: dict[str, tuple[int, float]], avoid_zones: set[str], backoff: BackoffBook,
                        now: float, on_demand_backoff: BackoffBook | None = None, speed_of: SpeedOf | None = None,
                        room: Callable[[Candidate], bool] | None = None,
                        nodes: int = 1) -> tuple[Candidate | None, str | None]:
    """spot_policy auto with recovery.deadline: the cost policy's candidate, or None to wait, and why
    (no reason when every fitting offer is backed off).

    Progress is the job's committed step over total_steps; each market's work is the steps left at the job's
    expected steps/s on that offer (measured there, else estimated from another type, else the speed its
    attempts measured overall). Before anything is known of its speed it starts like any auto job, cheapest
    first. A gang passes ``room`` (whether a candidate's zone holds the whole gang now) and its ``nodes``:
    prices are the gang's."""
    ranked = rank_offers(offers, resources, avoid_zones=avoid_zones, backoff=backoff, now=now,
                         on_demand_fallback=True, on_demand_backoff=on_demand_backoff)
    if room is not None:
        ranked = [c for c in ranked if room(c)]
    if not ranked:
        return None, None  # every fitting offer is backed off (or, for a gang, no zone has room), as for any job
    ranked = by_step_cost(ranked, avoid_zones, speed_of)
    total, step = job.spec.recovery.total_steps, job.step
    overall = observe.steps_per_second(job, attempts)
    speed = _speed_with_fallback(speed_of, overall)
    if all(speed(c.offer) is None for c in ranked):
        first = ranked[0]
        return first, (f"{'spot' if first.spot else 'on-demand'}: step {step} of {total}, no "
                       "speed measured yet; the deadline is weighed from the job's first checkpoint on")
    fallback = overall or max(s for s in (speed(c.offer) for c in ranked) if s is not None)
    by_market = _markets(ranked, zone_history, lambda o: speed(o) or fallback, nodes)
    markets = list(by_market)
    if any(m.spot and m.zone not in avoid_zones for m in markets):  # just preempted there: other zones first
        markets = [m for m in markets if not (m.spot and m.zone in avoid_zones)]
    steps_left = max(0, total - step)
    fastest = max(m.speed for m in markets)
    decision = decide(now=now, deadline=observe.job_deadline(job), work_left=steps_left,
                      restart=observe.restart_seconds(attempts), markets=markets,
                      margin=DEADLINE_MARGIN * steps_left / fastest)
    if decision.market is None:
        return None, decision.reason
    chosen = by_market[decision.market]
    figures = step_figures(ranked, chosen, speed_of, nodes)
    return chosen, decision.reason + (f"; per step: {figures}" if figures else "")


def _speed_with_fallback(speed_of: SpeedOf | None, overall: float | None) -> Callable[[Offer], float | None]:
    def speed(offer: Offer) -> float | None:
        known = speed_of(offer) if speed_of is not None else None
        return known.steps_per_second if known is not None else overall
    return speed


def spot_markets_now(offers: list[Offer], resources: Resources, *, zone_history: dict[str, tuple[int, float]],
                     avoid_zones: set[str], backoff: BackoffBook, now: float,
                     speed: Callable[[Offer], float] = lambda offer: 1.0,
                     room: Callable[[Candidate], bool] | None = None, nodes: int = 1) -> list[Market]:
    """The spot markets a job could launch in now (fitting, not backed off, not in a zone that preempted it
    within the hour, with room for a gang), at their observed preemption rates and the job's expected speed
    there: where a move back to spot would go."""
    ranked = [c for c in rank_offers(offers, resources, backoff=backoff, now=now) if c.spot
              and (room is None or room(c))]
    return [m for m in _markets(ranked, zone_history, speed, nodes) if m.zone not in avoid_zones]


def _markets(ranked: list[Candidate], zone_history: dict[str, tuple[int, float]],
             speed: Callable[[Offer], float] = lambda offer: 1.0, nodes: int = 1) -> dict[Market, Candidate]:
    """The cost policy's markets of ranked candidates (each market's best candidate), with observed rates."""
    rates = observe.preemption_rates(zone_history)
    several = len(_kinds(ranked)) > 1  # name the type in messages only when there is a choice of types
    by_market: dict[Market, Candidate] = {}
    for candidate in ranked:  # best first: a market's first candidate is the one to launch
        offer = candidate.offer
        rate = rates.get(offer.zone, 0.0) if candidate.spot else 0.0
        market = Market(offer.zone, candidate.spot, candidate.price * nodes, rate, speed(offer),
                        f"{offer.zone} ({offer.instance_type})" if several else "")
        by_market.setdefault(market, candidate)
    return by_market
