"""Live AWS spot prices: the catalog's AWS offers with their spot price refreshed per availability zone.

``describe_spot_price_history`` with ``StartTime=now`` gives the current price of each (instance type,
zone). A price that is missing or absurd (zero or less, above 1.5 x on-demand, or below 1 % of
on-demand, as emulators report) is not trusted: the catalog's price stays, and one warning lists them.
The parsing and the checks are pure functions; only :func:`refresh_spot_prices` touches the client.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Iterable

import structlog
from botocore.exceptions import BotoCoreError, ClientError

from ..offers import Offer

log = structlog.get_logger(__name__)

PRODUCT = "Linux/UNIX"
MAX_OVER_ON_DEMAND = 1.5  # a spot price above on-demand x this is absurd
MIN_OF_ON_DEMAND = 0.01  # so is one below on-demand x this
WARN_EXAMPLES = 10


def refresh_spot_prices(ec2_client, offers: Iterable[Offer], *, now: datetime | None = None,
                        page_size: int | None = None) -> list[Offer]:
    """``offers`` with the spot price of each AWS offer in the client's region refreshed; others unchanged.

    Reads every page of the price history. When the API call fails (credentials, network, throttling)
    the offers come back unchanged and a warning says why.
    """
    offers = list(offers)
    region = ec2_client.meta.region_name
    types = sorted({o.instance_type for o in offers if o.cloud == "aws" and o.region == region})
    if not types:
        return offers
    try:
        history = list(_price_history(ec2_client, types, now or datetime.now(timezone.utc), page_size))
    except (BotoCoreError, ClientError) as exc:
        log.warning("spot prices not refreshed; using the catalog's", region=region, error=str(exc),
                    fix="check the AWS credentials and that ec2:DescribeSpotPriceHistory is allowed")
        return offers
    refreshed, fallbacks = apply_spot_prices(offers, newest_prices(history), region)
    if fallbacks:
        absurd_first = sorted(fallbacks, key=lambda note: note.endswith("no price reported"))
        log.warning("spot prices missing or absurd; using the catalog's", region=region, count=len(fallbacks),
                    examples=absurd_first[:WARN_EXAMPLES])
    return refreshed


def _price_history(ec2_client, types: list[str], now: datetime, page_size: int | None) -> Iterable[dict]:
    paging = {"PageSize": page_size} if page_size else {}
    pages = ec2_client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=types, ProductDescriptions=[PRODUCT], StartTime=now, PaginationConfig=paging)
    for page in pages:
        yield from page.get("SpotPriceHistory", [])


def newest_prices(history: Iterable[dict]) -> dict[tuple[str, str], float]:
    """The newest price per (instance type, zone) in price-history entries; unreadable prices are skipped."""
    newest: dict[tuple[str, str], tuple[datetime | str, float]] = {}
    for entry in history:
        try:
            key = (entry["InstanceType"], entry["AvailabilityZone"])
            price = float(entry["SpotPrice"])
        except (KeyError, TypeError, ValueError):
            continue
        stamp = entry.get("Timestamp") or ""
        if key not in newest or _later(stamp, newest[key][0]):
            newest[key] = (stamp, price)
    return {key: price for key, (_, price) in newest.items()}


def _later(a, b) -> bool:
    try:
        return a > b
    except TypeError:  # a missing stamp never wins over a present one
        return bool(a) and not b


def price_problem(price: float | None, on_demand: float) -> str | None:
    """Why a reported spot price is not to be trusted, or None when it is plausible."""
    if price is None:
        return "no price reported"
    if price <= 0:
        return f"price {price:g} is not positive"
    if price > on_demand * MAX_OVER_ON_DEMAND:
        return f"price {price:g} is above {MAX_OVER_ON_DEMAND:g} x on-demand {on_demand:g}"
    if price < on_demand * MIN_OF_ON_DEMAND:
        return f"price {price:g} is below {MIN_OF_ON_DEMAND:.0%} of on-demand {on_demand:g}"
    return None


def apply_spot_prices(offers: Iterable[Offer], prices: dict[tuple[str, str], float],
                      region: str) -> tuple[list[Offer], list[str]]:
    """``offers`` with trusted prices applied to the AWS offers of ``region``, and a note per fallback."""
    refreshed, fallbacks = [], []
    for offer in offers:
        if offer.cloud != "aws" or offer.region != region:
            refreshed.append(offer)
            continue
        price = prices.get((offer.instance_type, offer.zone))
        problem = price_problem(price, offer.on_demand_price)
        if problem is None:
            refreshed.append(dataclasses.replace(offer, spot_price=price))
        else:
            refreshed.append(offer)
            fallbacks.append(f"{offer.instance_type} in {offer.zone}: {problem}")
    return refreshed, fallbacks
