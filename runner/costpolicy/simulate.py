"""Replaying a job on spot traces under each policy, from many start offsets.

The model, the same for every policy: time runs in the traces' ticks; a node held for a tick is billed for
it (the last tick only up to the job's end); each launch (a new node, spot or on-demand) spends
``restart`` seconds of billed time before work resumes; a spot node whose zone has no spot at a tick is
preempted at its start, and keeps its progress (the notice's checkpoint), so a preemption costs the next
launch's restart. A run that has not finished by the deadline misses it and finishes on on-demand after
it, so every policy's cost is that of a finished job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .decide import MOVE_HOLD_SECONDS, Market, decide, return_to_spot
from .traces import Traces, TraceError
from .uniform_progress import IDLE, ON_DEMAND, SPOT, UniformProgress

POLICIES = ("on-demand", "spot", "uniform-progress", "runner")
RATE_WINDOW_SECONDS = 24 * 3600.0  # the zone history the runner policy's preemption rate is taken over
OD = "od"  # the on-demand placement (one market: on-demand is never short of capacity in the model)


@dataclass(frozen=True)
class Job:
    """What is replayed: hours of work, the deadline from the start, one restart, and the prices."""

    work_hours: float = 24.0
    deadline_hours: float = 36.0
    restart_minutes: float = 5.0
    spot_price: float = 0.918       # p3.2xlarge (1 x V100) spot, USD/h, the traces' most common shape
    on_demand_price: float = 3.06   # and on-demand

    def check(self) -> None:
        for name, value in (("--job-hours", self.work_hours), ("--deadline-hours", self.deadline_hours),
                            ("--spot-price", self.spot_price), ("--on-demand-price", self.on_demand_price)):
            if not math.isfinite(value) or value <= 0:
                raise TraceError(f"{name} {value:g}: must be a positive number")
        if not math.isfinite(self.restart_minutes) or self.restart_minutes < 0:
            raise TraceError(f"--restart-minutes {self.restart_minutes:g}: must be 0 or more")
        if self.deadline_hours < self.work_hours + self.restart_minutes / 60:
            raise TraceError(f"--deadline-hours {self.deadline_hours:g}: even all on-demand, the job needs "
                             f"{self.work_hours + self.restart_minutes / 60:g} h ({self.work_hours:g} h of work and "
                             f"a {self.restart_minutes:g} min launch); give a later deadline")


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    mean_cost_usd: float
    vs_on_demand: float
    deadline_met_fraction: float
    runs: int

    def to_json(self) -> dict:
        return {"policy": self.policy, "mean_cost_usd": round(self.mean_cost_usd, 2),
                "vs_on_demand": round(self.vs_on_demand, 3),
                "deadline_met_fraction": round(self.deadline_met_fraction, 3), "runs": self.runs}


@dataclass(frozen=True)
class Run:
    cost: float
    met: bool


# A policy for one run: (tick index in the trace, seconds since the start, work done, placement) -> the
# placement for this tick: None (no node), OD, or a zone index (spot there).
Chooser = Callable[[int, float, float, object], object]


def simulate(traces: Traces, job: Job, starts: int = 50) -> list[PolicyResult]:
    """Each policy's mean cost, cost against on-demand and share of deadlines met, over ``starts`` offsets."""
    job.check()
    gap = traces.gap_seconds
    deadline_ticks = math.ceil(job.deadline_hours * 3600 / gap)
    if deadline_ticks > traces.ticks:
        raise TraceError(f"--deadline-hours {job.deadline_hours:g}: the traces cover only {traces.hours:.1f} h "
                         f"({traces.ticks} ticks of {gap:g} s); give a deadline within them")
    if starts < 1:
        raise TraceError(f"--starts {starts}: must be at least 1")
    last = traces.ticks - deadline_ticks
    offsets = sorted({round(last * k / (starts - 1)) for k in range(starts)}) if starts > 1 else [0]
    rates = _PreemptionRates(traces)
    runs: dict[str, list[Run]] = {policy: [] for policy in POLICIES}
    for start in offsets:
        runs["on-demand"].append(_replay(traces, job, start, lambda *_: OD))
        runs["spot"].append(_replay(traces, job, start, _always_spot(traces)))
        runs["runner"].append(_replay(traces, job, start, _runner(traces, job, rates)))
        for zone in range(len(traces.zones)):
            runs["uniform-progress"].append(_replay(traces, job, start, _uniform_progress(traces, job, zone)))
    baseline = _mean(r.cost for r in runs["on-demand"])
    return [PolicyResult(policy, _mean(r.cost for r in rs), _mean(r.cost for r in rs) / baseline,
                         _mean(1.0 if r.met else 0.0 for r in rs), len(rs)) for policy, rs in runs.items()]


def _replay(traces: Traces, job: Job, start: int, choose: Chooser) -> Run:
    gap, work, deadline = traces.gap_seconds, job.work_hours * 3600, job.deadline_hours * 3600
    restart = job.restart_minutes * 60
    placement, overhead, done, cost = None, 0.0, 0.0, 0.0
    for k in range(math.ceil(deadline / gap)):
        tick, elapsed = start + k, k * gap
        if placement not in (None, OD) and not traces.available[placement][tick]:
            placement = None  # preempted: the notice's checkpoint keeps the progress
        wanted = choose(tick, elapsed, done, placement)
        if wanted != placement:
            placement, overhead = wanted, (restart if wanted is not None else 0.0)
        if placement is None:
            continue
        price = job.on_demand_price if placement == OD else job.spot_price
        spent_restarting = min(overhead, gap)
        overhead -= spent_restarting
        useful = gap - spent_restarting
        if useful >= work - done:
            used = spent_restarting + (work - done)
            return Run(cost + price * used / 3600, elapsed + used <= deadline + 1e-6)
        done += useful
        cost += price * gap / 3600
    # Missed: the rest on on-demand after the deadline (what it takes to have the job's result at all).
    finish = (work - done) + max(overhead, 0.0) if placement == OD else (work - done) + restart
    return Run(cost + job.on_demand_price * finish / 3600, False)


def _always_spot(traces: Traces) -> Chooser:
    def choose(tick, elapsed, done, placement):
        if placement not in (None, OD):
            return placement
        return next((z for z in range(len(traces.zones)) if traces.available[z][tick]), None)
    return choose


def _uniform_progress(traces: Traces, job: Job, zone: int) -> Chooser:
    rules = UniformProgress(job.work_hours * 3600, job.deadline_hours * 3600, job.restart_minutes * 60)
    as_rule = {None: IDLE, OD: ON_DEMAND, zone: SPOT}
    as_placement = {IDLE: None, ON_DEMAND: OD, SPOT: zone}

    def choose(tick, elapsed, done, placement):
        return as_placement[rules.step(elapsed=elapsed, done=done, current=as_rule[placement],
                                       spot_available=traces.available[zone][tick])]
    return choose


def _runner(traces: Traces, job: Job, rates: "_PreemptionRates", hold: float = MOVE_HOLD_SECONDS) -> Chooser:
    """Runner's policy: decides whenever the job has no node, over every zone; a spot node is kept, and an
    on-demand one is left for spot when :func:`return_to_spot` says so (the move costs a spot launch's restart;
    the stop's checkpoint is instant in the model, as a notice's is)."""
    work, deadline, restart = job.work_hours * 3600, job.deadline_hours * 3600, job.restart_minutes * 60
    on_demand = Market("on-demand", False, job.on_demand_price)
    moved_at: list[float] = []

    def choose(tick, elapsed, done, placement):
        markets = [Market(traces.zones[z], True, job.spot_price, rates.per_hour(z, tick))
                   for z in range(len(traces.zones)) if traces.available[z][tick]]
        if placement == OD:
            move = return_to_spot(now=elapsed, deadline=deadline, work_left=work - done, restart=restart,
                                  markets=markets, on_demand_price=job.on_demand_price, margin=traces.gap_seconds,
                                  last_move=moved_at[-1] if moved_at else None, hold=hold)
            if move.market is None:
                return OD
            moved_at.append(elapsed)
            return traces.zones.index(move.market.zone)
        if placement is not None:
            return placement
        decision = decide(now=elapsed, deadline=deadline, work_left=work - done, restart=restart,
                          markets=[*markets, on_demand], margin=traces.gap_seconds, wait_step=traces.gap_seconds)
        if decision.market is None:
            return None
        return OD if not decision.market.spot else traces.zones.index(decision.market.zone)
    return choose


class _PreemptionRates:
    """Each zone's observed preemptions per hour of spot held, over the day before a tick (past only)."""

    def __init__(self, traces: Traces):
        self.gap = traces.gap_seconds
        self.window = max(1, round(RATE_WINDOW_SECONDS / self.gap))
        self.drops: list[list[int]] = []
        self.up: list[list[int]] = []
        for series in traces.available:
            drops, up = [0], [0]
            for i, here in enumerate(series):
                drops.append(drops[-1] + (1 if i and series[i - 1] and not here else 0))
                up.append(up[-1] + (1 if here else 0))
            self.drops.append(drops)
            self.up.append(up)

    def per_hour(self, zone: int, tick: int) -> float:
        begin = max(0, tick - self.window)
        drops = self.drops[zone][tick + 1] - self.drops[zone][begin]
        up_hours = (self.up[zone][tick + 1] - self.up[zone][begin]) * self.gap / 3600
        return drops / max(up_hours, 1.0)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
