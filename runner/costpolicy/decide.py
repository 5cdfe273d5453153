"""The deadline-aware spot policy: one pure decision over a clock, an offer list and progress.

The scheduler (runner/scheduler/placement.py) and the simulator (runner/costpolicy/simulate.py) both call
:func:`decide`; nothing here reads a clock, a database or a provider.

What the policy knows that a generic one does not: a preemption notice gives the job an emergency
checkpoint, so a preemption costs one restart (launch + restore), never an interval of work. While a job
runs, on spot or on-demand, its slack (time left minus work left) therefore stays constant; slack is spent
only while it waits or restarts. The policy keeps slack for one more restart in reserve at all times, so
a preemption at any moment still leaves time to finish on-demand.

Rules (S = slack, r = restart seconds, E = the expected restarts' cost of the rest of the work on spot at
the observed preemption rate, m = a safety margin), applied whenever the job needs a node:

- spot is affordable when S >= r (its launch) + E + r (the reserve) + m: launch the spot market with the
  lowest expected price (price x (1 + preemptions/h x restart hours));
- no spot capacity now: wait while S, after the wait, still covers an on-demand launch and m;
- otherwise on-demand.

A running node is kept, spot or on-demand. Spot needs no proactive move to on-demand: slack is constant
while it runs, and the reserve covers the restart after a preemption. A move from on-demand back to spot
would pay on some traces (docs/cost-policy.md measures it) but needs a stop-with-checkpoint on request,
which the agent does not have; the job moves back to spot at its next launch instead.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0


@dataclass(frozen=True)
class Market:
    """One place a node can run now: a zone's spot or on-demand market at its hourly price."""

    zone: str
    spot: bool
    price: float
    preemptions_per_hour: float = 0.0  # observed (spot only): the job's own and the zone's history


@dataclass(frozen=True)
class Decision:
    """Where to run (None: wait for spot), and one plain sentence saying why."""

    market: Market | None
    reason: str


def spot_seconds_needed(work_left: float, restart: float, preemptions_per_hour: float) -> float:
    """Expected seconds to finish ``work_left`` on spot: a launch, the work, and a restart per preemption."""
    return restart + work_left + preemptions_per_hour * work_left / HOUR * restart


def decide(*, now: float, deadline: float, work_left: float, restart: float, markets: list[Market],
           margin: float = 0.0, wait_step: float = 0.0) -> Decision:
    """The runner policy's choice for a job that needs a node at ``now`` (a running node is kept).

    ``work_left``: seconds of work to the job's end at the speed it runs; ``restart``: seconds a launch
    and restore take; ``markets``: what can be launched now (a spot market only where spot is available);
    ``margin``: seconds kept beyond the reserve; ``wait_step``: how long a decision to wait lasts before
    the next one (the simulator's tick).
    """
    time_left = deadline - now
    slack = time_left - work_left
    spots = sorted((m for m in markets if m.spot), key=lambda m: (_expected_price(m, restart), m.zone))
    on_demands = sorted((m for m in markets if not m.spot), key=lambda m: (m.price, m.zone))
    on_demand = on_demands[0] if on_demands else None
    facts = f"{_hours(work_left)} h of work left, {_hours(time_left)} h to the deadline"

    if time_left < work_left + restart:
        return Decision(on_demand, f"on-demand: the deadline cannot be met any more ({facts}, "
                                   f"{_minutes(restart)} min per launch); finishing as early as possible")

    best_spot = spots[0] if spots else None
    if best_spot is not None:
        need = spot_seconds_needed(work_left, restart, best_spot.preemptions_per_hour)
        if time_left >= need + restart + margin:
            return Decision(best_spot, f"spot: {facts}, spot would need {_hours(need)} h at the observed "
                                       f"{_rate(best_spot.preemptions_per_hour)} preemptions/h, leaving "
                                       f"{_hours(time_left - need)} h for a fallback to on-demand")
        why = (f"spot would need {_hours(need)} h at the observed {_rate(best_spot.preemptions_per_hour)} "
               "preemptions/h")
    else:
        keep = restart + margin  # what an on-demand launch after the wait still needs
        if slack - wait_step >= keep:
            return Decision(None, f"waiting for spot: no spot capacity now; {facts}, on-demand not needed "
                                  f"before {_hours(slack - keep)} h more of waiting")
        why = "no spot capacity now, and no time to wait for it"
    if on_demand is None:
        return Decision(None, f"waiting: no on-demand offer fits; {facts}")
    return Decision(on_demand, f"on-demand: {facts}, {why}")


def _expected_price(market: Market, restart: float) -> float:
    """The price per hour of work, counting the restarts that preemptions cost."""
    return market.price * (1.0 + market.preemptions_per_hour * restart / HOUR)


def _hours(seconds: float) -> str:
    return f"{seconds / HOUR:.1f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}"


def _rate(per_hour: float) -> str:
    return f"{per_hour:.2g}"
