"""The offer catalog shipped as data (offers.csv, dated by meta.json) and the simulated local market."""

from .load import (
    CatalogError,
    canonical_accelerator,
    catalog_date,
    catalog_meta,
    known_accelerators,
    load_catalog,
)
from .local import local_offers, zone_factor
from .throughput import relative_throughput

__all__ = [
    "CatalogError",
    "canonical_accelerator",
    "catalog_date",
    "catalog_meta",
    "known_accelerators",
    "load_catalog",
    "local_offers",
    "relative_throughput",
    "zone_factor",
]
