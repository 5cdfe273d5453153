"""`runner simulate`: replay a job on a folder of spot traces under each policy (docs/cost-policy.md)."""

from __future__ import annotations

import click

from ..costpolicy.simulate import Job, simulate as run_simulation
from ..costpolicy.traces import TraceError, load_traces
from .render import print_json, print_table

_DEFAULTS = Job()


@click.command()
@click.option("--traces", "folder", required=True, help="Folder of trace files, one JSON file per zone.")
@click.option("--job-hours", type=float, default=_DEFAULTS.work_hours, show_default=True,
              help="Hours of work on one node.")
@click.option("--deadline-hours", type=float, default=_DEFAULTS.deadline_hours, show_default=True,
              help="Hours from the start to the deadline.")
@click.option("--restart-minutes", type=float, default=_DEFAULTS.restart_minutes, show_default=True,
              help="Minutes a launch and restore take (a preemption costs one).")
@click.option("--spot-price", type=float, default=_DEFAULTS.spot_price, show_default=True, help="USD per hour.")
@click.option("--on-demand-price", type=float, default=_DEFAULTS.on_demand_price, show_default=True,
              help="USD per hour.")
@click.option("--starts", type=int, default=50, show_default=True,
              help="Start offsets, spread evenly over the traces.")
@click.option("--json", "as_json", is_flag=True)
def simulate(folder: str, job_hours: float, deadline_hours: float, restart_minutes: float, spot_price: float,
             on_demand_price: float, starts: int, as_json: bool):
    """Replay a job on spot traces: each policy's mean cost, against on-demand, and deadlines met."""
    job = Job(job_hours, deadline_hours, restart_minutes, spot_price, on_demand_price)
    try:
        results = run_simulation(load_traces(folder), job, starts=starts)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None  # exit 2: bad input
    if as_json:
        return print_json([r.to_json() for r in results])
    print_table(["POLICY", "MEAN COST", "VS ON-DEMAND", "DEADLINE MET", "RUNS"],
                [[r.policy, f"${r.mean_cost_usd:.2f}", f"{r.vs_on_demand:.0%}", f"{r.deadline_met_fraction:.0%}",
                  r.runs] for r in results])
