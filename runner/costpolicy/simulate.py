"""Replaying a job on spot traces under each policy, from many start offsets.

The model, the same for every policy: time runs in the traces' ticks; a node held for a tick is billed for
it (the last tick only up to the job's end); each launch (a new node, spot or on-demand) spends
``restart`` seconds of billed time before work resumes; a spot node whose zone has no spot at a tick is
preempted at its start, and keeps its progress (the notice's checkpoint), so a preemption costs the next
launch's restart. A run that has not finished by the deadline misses it and finishes on on-demand after
it, so every policy's cost is that of a finished job.

Node types: a job may run on several types (:class:`NodeType`: a name, the job's steps/s there, its spot and
on-demand prices), every type sharing each zone's availability; work is counted in steps, and the job's
hours of work are at the first type's speed. A gang (``nodes`` > 1) holds spot in a zone at a tick when at
least ``nodes`` instances are up there (the traces count instances), pays every node, and is preempted
whole.
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
class NodeType:
    """One kind of node the job may run on: the job's steps per second there and its prices per node-hour."""

    name: str
    steps_per_second: float
    spot_price: float
    on_demand_price: float

    def price(self, spot: bool) -> float:
        return self.spot_price if spot else self.on_demand_price


@dataclass(frozen=True)
class Job:
    """What is replayed: hours of work, the deadline from the start, one restart, and the prices; optionally
    several node types (``types``: then the prices are theirs, and the hours of work at the first one's speed)
    and a gang of ``nodes``."""

    work_hours: float = 24.0
    deadline_hours: float = 36.0
    restart_minutes: float = 5.0
    spot_price: float = 0.918       # p3.2xlarge (1 x V100) spot, USD/h, the traces' most common shape
    on_demand_price: float = 3.06   # and on-demand
    types: tuple[NodeType, ...] = ()
    nodes: int = 1

    @property
    def node_types(self) -> tuple[NodeType, ...]:
        return self.types or (NodeType("default", 1.0, self.spot_price, self.on_demand_price),)

    @property
    def work_steps(self) -> float:
        return self.work_hours * 3600 * self.node_types[0].steps_per_second

    def check(self) -> None:
        for name, value in (("--job-hours", self.work_hours), ("--deadline-hours", self.deadline_hours),
                            ("--spot-price", self.spot_price), ("--on-demand-price", self.on_demand_price)):
            if not math.isfinite(value) or value <= 0:
                raise TraceError(f"{name} {value:g}: must be a positive number")
        for t in self.types:
            for name, value in (("--throughput", t.steps_per_second), ("--spot-price", t.spot_price),
                                ("--on-demand-price", t.on_demand_price)):
                if not math.isfinite(value) or value <= 0:
                    raise TraceError(f"{name} {t.name}={value:g}: must be a positive number")
        if len({t.name for t in self.types}) < len(self.types):
            raise TraceError("--throughput: each type once")
        if self.nodes < 1:
            raise TraceError(f"--nodes {self.nodes}: must be at least 1")
        if not math.isfinite(self.restart_minutes) or self.restart_minutes < 0:
            raise TraceError(f"--restart-minutes {self.restart_minutes:g}: must be 0 or more")
        fastest = max(t.steps_per_second for t in self.node_types)
        hours = self.work_steps / fastest / 3600
        if self.deadline_hours < hours + self.restart_minutes / 60:
            raise TraceError(f"--deadline-hours {self.deadline_hours:g}: even all on-demand, the job needs "
                             f"{hours + self.restart_minutes / 60:g} h ({hours:g} h of work and "
                             f"a {self.restart_minutes:g} min launch); give a later deadline")


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    mean_cost_usd: float
    vs_on_demand: float
    deadline_met_fraction: float
    runs: int
    launches_by_type: dict[str, int] | None = None  # with several node types: launches on each, over every run

    def to_json(self) -> dict:
        out = {"policy": self.policy, "mean_cost_usd": round(self.mean_cost_usd, 2),
               "vs_on_demand": round(self.vs_on_demand, 3),
               "deadline_met_fraction": round(self.deadline_met_fraction, 3), "runs": self.runs}
        if self.launches_by_type is not None:
            out["launches_by_type"] = self.launches_by_type
        return out


@dataclass(frozen=True)
class Run:
    cost: float
    met: bool
    launches: tuple[int, ...] = ()  # the node type of each launch, in order


# A policy for one run: (tick index in the trace, seconds since the start, steps done, placement) -> the
# placement for this tick: None (no node), or (OD or a zone index (spot there), node type index).
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
        runs["on-demand"].append(_replay(traces, job, start, _on_demand(job)))
        runs["spot"].append(_replay(traces, job, start, _always_spot(traces, job)))
        runs["runner"].append(_replay(traces, job, start, _runner(traces, job, rates)))
        for zone in range(len(traces.zones)):
            runs["uniform-progress"].append(_replay(traces, job, start, _uniform_progress(traces, job, zone)))
    baseline = _mean(r.cost for r in runs["on-demand"])
    names = [t.name for t in job.node_types]
    return [PolicyResult(policy, _mean(r.cost for r in rs), _mean(r.cost for r in rs) / baseline,
                         _mean(1.0 if r.met else 0.0 for r in rs), len(rs),
                         {name: sum(r.launches.count(i) for r in rs) for i, name in enumerate(names)}
                         if job.types else None)
            for policy, rs in runs.items()]


def _replay(traces: Traces, job: Job, start: int, choose: Chooser) -> Run:
    gap, work, deadline = traces.gap_seconds, job.work_steps, job.deadline_hours * 3600
    restart, types = job.restart_minutes * 60, job.node_types
    placement, overhead, done, cost, launches = None, 0.0, 0.0, 0.0, []
    for k in range(math.ceil(deadline / gap)):
        tick, elapsed = start + k, k * gap
        if placement is not None and placement[0] != OD and not traces.available[placement[0]][tick]:
            placement = None  # preempted: the notice's checkpoint keeps the progress
        wanted = choose(tick, elapsed, done, placement)
        if wanted != placement:
            placement, overhead = wanted, (restart if wanted is not None else 0.0)
            if wanted is not None:
                launches.append(wanted[1])
        if placement is None:
            continue
        kind = types[placement[1]]
        price = kind.price(placement[0] != OD) * job.nodes
        spent_restarting = min(overhead, gap)
        overhead -= spent_restarting
        useful = gap - spent_restarting
        if useful * kind.steps_per_second >= work - done:
            used = spent_restarting + (work - done) / kind.steps_per_second
            return Run(cost + price * used / 3600, elapsed + used <= deadline + 1e-6, tuple(launches))
        done += useful * kind.steps_per_second
        cost += price * gap / 3600
    # Missed: the rest on on-demand after the deadline (what it takes to have the job's result at all).
    if placement is not None and placement[0] == OD:
        kind = types[placement[1]]
        finish = (work - done) / kind.steps_per_second + max(overhead, 0.0)
    else:
        kind = min(types, key=lambda t: t.on_demand_price / t.steps_per_second)
        finish = (work - done) / kind.steps_per_second + restart
    return Run(cost + kind.on_demand_price * job.nodes * finish / 3600, False, tuple(launches))


def _cheapest(job: Job, spot: bool) -> int:
    """The node type with the lowest price per step in that market."""
    types = job.node_types
    return min(range(len(types)), key=lambda i: types[i].price(spot) / types[i].steps_per_second)


def _on_demand(job: Job) -> Chooser:
    placement = (OD, _cheapest(job, False))
    return lambda *_: placement


def _always_spot(traces: Traces, job: Job) -> Chooser:
    kind = _cheapest(job, True)

    def choose(tick, elapsed, done, placement):
        if placement is not None and placement[0] != OD:
            return placement
        zone = next((z for z in range(len(traces.zones)) if traces.available[z][tick]), None)
        return None if zone is None else (zone, kind)
    return choose


def _uniform_progress(traces: Traces, job: Job, zone: int) -> Chooser:
    """The paper's policy on the node type with the cheapest spot step (it has no notion of types)."""
    kind = _cheapest(job, True)
    speed = job.node_types[kind].steps_per_second
    rules = UniformProgress(job.work_steps / speed, job.deadline_hours * 3600, job.restart_minutes * 60)
    as_rule = {None: IDLE, (OD, kind): ON_DEMAND, (zone, kind): SPOT}
    as_placement = {IDLE: None, ON_DEMAND: (OD, kind), SPOT: (zone, kind)}

    def choose(tick, elapsed, done, placement):
        return as_placement[rules.step(elapsed=elapsed, done=done / speed, current=as_rule[placement],
                                       spot_available=traces.available[zone][tick])]
    return choose


def _runner(traces: Traces, job: Job, rates: "_PreemptionRates", hold: float = MOVE_HOLD_SECONDS) -> Chooser:
    """Runner's policy: decides whenever the job has no node, over every zone and node type; a spot node is
    kept, and an on-demand one is left for spot when :func:`return_to_spot` says so (the move costs a spot
    launch's restart; the stop's checkpoint is instant in the model, as a notice's is).

    With several node types, the job's speed on them is unknown before its first launch has run (as in the
    scheduler): that launch takes the cheapest spot hour (else on-demand hour); from then on every type's
    speed counts, as measured on one and scaled to the others."""
    work, deadline, restart = job.work_steps, job.deadline_hours * 3600, job.restart_minutes * 60
    types, nodes = job.node_types, job.nodes
    on_demands = [Market("on-demand", False, t.on_demand_price * nodes, speed=t.steps_per_second, name=t.name)
                  for t in types]
    moved_at: list[float] = []
    ran = [False]  # whether a launch has run a tick: the job's speed is measured from then on

    def spot_markets(tick):
        return [Market(traces.zones[z], True, t.spot_price * nodes, rates.per_hour(z, tick), t.steps_per_second,
                       f"{t.name} in {traces.zones[z]}" if len(types) > 1 else "")
                for z in range(len(traces.zones)) if traces.available[z][tick] for t in types]

    def as_placement(market: Market):
        kind = next(i for i, t in enumerate(types) if t.steps_per_second == market.speed
                    and t.price(market.spot) * nodes == market.price)
        return (OD, kind) if not market.spot else (traces.zones.index(market.zone), kind)

    def choose(tick, elapsed, done, placement):
        markets = spot_markets(tick)
        if placement is not None:
            ran[0] = True
        if placement is not None and placement[0] == OD:
            here = types[placement[1]]
            move = return_to_spot(now=elapsed, deadline=deadline, work_left=work - done, restart=restart,
                                  markets=markets, on_demand_price=here.on_demand_price * nodes,
                                  on_demand_speed=here.steps_per_second, margin=traces.gap_seconds,
                                  last_move=moved_at[-1] if moved_at else None, hold=hold)
            if move.market is None:
                return placement
            moved_at.append(elapsed)
            return as_placement(move.market)
        if placement is not None:
            return placement
        if len(types) > 1 and not ran[0]:  # nothing measured yet: the cheapest hour, spot first
            pool = markets or on_demands
            return as_placement(min(pool, key=lambda m: (m.price, m.zone, m.name)))
        decision = decide(now=elapsed, deadline=deadline, work_left=work - done, restart=restart,
                          markets=[*markets, *on_demands], margin=traces.gap_seconds, wait_step=traces.gap_seconds)
        if decision.market is None:
            return None
        return as_placement(decision.market)
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
