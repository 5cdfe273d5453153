"""The simulated local spot market: the catalog's GPU types and prices, offered in every local zone.

Every offer of the local cloud really runs as a process on this machine's CPU; only the names and
prices are those of the catalog, so that scheduling, cost and the restart log read as on a cloud.

- One simulated type per (accelerator, count) of the catalog: ``sim-t4``, ``sim-a100-8``. Its vCPUs,
  memory and prices are those of the catalog row with that accelerator and count and the lowest
  on-demand price (ties: the lower spot price, then cloud and type).
- One CPU type per vCPU count of the catalog's CPU-only rows: ``sim-cpu-4``, from the cheapest such row.
- Spot prices differ per zone by a deterministic factor between 0.92 and 1.08 derived from the zone's
  name (a hash, so a zone keeps its price when zones are added or reordered); on-demand prices are
  the same everywhere, as on the clouds.
"""

from __future__ import annotations

import hashlib

from ..offers import Offer
from .load import load_catalog

LOCAL_CLOUD = "local"
LOCAL_REGION = "local"
ZONE_SPREAD = 0.08  # spot prices of a zone are within ±8 % of the catalog's


def zone_factor(zone: str) -> float:
    """The multiplier a zone applies to spot prices, in [1 - ZONE_SPREAD, 1 + ZONE_SPREAD]."""
    fraction = int.from_bytes(hashlib.sha256(zone.encode()).digest()[:4], "big") / 0xFFFFFFFF
    return round(1 - ZONE_SPREAD + 2 * ZONE_SPREAD * fraction, 4)


def sim_instance_type(accelerator: str | None, count: int, cpus: int) -> str:
    """The simulated type's name: ``sim-t4``, ``sim-a100-8``, ``sim-cpu-4``."""
    if accelerator is None:
        return f"sim-cpu-{cpus}"
    name = f"sim-{accelerator.lower()}"
    return name if count == 1 else f"{name}-{count}"


def local_templates(catalog: list[Offer] | None = None) -> list[Offer]:
    """One zone-less template per simulated type, drawn from the catalog (sorted by type name)."""
    catalog = load_catalog() if catalog is None else catalog
    best: dict[str, Offer] = {}
    for offer in catalog:
        name = sim_instance_type(offer.accelerator, offer.accelerator_count, offer.cpus)
        if name not in best or _rank(offer) < _rank(best[name]):
            best[name] = offer
    return [Offer(LOCAL_CLOUD, LOCAL_REGION, "", name, o.accelerator, o.accelerator_count, o.cpus, o.memory_gb,
                  o.spot_price, o.on_demand_price) for name, o in sorted(best.items())]


def _rank(offer: Offer) -> tuple:
    spot = offer.spot_price if offer.spot_price is not None else float("inf")
    return (offer.on_demand_price, spot, offer.cloud, offer.instance_type)


def local_offers(zones: list[str], catalog: list[Offer] | None = None) -> list[Offer]:
    """Every simulated type in every zone, with that zone's spot price spread applied."""
    templates = local_templates(catalog)
    offers = []
    for zone in zones:
        factor = zone_factor(zone)
        for template in templates:
            spot = None if template.spot_price is None else round(
                min(template.spot_price * factor, template.on_demand_price), 4)
            offers.append(Offer(LOCAL_CLOUD, LOCAL_REGION, zone, template.instance_type, template.accelerator,
                                template.accelerator_count, template.cpus, template.memory_gb, spot,
                                template.on_demand_price))
    return offers
