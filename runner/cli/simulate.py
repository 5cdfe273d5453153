"""`runner simulate`: replay a job on a folder of spot traces under each policy (docs/cost-policy.md)."""

from __future__ import annotations

import math

import click

from ..costpolicy.simulate import Job, NodeType, simulate as run_simulation
from ..costpolicy.traces import TraceError, load_traces
from .render import print_json, print_table

_DEFAULTS = Job()


@click.command()
@click.option("--traces", "folder", required=True, help="Folder of trace files, one JSON file per zone.")
@click.option("--job-hours", type=float, default=_DEFAULTS.work_hours, show_default=True,
              help="Hours of work (with --throughput: at the first type's speed).")
@click.option("--deadline-hours", type=float, default=_DEFAULTS.deadline_hours, show_default=True,
              help="Hours from the start to the deadline.")
@click.option("--restart-minutes", type=float, default=_DEFAULTS.restart_minutes, show_default=True,
              help="Minutes a launch and restore take (a preemption costs one).")
@click.option("--spot-price", "spot_prices", multiple=True,
              help=f"USD per node-hour [default: {_DEFAULTS.spot_price}]; with --throughput, TYPE=PRICE for each type.")
@click.option("--on-demand-price", "on_demand_prices", multiple=True,
              help=f"USD per node-hour [default: {_DEFAULTS.on_demand_price}]; with --throughput, TYPE=PRICE for each "
                   "type.")
@click.option("--throughput", "throughputs", multiple=True, metavar="TYPE=STEPS_PER_S",
              help="A node type the job may run on and its steps per second there; repeat for each type.")
@click.option("--nodes", type=int, default=1, show_default=True,
              help="A gang of this many nodes: a zone has spot at a tick when at least this many are up.")
@click.option("--starts", type=int, default=50, show_default=True,
              help="Start offsets, spread evenly over the traces.")
@click.option("--json", "as_json", is_flag=True)
def simulate(folder: str, job_hours: float, deadline_hours: float, restart_minutes: float,
             spot_prices: tuple[str, ...], on_demand_prices: tuple[str, ...], throughputs: tuple[str, ...],
             nodes: int, starts: int, as_json: bool):
    """Replay a job on spot traces: each policy's mean cost, against on-demand, and deadlines met."""
    try:
        job = _job(job_hours, deadline_hours, restart_minutes, spot_prices, on_demand_prices, throughputs, nodes)
        results = run_simulation(load_traces(folder, nodes=nodes), job, starts=starts)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None  # exit 2: bad input
    if as_json:
        return print_json([r.to_json() for r in results])
    headers = ["POLICY", "MEAN COST", "VS ON-DEMAND", "DEADLINE MET", "RUNS"]
    rows = [[r.policy, f"${r.mean_cost_usd:.2f}", f"{r.vs_on_demand:.0%}", f"{r.deadline_met_fraction:.0%}", r.runs]
            for r in results]
    if job.types:
        headers.append("LAUNCHES BY TYPE")
        for row, r in zip(rows, results):
            row.append(", ".join(f"{name} {count}" for name, count in r.launches_by_type.items()))
    print_table(headers, rows)


def _job(job_hours, deadline_hours, restart_minutes, spot_prices, on_demand_prices, throughputs, nodes) -> Job:
    """The replayed job; with --throughput, one NodeType per type, each with its TYPE=PRICE prices."""
    if not throughputs:
        return Job(job_hours, deadline_hours, restart_minutes,
                   _plain("--spot-price", spot_prices or (str(_DEFAULTS.spot_price),)),
                   _plain("--on-demand-price", on_demand_prices or (str(_DEFAULTS.on_demand_price),)), nodes=nodes)
    speeds = _pairs("--throughput", throughputs)
    spot = _pairs("--spot-price", spot_prices, speeds)
    on_demand = _pairs("--on-demand-price", on_demand_prices, speeds)
    types = tuple(NodeType(name, speed, spot[name], on_demand[name]) for name, speed in speeds.items())
    return Job(job_hours, deadline_hours, restart_minutes, types[0].spot_price, types[0].on_demand_price,
               types=types, nodes=nodes)


def _plain(option: str, values: tuple[str, ...]) -> float:
    if len(values) != 1 or "=" in values[0]:
        raise TraceError(f"{option} {' '.join(values)}: give one price (TYPE=PRICE goes with --throughput)")
    return _number(option, values[0])


def _pairs(option: str, values: tuple[str, ...], types: dict | None = None) -> dict[str, float]:
    """TYPE=NUMBER items; with ``types``, exactly one for each of them."""
    out: dict[str, float] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not name.strip():
            raise TraceError(f"{option} {value}: use TYPE=NUMBER, one for each --throughput type")
        if name.strip() in out:
            raise TraceError(f"{option} {name.strip()}: given twice; give each type once")
        out[name.strip()] = _number(f"{option} {name.strip()}", number)
    if types is not None and set(out) != set(types):
        missing, extra = sorted(set(types) - set(out)), sorted(set(out) - set(types))
        what = "; ".join(part for part in (f"missing for {', '.join(missing)}" if missing else "",
                                           f"no --throughput for {', '.join(extra)}" if extra else "") if part)
        raise TraceError(f"{option}: give TYPE=PRICE for each --throughput type ({what})")
    return out


def _number(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{option} {text!r}: not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise TraceError(f"{option} {text}: must be a positive number")
    return value
