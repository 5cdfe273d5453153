"""Where the next attempt goes: the offer policy applied to a job's history."""

from __future__ import annotations

import time

from ..providers.offers import Offer
from ..spec import Resources
from .policy import BackoffBook, Candidate, rank_offers

RECENT_PREEMPTION_SECONDS = 3600.0  # a zone that preempted the job this recently is tried last
AUTO_ON_DEMAND_AFTER_SECONDS = 600.0  # spot_policy auto: on-demand once spot has not launched this long (default)


def recent_preempted_zones(attempts: list[dict], now: float | None = None) -> set[str]:
    """Zones whose node this job lost to a preemption (or without a trace) within the last hour."""
    now = now or time.time()
    return {
        a["zone"] for a in attempts
        if a["end_reason"] in ("preempted", "lost") and a["ended_at"] and now - a["ended_at"] < RECENT_PREEMPTION_SECONDS
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
