"""`runner offers`: what the configured clouds can launch, cheapest first."""

from __future__ import annotations

import click

from .connect import connect
from .render import money, print_json, print_table


@click.command()
@click.option("--accelerators", multiple=True,
              help="NAME:N, e.g. A100:8; repeat it (or separate by commas) for offers with any of several.")
@click.option("--cloud", type=click.Choice(["local", "aws", "gcp", "azure"]))
@click.option("--on-demand", is_flag=True, help="Order by on-demand price.")
@click.option("--refresh", is_flag=True, help="Read live spot prices now instead of the cached ones.")
@click.option("--json", "as_json", is_flag=True)
def offers(accelerators: tuple[str, ...], cloud: str | None, on_demand: bool, refresh: bool, as_json: bool):
    """Offers that fit, cheapest first, with spot and on-demand prices per hour."""
    params = {"accelerators": list(accelerators), "cloud": cloud, "on_demand": on_demand, "refresh": refresh}
    rows = connect().get("/v1/offers", params={k: v for k, v in params.items() if v})
    if as_json:
        return print_json(rows)
    print_table(
        ["CLOUD", "REGION", "ZONE", "TYPE", "ACCELERATORS", "CPUS", "MEM GB", "SPOT/H", "ON-DEMAND/H"],
        [[r["cloud"], r["region"], r["zone"], r["instance_type"],
          f"{r['accelerator']}:{r['accelerator_count']}" if r["accelerator"] else "-", r["cpus"], r["memory_gb"],
          money(r["spot_price"]), money(r["on_demand_price"])] for r in rows],
        empty="No offer fits; loosen the filters or configure another cloud in $RUNNER_HOME/config.yaml.",
    )
