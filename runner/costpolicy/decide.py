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

A running spot node is kept: slack is constant while it runs, and the reserve covers the restart after a
preemption, so a move to on-demand would only spend a restart early. A job running on on-demand moves back
to spot (:func:`return_to_spot`) when the move itself (a stop with a checkpoint and a spot launch) still
leaves what the first rule asks for, and the move saves money; never twice within ``MOVE_HOLD_SECONDS``.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0
# After a move back to spot, no other for this long. A spot market that has just come back may go again
# at once, and each move spends a restart of slack and of billed time: with a 5-minute restart, a move at
# most every 30 minutes bounds what a flapping market can spend on moves to a sixth of the job's time.
MOVE_HOLD_SECONDS = 1800.0


@dataclass(frozen=True)
class Market:
    """One place a node can run now: a zone's spot or on-demand market at its hourly price."""

    zone: str
    spot: bool
    price: float
    preemptions_per_hour: float = 0.0  # observed (spot only): the job's own and the zone's history
    speed: float = 1.0  # work done per second here: the job's expected steps/s on this offer (1: all alike)
    name: str = ""  # what the market is, for messages: "L4 spot in us-east-1b"; the zone when empty

    def work(self, work_left: float) -> float:
        """Seconds this market takes for ``work_left`` (seconds of work at speed 1)."""
        return work_left / self.speed

    def label(self) -> str:
        return self.name or self.zone


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

    ``work_left``: seconds of work to the job's end at speed 1 (each market does it in ``work_left / speed``:
    the scheduler passes steps left and each offer's expected steps/s); ``restart``: seconds a launch
    and restore take; ``markets``: what can be launched now (a spot market only where spot is available);
    ``margin``: seconds kept beyond the reserve; ``wait_step``: how long a decision to wait lasts before
    the next one (the simulator's tick).

    Among markets the cheapest is the one with the lowest expected price per unit of work (per step), not per
    hour. The reserve is a fallback to the fastest on-demand market (the rescue): spot is taken only while a
    preemption at any moment still leaves time for a launch there and the rest of the work at its speed.
    """
    time_left = deadline - now
    spots = sorted((m for m in markets if m.spot), key=lambda m: (_per_work(m, restart), m.zone, m.name))
    on_demands = sorted((m for m in markets if not m.spot), key=lambda m: (m.price / m.speed, m.zone, m.name))
    rescue = min(on_demands, key=lambda m: (-m.speed, m.price, m.zone, m.name)) if on_demands else None
    rescue_work = rescue.work(work_left) if rescue else (spots[0].work(work_left) if spots else work_left)
    slack = time_left - rescue_work

    def facts(market: Market | None) -> str:
        work = market.work(work_left) if market is not None else rescue_work
        return f"{_hours(work)} h of work left, {_hours(time_left)} h to the deadline"

    if time_left < rescue_work + restart:
        return Decision(rescue, f"on-demand: the deadline cannot be met any more ({facts(rescue)}, "
                                f"{_minutes(restart)} min per launch); finishing as early as possible")

    best_spot = spots[0] if spots else None
    cheapest_on_demand = on_demands[0] if on_demands else None
    if best_spot is not None:
        need = spot_seconds_needed(best_spot.work(work_left), restart, best_spot.preemptions_per_hour)
        if cheapest_on_demand is not None and cheapest_on_demand.price / cheapest_on_demand.speed < \
                _per_work(best_spot, restart) and time_left >= cheapest_on_demand.work(work_left) + restart + margin:
            return Decision(cheapest_on_demand, f"on-demand: {facts(cheapest_on_demand)}, and a step costs less on "
                                                f"{cheapest_on_demand.label()} than on any spot offer")
        if time_left >= max(need, restart + rescue_work) + restart + margin:
            return Decision(best_spot, f"spot: {facts(best_spot)}, spot would need {_hours(need)} h at the observed "
                                       f"{_rate(best_spot.preemptions_per_hour)} preemptions/h, leaving "
                                       f"{_hours(time_left - need)} h for a fallback to on-demand")
        why = (f"spot would need {_hours(need)} h at the observed {_rate(best_spot.preemptions_per_hour)} "
               "preemptions/h")
    else:
        keep = restart + margin  # what an on-demand launch after the wait still needs
        if slack - wait_step >= keep:
            return Decision(None, f"waiting for spot: no spot capacity now; {facts(None)}, on-demand not needed "
                                  f"before {_hours(slack - keep)} h more of waiting")
        why = "no spot capacity now, and no time to wait for it"
    if rescue is None:
        return Decision(None, f"waiting: no on-demand offer fits; {facts(None)}")
    in_time = [m for m in on_demands if time_left >= m.work(work_left) + restart + margin]
    chosen = in_time[0] if in_time else rescue  # the cheapest per step that still meets the deadline
    return Decision(chosen, f"on-demand: {facts(chosen)}, {why}")


def return_to_spot(*, now: float, deadline: float, work_left: float, restart: float, markets: list[Market],
                   on_demand_price: float, stop: float = 0.0, margin: float = 0.0, last_move: float | None = None,
                   hold: float = MOVE_HOLD_SECONDS, on_demand_speed: float = 1.0) -> Decision:
    """For a job running on on-demand at ``on_demand_price`` (and ``on_demand_speed``): the spot market to move
    to now, or None to stay.

    The move is a stop with a checkpoint (``stop`` seconds) and a spot launch; it is affordable when the time
    left still covers the stop, what spot would need and the reserve and ``margin`` of :func:`decide`'s spot
    rule (the fallback being this on-demand market), and it pays when the work left at the spot market's
    expected price and speed, its launch and the stop cost less than the work left here. ``markets``: the spot
    markets that can be launched now; ``last_move``: when the job last moved (None: never), which holds it
    for ``hold`` seconds.
    """
    if last_move is not None and now - last_move < hold:
        return Decision(None, f"staying on on-demand: moved to spot {_minutes(now - last_move)} min ago, "
                              f"at most one move per {_minutes(hold)} min")
    spots = sorted((m for m in markets if m.spot), key=lambda m: (_per_work(m, restart), m.zone, m.name))
    if not spots:
        return Decision(None, "staying on on-demand: no spot capacity now")
    best = spots[0]
    time_left = deadline - now
    here_work = work_left / on_demand_speed
    need = stop + spot_seconds_needed(best.work(work_left), restart, best.preemptions_per_hour)
    facts = (f"{_hours(time_left - here_work)} h of slack ({_hours(here_work)} h of work left, "
             f"{_hours(time_left)} h to the deadline)")
    how = (f"the move and spot would need {_hours(need)} h at the observed {_rate(best.preemptions_per_hour)} "
           "preemptions/h")
    if time_left < max(need, stop + restart + here_work) + restart + margin:
        return Decision(None, f"staying on on-demand: {facts}, {how}")
    saving = (here_work * on_demand_price - best.work(work_left) * _expected_price(best, restart)
              - restart * best.price - stop * on_demand_price) / HOUR
    if saving <= 0:
        return Decision(None, f"staying on on-demand: {facts}; spot in {best.label()} would not save the move's cost")
    return Decision(best, f"moved to spot: {facts}, {how}, leaving {_hours(time_left - need)} h for a fallback "
                          f"to on-demand; spot in {best.label()} saves about ${saving:.2f}")


def _expected_price(market: Market, restart: float) -> float:
    """The price per hour of work, counting the restarts that preemptions cost."""
    return market.price * (1.0 + market.preemptions_per_hour * restart / HOUR)


def _per_work(market: Market, restart: float) -> float:
    """The expected price per unit of work (per step, when speeds are steps/s)."""
    return _expected_price(market, restart) / market.speed


def _hours(seconds: float) -> str:
    return f"{seconds / HOUR:.1f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}"


def _rate(per_hour: float) -> str:
    return f"{per_hour:.2g}"
