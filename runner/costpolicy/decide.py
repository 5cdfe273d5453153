"""The deadline-aware spot policy: one pure decision over a clock, an offer list and progress.

The scheduler (runner/scheduler/placement.py) and the simulator (runner/costpolicy/simulate.py) both call
:func:`decide`; nothing here reads a clock, a database or a provider.

What the policy knows that a generic one does not: a preemption notice gives the job an emergency
checkpoint, so a preemption costs one restart (launch + restore), never an interval of work. While a job
runs, on spot or on-demand, its slack (time left minus work left) therefore stays constant; slack is spent
only while it waits or restarts. The policy keeps slack for one more restart in reserve at all times, so
a preemption at any moment still leaves time to finish on-demand.

Rules (S = slack, r = restart seconds, E = the expected restarts' cost of the rest of the work on spot at
the observed preemption rate, m = a safety margin):

- running on spot: stay (no proactive migration: slack is constant while it runs; a switch would itself
  cost a restart);
- spot is affordable when S >= r (its launch) + E + r (the reserve) + m: launch the spot market with the
  lowest expected price (price x (1 + preemptions/h x restart hours)), and move back to it from on-demand
  as soon as that holds and the switch saves money;
- no affordable spot: wait while S stays above what a later on-demand launch (r) plus an affordable spot
  return would need, else launch on-demand (so that the job can still go back to spot when it returns).
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

    def label(self) -> str:
        return f"{'spot' if self.spot else 'on-demand'} in {self.zone}"


@dataclass(frozen=True)
class Decision:
    """Where to run (None: wait for spot), and one plain sentence saying why."""

    market: Market | None
    reason: str
    must_on_demand: bool = False  # the deadline needs on-demand from now on (or cannot be met at all)


def spot_seconds_needed(work_left: float, restart: float, preemptions_per_hour: float, launch: bool = True) -> float:
    """Expected seconds to finish ``work_left`` on spot: a launch, the work, and a restart per preemption."""
    expected_preemptions = preemptions_per_hour * work_left / HOUR
    return (restart if launch else 0.0) + work_left + expected_preemptions * restart


def decide(*, now: float, deadline: float, work_left: float, restart: float, markets: list[Market],
           current: Market | None = None, margin: float = 0.0, wait_step: float = 0.0) -> Decision:
    """The runner policy's choice for a job at ``now``.

    ``work_left``: seconds of work to the job's end at the speed it runs; ``restart``: seconds a launch
    and restore take; ``markets``: what can be launched now (a spot market only where spot is available);
    ``current``: the market the job runs in (None when it needs a launch); ``wait_step``: how long a
    decision to wait lasts before the next one (the simulator's tick).
    """
    time_left = deadline - now
    slack = time_left - work_left
    spots = sorted((m for m in markets if m.spot), key=lambda m: (_expected_price(m, restart), m.zone))
    on_demands = sorted((m for m in markets if not m.spot), key=lambda m: (m.price, m.zone))
    on_demand = on_demands[0] if on_demands else None
    facts = f"{_hours(work_left)} h of work left, {_hours(time_left)} h to the deadline"

    if current is not None and current.spot:
        return Decision(current, f"spot: running in {current.zone}; {facts}; a preemption costs a restart, "
                                 "and the reserve still covers one")
    if time_left < work_left + (0.0 if current is not None else restart):
        target = current or on_demand
        return Decision(target, f"on-demand: the deadline cannot be met any more ({facts}, "
                                f"{_minutes(restart)} min per launch); finishing as early as possible",
                        must_on_demand=True)

    best_spot = spots[0] if spots else None
    if best_spot is not None:
        need = spot_seconds_needed(work_left, restart, best_spot.preemptions_per_hour)
        if time_left >= need + restart + margin and _switch_pays(current, best_spot, work_left, restart):
            return Decision(best_spot, f"spot: {facts}, spot would need {_hours(need)} h at the observed "
                                       f"{_rate(best_spot.preemptions_per_hour)} preemptions/h, leaving "
                                       f"{_hours(time_left - need)} h for a fallback to on-demand")
    if current is not None:  # on-demand, and spot is not (yet) affordable
        why = (f"spot would need {_hours(spot_seconds_needed(work_left, restart, best_spot.preemptions_per_hour))} h"
               f" at the observed {_rate(best_spot.preemptions_per_hour)} preemptions/h"
               if best_spot else "no spot capacity now")
        return Decision(current, f"on-demand: {facts}, {why}")

    # Idle with no affordable spot: wait while a later on-demand launch could still return to spot.
    rate = best_spot.preemptions_per_hour if best_spot else max(
        (m.preemptions_per_hour for m in markets if m.spot), default=0.0)
    keep = restart + spot_seconds_needed(work_left, restart, rate) - work_left + restart + margin
    if best_spot is None and slack - wait_step >= keep:
        return Decision(None, f"waiting for spot: no spot capacity now; {facts}, on-demand not needed "
                              f"before {_hours(slack - keep)} h more of waiting")
    if on_demand is None:
        return Decision(None, f"waiting: no on-demand offer fits; {facts}", must_on_demand=True)
    why = (f"spot would need {_hours(spot_seconds_needed(work_left, restart, best_spot.preemptions_per_hour))} h "
           f"at the observed {_rate(best_spot.preemptions_per_hour)} preemptions/h" if best_spot
           else "no spot capacity now, and waiting longer would leave no time to return to spot")
    return Decision(on_demand, f"on-demand: {facts}, {why}", must_on_demand=True)


def _expected_price(market: Market, restart: float) -> float:
    """The price per hour of work, counting the restarts that preemptions cost."""
    return market.price * (1.0 + market.preemptions_per_hour * restart / HOUR)


def _switch_pays(current: Market | None, spot: Market, work_left: float, restart: float) -> bool:
    """From on-demand, moving to spot must save more than the restart it costs."""
    if current is None:
        return True
    saved = (current.price - _expected_price(spot, restart)) * work_left / HOUR
    return saved > spot.price * restart / HOUR + current.price * restart / HOUR


def _hours(seconds: float) -> str:
    return f"{seconds / HOUR:.1f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}"


def _rate(per_hour: float) -> str:
    return f"{per_hour:.2g}"
