"""`runner offers`: what the configured clouds can launch, cheapest first."""

from __future__ import annotations

import os

import click

from ..home import runner_home
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
    client = connect()
    rows = client.get("/v1/offers", params={k: v for k, v in params.items() if v})
    if as_json:
        print_json(rows)
    if not rows:  # exit 1 with or without --json (the JSON is then `[]`), and why on stderr
        click.echo(f"No offer fits: {_why_none(client, accelerators, cloud)}", err=True)
        raise SystemExit(1)
    if as_json:
        return
    print_table(
        ["CLOUD", "REGION", "ZONE", "TYPE", "ACCELERATORS", "CPUS", "MEM GB", "SPOT/H", "ON-DEMAND/H"],
        [[r["cloud"], r["region"], r["zone"], r["instance_type"],
          f"{r['accelerator']}:{r['accelerator_count']}" if r["accelerator"] else "-", r["cpus"], r["memory_gb"],
          money(r["spot_price"]), money(r["on_demand_price"])] for r in rows],
    )


def _why_none(client, accelerators: tuple[str, ...], cloud: str | None) -> str:
    """What to try instead: the counts an accelerator comes in, or where the clouds are configured."""
    wanted = [item.strip() for text in accelerators for item in text.split(",") if item.strip()]
    for alternative in wanted:
        name, _, count = alternative.partition(":")
        if not (name and count):
            continue
        same = client.get("/v1/offers", params={"accelerators": name.strip(), **({"cloud": cloud} if cloud else {})})
        counts = sorted({r["accelerator_count"] for r in same})
        if counts:
            spelled = ", ".join(f"{same[0]['accelerator']}:{n}" for n in counts)
            where = f" on {cloud}" if cloud else ""
            return (f"{same[0]['accelerator']} comes as {spelled}{where}, not {alternative}; "
                    f"`runner offers --accelerators {same[0]['accelerator']}` lists them")
    accelerators = ", ".join(wanted)
    where = "the controller's config.yaml" if os.environ.get("RUNNER_SERVER") else f"{runner_home() / 'config.yaml'}"
    if cloud and not client.get("/v1/offers", params={"cloud": cloud}):
        guide = f" (how: docs/{cloud}.md)" if cloud in ("aws", "gcp") else ""
        return f"cloud {cloud} is not configured: add it under clouds: in {where}{guide}"
    return (f"no configured cloud offers {accelerators or 'anything'}{f' on {cloud}' if cloud else ''}; "
            f"clouds are configured under clouds: in {where} (docs/aws.md, docs/gcp.md)")
