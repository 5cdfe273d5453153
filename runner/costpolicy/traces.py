"""Spot availability traces: one JSON file per zone, ``{"metadata": {"gap_seconds": N}, "data": [...]}``.

``data[i]`` counts the spot instances up at tick ``i``; a job of N nodes (a gang) can hold spot in that zone
when it is at least N (1 for a single node). A folder's files must share one tick length; they are cut to the
shortest one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from ..errors import InputError


class TraceError(InputError, ValueError):
    """A trace folder or file that cannot be replayed; the message names it and the fix."""


@dataclass(frozen=True)
class Traces:
    """Availability of every zone of a folder, tick by tick (True: spot can be held)."""

    gap_seconds: float
    zones: tuple[str, ...]
    available: tuple[tuple[bool, ...], ...]  # [zone][tick]

    @property
    def ticks(self) -> int:
        return len(self.available[0])

    @property
    def hours(self) -> float:
        return self.ticks * self.gap_seconds / 3600.0


def load_traces(folder: str | Path, nodes: int = 1) -> Traces:
    """Read every ``*.json`` file of ``folder`` as one zone, available at a tick when at least ``nodes``
    instances are up; raise TraceError with a plain message."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(f"--traces {folder}: not a folder; give a folder of trace files (one JSON file per zone)")
    files = sorted(p for p in folder.iterdir() if p.suffix == ".json" and p.is_file())
    if not files:
        raise TraceError(f"--traces {folder}: no .json trace files in it; each zone is one file "
                         '{"metadata": {"gap_seconds": N}, "data": [...]}')
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise TraceError(f"--nodes {nodes!r}: must be a whole number of at least 1")
    gaps: dict[str, float] = {}
    series: list[list[bool]] = []
    most = 0
    for path in files:
        gap, data = _read(path)
        gaps[path.name] = gap
        most = max(most, max(data))
        series.append([count >= nodes for count in data])
    if nodes > 1 and most < nodes:  # a gang: a folder that never holds it is the wrong traces
        raise TraceError(f"--nodes {nodes}: no zone of {folder} ever had {nodes} instances up (at most {most:g}); "
                         "use a multi-node trace (such as availability-16node-aws-2023-08-27) or fewer nodes")
    if len(set(gaps.values())) > 1:
        listed = ", ".join(f"{name} {gap:g}s" for name, gap in sorted(gaps.items()))
        raise TraceError(f"--traces {folder}: the files have different tick lengths ({listed}); "
                         "put traces of one gap_seconds in one folder")
    shortest = min(len(s) for s in series)
    return Traces(gap_seconds=next(iter(gaps.values())), zones=tuple(p.stem for p in files),
                  available=tuple(tuple(s[:shortest]) for s in series))


def _read(path: Path) -> tuple[float, list[int]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read it ({exc}); give a JSON trace file") from None
    if not text.strip():
        raise TraceError(f"{path}: the file is empty; a trace is "
                         '{"metadata": {"gap_seconds": N}, "data": [counts per tick]}')
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict) or "data" not in doc:
        raise TraceError(f"{path}: expected an object with metadata.gap_seconds and data "
                         '({"metadata": {"gap_seconds": N}, "data": [...]})')
    gap = doc["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap <= 0:
        raise TraceError(f"{path}: metadata.gap_seconds must be a positive number of seconds (got {gap!r})")
    data = doc["data"]
    if not isinstance(data, list) or not data:
        raise TraceError(f"{path}: data must be a non-empty list of instance counts, one per tick")
    for index, count in enumerate(data):
        if isinstance(count, bool) or not isinstance(count, (int, float)) or not math.isfinite(count) or count < 0:
            raise TraceError(f"{path}: data[{index}] is {count!r}; each tick is a count of spot instances up (>= 0)")
    return float(gap), data
