"""What a step is expected to cost on each offer: the job's steps per second there, measured or estimated.

Pure functions. A job's expected steps/s on an offer is, in this order:

1. **measured**: what the job itself reached on that instance type (its newest attempt there that measured);
2. **estimated**: its newest measurement on another type, scaled by the two types' accelerators in the
   catalog's relative-throughput table (a node with N GPUs counts N times its GPU's figure);
3. **unknown** (no measurement yet, or an accelerator the table lacks, or a CPU-only type measured elsewhere):
   then offers are compared per hour, as without this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..providers.offers import Offer

MEASURED = "measured"


@dataclass(frozen=True)
class Measurement:
    """A job's speed on one instance type, as one of its attempts measured it."""

    cloud: str
    instance_type: str
    accelerator: str | None
    accelerator_count: int
    steps_per_second: float


@dataclass(frozen=True)
class Speed:
    """An expected speed and where it comes from: ``measured``, or ``estimated from TYPE``."""

    steps_per_second: float
    how: str


def expected_speed(offer: Offer, measurements: list[Measurement], table: Mapping[str, float]) -> Speed | None:
    """The job's expected steps/s on ``offer`` (``measurements`` newest first; ``table``: upper-case accelerator
    name -> relative throughput), or None when nothing supports a figure."""
    for m in measurements:
        if (m.cloud, m.instance_type) == (offer.cloud, offer.instance_type):
            return Speed(m.steps_per_second, MEASURED)
    here = node_throughput(offer.accelerator, offer.accelerator_count, table)
    if here is None:
        return None
    for m in measurements:
        there = node_throughput(m.accelerator, m.accelerator_count, table)
        if there:
            return Speed(m.steps_per_second * here / there, f"estimated from {m.instance_type}")
    return None


def node_throughput(accelerator: str | None, count: int, table: Mapping[str, float]) -> float | None:
    """A node's relative throughput: its GPUs' figure times their count; None for CPU or a GPU not in the table."""
    if not accelerator or count < 1:
        return None
    figure = table.get(accelerator.upper())
    return figure * count if figure else None


def cost_per_1000_steps(price_per_hour: float, steps_per_second: float) -> float:
    """USD per 1,000 steps at this price and speed."""
    return price_per_hour / 3600.0 / steps_per_second * 1000.0


def describe(what: str, price_per_hour: float, speed: Speed | None) -> str:
    """One offer's figures for a message: "L4 spot in us-east-1b: $0.21/h at 3.1 steps/s measured = $0.019/1k steps"."""
    if speed is None:
        return f"{what}: ${price_per_hour:.4g}/h"
    return (f"{what}: ${price_per_hour:.4g}/h at {speed.steps_per_second:.3g} steps/s {speed.how} = "
            f"${cost_per_1000_steps(price_per_hour, speed.steps_per_second):.3g}/1k steps")
