"""The accelerators' relative training throughput (throughput.json beside the catalog, with its sources)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .load import CATALOG_DIR, CatalogError

THROUGHPUT_FILE = CATALOG_DIR / "throughput.json"


@functools.lru_cache(maxsize=4)
def relative_throughput(path: str | Path | None = None) -> dict[str, float]:
    """Each accelerator's throughput relative to the table's reference GPU, keyed by its upper-case name."""
    path = Path(path) if path is not None else THROUGHPUT_FILE
    try:
        table = json.loads(path.read_text())["relative_throughput"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CatalogError(f"{path}: no readable relative_throughput table ({exc}); reinstall the runner") from exc
    out = {}
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise CatalogError(f"{path}: relative_throughput {name} is {value!r}; each must be a positive number")
        out[str(name).upper()] = float(value)
    return out
