"""Offers: what a provider can launch, at what price."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Offer:
    """One launchable node type in one zone, with its prices in USD per hour."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str | None  # e.g. "T4"; None for CPU only
    accelerator_count: int
    cpus: int
    memory_gb: float
    spot_price: float | None  # None when the type has no spot market there
    on_demand_price: float

    def price(self, spot: bool) -> float | None:
        """The hourly price that applies to a spot or an on-demand launch."""
        return self.spot_price if spot else self.on_demand_price

    def to_json(self) -> dict:
        return asdict(self)
