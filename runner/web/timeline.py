"""The restart log laid out on a time axis: one bar per attempt (a lane per node of a multi-node attempt).

Pure geometry, no HTML: ``layout`` turns attempts, notices and commits into coordinates that the
``timeline.svg`` template draws. Times are unix seconds; x and y are SVG user units.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..protocol.events import EndReason

WIDTH = 1000
GUTTER = 250         # left column: the lane labels
RIGHT = 16           # room after the last bar for its end mark
AXIS = 28            # the time axis's labels, above the lanes
LANE = 26            # one lane's height
ATTEMPT_GAP = 10     # between attempts
MIN_BAR = 3          # a bar never thinner than this, however short the attempt
TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
              172800, 604800)
MAX_TICKS = 8
TICK_CLEARANCE = 24  # a tick label is centred on its time: none so close to the gutter that it overlaps

# Colour classes (static/style.css) by end reason; a gang node's own ends add "kept" and "released".
# An attempt's end reasons, then a gang node's own ends.
LEGEND = tuple(reason for reason in EndReason if reason != EndReason.STOPPED_BY_PEER)


@dataclass
class Marker:
    kind: str    # "notice" or "checkpoint"
    x: float
    title: str


@dataclass
class Segment:
    kind: str    # "boot", "setup" or "restore": a phase of the attempt's start on this lane's node; "narrow":
    #              a stretch an elastic gang trained with fewer nodes
    x: float
    width: float
    title: str


@dataclass
class Gap:
    """From the last training step before an attempt to its first: drawn above its (first) lane."""
    x: float
    width: float
    title: str


@dataclass
class Lane:
    attempt: int
    label: str          # "#2 local-b · sim-t4", or "#2 node 1 · local-b · sim-t4" for a gang's lane
    reason: str         # colour class
    y: float
    x: float
    width: float
    title: str          # the bar's tooltip
    lost_x: float | None = None     # the lost work: from lost_x to the end of the bar
    lost_width: float = 0.0
    markers: list[Marker] = field(default_factory=list)
    phases: list[Segment] = field(default_factory=list)
    gap: Gap | None = None


@dataclass
class Tick:
    x: float
    label: str


@dataclass
class Timeline:
    width: int
    height: float
    lanes: list[Lane]
    ticks: list[Tick]
    plot_left: float
    start_label: str    # "2026-11-23 18:02:11" (UTC)


def layout(attempts: list[dict], notices: dict[int, list[dict]], commits: list[dict],
           now: float | None = None) -> Timeline | None:
    """Lay out ``attempts`` (restart-log rows with ``started`` and ``ended`` as unix seconds, ``ended`` None
    while running; for the ledger, optionally ``first_step_at``, ``last_step_at`` and ``restored_at``, unix
    seconds, besides the rows' ``gap_seconds`` and start phases); ``notices``: per attempt, ``{"time", "title",
    "node_rank"}``; ``commits``: ``{"attempt", "step", "time"}``. None when there is no attempt to draw."""
    if not attempts:
        return None
    now = now if now is not None else time.time()
    start = min(a["started"] for a in attempts)
    end = max(max(a["ended"] or now for a in attempts), start + 1.0)
    scale = (WIDTH - GUTTER - RIGHT) / (end - start)

    def x_of(t: float) -> float:
        return GUTTER + (min(max(t, start), end) - start) * scale

    lanes: list[Lane] = []
    y = AXIS
    for row in attempts:
        ended = row["ended"] or now
        checkpoint_marks = [Marker("checkpoint", round(x_of(c["time"]), 1), f"checkpoint of step {c['step']} committed")
                            for c in commits if c["attempt"] == row["attempt"]]
        narrow = _narrow_stretches(row, ended)
        for lane in _lanes_of(row):
            # an elastic gang's node is on its lane from its launch into the attempt until it left it
            x, right = x_of(max(row["started"], lane["joined"] or 0.0)), x_of(min(ended, lane["left"] or ended))
            bar = Lane(attempt=row["attempt"], label=lane["label"], reason=lane["reason"], y=y, x=round(x, 1),
                       width=round(max(MIN_BAR, right - x), 1), title=_title(row, lane))
            lost = row.get("lost_seconds") or 0.0
            if lost > 0 and lane["ended_it"]:
                lost_x = max(x, x_of(ended - lost))
                bar.lost_x, bar.lost_width = round(lost_x, 1), round(max(MIN_BAR, right - lost_x), 1)
            bar.markers = [Marker("notice", round(x_of(n["time"]), 1), n["title"])
                           for n in notices.get(row["attempt"], [])
                           if n.get("node_rank") in (None, lane["rank"])]
            if lane["rank"] in (None, 0):  # a gang's checkpoint is one for every node: marked on node 0's lane
                bar.markers += checkpoint_marks
                bar.gap = _gap(row, x_of)
            bar.phases = _phases({**row, "started": lane["joined"] or row["started"]}, lane["phases"], x_of)
            bar.phases += [Segment("narrow", round(x_of(a), 1), round(max(1.0, x_of(b) - x_of(a)), 1),
                                   f"the gang trained with {n} of {row['num_nodes']} nodes")
                           for a, b, n in narrow if _in_world_from(lane) <= a and b <= (lane["left"] or ended)]
            lanes.append(bar)
            y += LANE
        y += ATTEMPT_GAP
    return Timeline(width=WIDTH, height=y, lanes=lanes, ticks=_ticks(start, end, x_of), plot_left=GUTTER,
                    start_label=_utc(start, "%Y-%m-%d %H:%M:%S"))


def _lanes_of(row: dict) -> list[dict]:
    """One lane for a single-node attempt; one per node rank of a multi-node one."""
    where = f"{row['zone']} · {row['instance_type']}"
    nodes = row.get("nodes") or []
    if not nodes:
        return [{"rank": None, "label": f"#{row['attempt']} {where}", "reason": row["end_reason"], "ended_it": True,
                 "joined": None, "left": None,
                 "phases": {phase: row.get(f"{phase}_seconds") for phase in PHASES}}]
    lanes = []
    for node in nodes:
        reason = node["end_reason"] if node["end_reason"] in LEGEND else row["end_reason"]
        lanes.append({"rank": node["rank"], "reason": reason,
                      "joined": _unix(node.get("joined_at")), "left": _unix(node.get("left_at")),
                      "label": f"#{row['attempt']} node {node['rank']} · {node['zone']} · {node['instance_type']}",
                      "ended_it": node["end_reason"] not in (EndReason.KEPT, EndReason.RELEASED),
                      "phases": {phase: node.get(f"{phase}_seconds") for phase in PHASES}})
    return lanes


PHASES = ("boot", "setup", "restore")


def _narrow_stretches(row: dict, ended: float) -> list[tuple[float, float, int]]:
    """An elastic attempt's stretches with fewer nodes than the job's: (from, to, nodes). A node counts from
    when its replacement could join (its launch plus its boot and setup) until it left."""
    nodes = row.get("nodes") or []
    if not any(n.get("left_at") for n in nodes):
        return []
    spans = []
    for node in nodes:
        joined = _unix(node.get("joined_at"))
        if joined is not None:
            joined += (node.get("boot_seconds") or 0.0) + (node.get("setup_seconds") or 0.0)
        spans.append((joined if joined is not None else row["started"], _unix(node.get("left_at")) or ended))
    times = sorted({t for span in spans for t in span if row["started"] <= t <= ended} | {row["started"], ended})
    stretches = []
    for a, b in zip(times, times[1:]):
        count = sum(1 for start, end in spans if start <= a and b <= end)
        if b > a and count < row["num_nodes"]:
            if stretches and stretches[-1][1] == a and stretches[-1][2] == count:
                stretches[-1] = (stretches[-1][0], b, count)
            else:
                stretches.append((a, b, count))
    return stretches


def _in_world_from(lane: dict) -> float:
    """When a lane's node could train in its elastic world: at once, or a replacement once booted and set up."""
    if lane["joined"] is None:
        return 0.0
    return lane["joined"] + (lane["phases"].get("boot") or 0.0) + (lane["phases"].get("setup") or 0.0)


def _unix(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None


def _phases(row: dict, seconds: dict, x_of) -> list[Segment]:
    """The start of an attempt on one node: its boot from the launch, then its setup; the restore ends when the
    training reported it (``restored_at``), else follows the setup. A phase that took no time is not drawn."""
    at = row["started"]
    segments = []
    for phase in PHASES:
        length = seconds.get(phase)
        if not length:
            continue
        if phase == "restore" and row.get("restored_at"):
            at = max(at, row["restored_at"] - length)
        x, right = x_of(at), x_of(at + length)
        segments.append(Segment(phase, round(x, 1), round(max(1.0, right - x), 1), f"{phase} {length:.1f} s"))
        at += length
    return segments


def _gap(row: dict, x_of) -> Gap | None:
    """The training's pause before this attempt: from the last step before it to its first step."""
    gap, first = row.get("gap_seconds"), row.get("first_step_at")
    if gap is None or first is None:
        return None
    x, right = x_of(first - gap), x_of(first)
    return Gap(round(x, 1), round(max(1.0, right - x), 1),
               f"gap {gap:.1f} s: from the last training step before attempt {row['attempt']} to its first")


def _title(row: dict, lane: dict) -> str:
    parts = [f"attempt {row['attempt']}" + (f", node {lane['rank']}" if lane["rank"] is not None else ""),
             f"{row['cloud']} {row['zone']} {row['instance_type']} {'spot' if row['spot'] else 'on-demand'}",
             f"{_utc(row['started'], '%H:%M:%S')} to {_utc(row['ended'], '%H:%M:%S') if row['ended'] else 'now'}",
             lane["reason"]]
    if row.get("checkpoint_step"):
        parts.append(f"saved step {row['checkpoint_step']}")
    if row.get("resumed_from_step"):
        parts.append(f"resumed from step {row['resumed_from_step']}")
    if row.get("lost_seconds"):
        parts.append(f"{row['lost_seconds']:.1f} s of work lost")
    if row.get("message"):
        parts.append(str(row["message"]))
    return "; ".join(parts)


def _ticks(start: float, end: float, x_of) -> list[Tick]:
    span = end - start
    step = next((s for s in TICK_STEPS if span / s <= MAX_TICKS), TICK_STEPS[-1])
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if span < 86400 else "%m-%d %H:%M")
    first = (int(start) // step + 1) * step
    ticks = [Tick(round(x_of(t), 1), _utc(t, fmt)) for t in range(first, int(end) + 1, step)]
    return [tick for tick in ticks if tick.x >= GUTTER + TICK_CLEARANCE]  # clear of the axis's start label


def _utc(ts: float, fmt: str) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime(fmt)
