"""Reading the offer catalog: a CSV of instance types and prices, dated by the meta.json beside it."""

from __future__ import annotations

import csv
import functools
import json
from pathlib import Path

from ..offers import Offer
from ...errors import InputError

CATALOG_DIR = Path(__file__).resolve().parent
DEFAULT_CATALOG = CATALOG_DIR / "offers.csv"
COLUMNS = ("cloud", "region", "zone", "instance_type", "accelerator", "accelerator_count", "cpus",
           "memory_gb", "on_demand_price", "spot_price")


class CatalogError(InputError, ValueError):
    """The catalog file is missing, malformed, or holds an impossible row."""


def load_catalog(path: str | Path | None = None) -> list[Offer]:
    """Every offer in the catalog CSV at ``path`` (default: the one shipped with the runner).

    Lines starting with ``#`` are comments. An empty ``accelerator`` means CPU only; an empty
    ``spot_price`` means the type has no spot market in that zone.
    """
    return list(_load(Path(path) if path is not None else DEFAULT_CATALOG))


@functools.lru_cache(maxsize=8)
def _load(path: Path) -> tuple[Offer, ...]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CatalogError(f"cannot read the offer catalog {path}: {exc.strerror or exc}; "
                           "point to an existing CSV or reinstall the runner") from exc
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise CatalogError(f"{path}: the header lacks the column(s) {', '.join(missing)}; "
                           f"the columns are {','.join(COLUMNS)}")
    return tuple(_offer(row, path, number) for number, row in enumerate(reader, start=1))


def _offer(row: dict, path: Path, number: int) -> Offer:
    where = f"{path.name} row {number}"

    def number_in(column: str, kind=float, optional: bool = False):
        raw = (row.get(column) or "").strip()
        if optional and not raw:
            return None
        try:
            value = kind(raw)
        except ValueError:
            raise CatalogError(f"{where}: {column} {raw!r} is not a {kind.__name__}; write a plain number") from None
        if value < 0:
            raise CatalogError(f"{where}: {column} {raw!r} is negative")
        return value

    accelerator = (row["accelerator"] or "").strip() or None
    count = number_in("accelerator_count", int)
    if (accelerator is None) != (count == 0):
        raise CatalogError(f"{where}: accelerator {accelerator!r} with accelerator_count {count}; "
                           "give a GPU name with a count of at least 1, or neither")
    for column in ("cloud", "region", "zone", "instance_type"):
        if not (row[column] or "").strip():
            raise CatalogError(f"{where}: {column} is empty")
    return Offer(
        cloud=row["cloud"].strip(), region=row["region"].strip(), zone=row["zone"].strip(),
        instance_type=row["instance_type"].strip(), accelerator=accelerator, accelerator_count=count,
        cpus=number_in("cpus", int), memory_gb=number_in("memory_gb"),
        spot_price=number_in("spot_price", optional=True), on_demand_price=number_in("on_demand_price"),
    )


def catalog_meta(path: str | Path | None = None) -> dict:
    """The sidecar ``meta.json`` of a catalog CSV (date, sources, notes), or {} when there is none."""
    csv_path = Path(path) if path is not None else DEFAULT_CATALOG
    meta = csv_path.with_name("meta.json")
    try:
        return json.loads(meta.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CatalogError(f"{meta}: not readable JSON ({exc}); fix or delete it") from exc


def catalog_date(path: str | Path | None = None) -> str:
    """The date the catalog's prices were taken (``YYYY-MM-DD``), or ``unknown``.

    Read from ``meta.json`` beside the CSV, else from a leading ``# as of YYYY-MM-DD`` comment.
    """
    date = catalog_meta(path).get("as_of")
    if date:
        return str(date)
    csv_path = Path(path) if path is not None else DEFAULT_CATALOG
    try:
        with open(csv_path) as handle:
            for line in handle:
                if not line.startswith("#"):
                    break
                if "as of" in line:
                    return line.split("as of", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def known_accelerators(offers: list[Offer] | None = None) -> list[str]:
    """The accelerator names in ``offers`` (default: the shipped catalog), sorted."""
    offers = load_catalog() if offers is None else offers
    return sorted({o.accelerator for o in offers if o.accelerator}, key=str.upper)


def canonical_accelerator(name: str, offers: list[Offer] | None = None) -> str | None:
    """The catalog's spelling of an accelerator name, matched case-insensitively ("a100" -> "A100")."""
    wanted = name.strip().upper()
    for known in known_accelerators(offers):
        if known.upper() == wanted:
            return known
    return None
