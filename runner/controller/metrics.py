"""The controller's Prometheus metrics: ``GET /metrics`` with the admin token.

Every figure is computed from the database at scrape time (a custom collector), so the metrics survive
a controller restart and never drift from the restart log. Agent-reported figures (checkpoint commit
seconds, notice timing) are stored as measurements when the report arrives (:func:`record_commits`,
:func:`record_notice`) and turned into histograms at scrape time.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass
from typing import Iterable, Iterator

import structlog
from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from ..scheduler.states import ALLOWED
from ..state import Database, Store, Tx
from ..state.checkpoints import CheckpointReport, Recorded
from ..state import measurements as m
from .auth import Principal, require_admin

log = structlog.get_logger(__name__)
router = APIRouter()

JOB_STATES = tuple(ALLOWED)  # every state is exported, 0 included
PREEMPTION_REASONS = ("preempted", "lost")
# Precise timing a notice report may carry (unix seconds); kept out of the restart log's notice.
TIMING_FIELDS = ("received_unix", "deadline_unix", "issued_unix")


@dataclass(frozen=True)
class HistogramSpec:
    name: str
    doc: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...]


RECOVERY = HistogramSpec(
    "runner_recovery_seconds", "Seconds from an attempt's end by preemption or loss to the next attempt "
    "running (its agent registered)", ("end_reason",), (1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600))
COMMIT = HistogramSpec(
    "runner_checkpoint_commit_seconds", "Seconds from the start of a checkpoint save to its commit on the "
    "durable tier, as the training library reports it", ("emergency",),
    (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
DETECTION = HistogramSpec(
    "runner_notice_detection_seconds", "Seconds from a notice's issue time, where the cloud's protocol "
    "states one, to the agent's watcher seeing it", ("source", "kind"),
    (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
WARNING = HistogramSpec(
    "runner_notice_warning_seconds", "Seconds left before a notice's deadline when the agent's watcher saw it",
    ("source", "kind"), (1, 5, 10, 15, 30, 60, 90, 120, 300, 900, 3600))
MEASURED = {"checkpoint_commit_seconds": COMMIT, "notice_detection_seconds": DETECTION,
            "notice_warning_seconds": WARNING}
# Observations kept one by one (the newest); older ones are folded into per-bucket totals, so the table stays
# bounded however long the controller runs, and the histograms still count every observation ever made.
MAX_MEASUREMENTS = 10_000
FOLD_SLACK_DIVISOR = 20  # the table may hold a twentieth more before it is folded back to the maximum


def histogram(spec: HistogramSpec, observations: Iterable[tuple[tuple[str, ...], float]],
              folded: dict[tuple[str, ...], dict[str, float]] | None = None) -> HistogramMetricFamily:
    """A histogram family from (label values, value) pairs plus totals already folded (``{le: n}``, with
    ``+Inf`` the count and ``sum`` the sum): cumulative buckets, count and sum per label set."""
    folded = folded or {}
    groups: dict[tuple[str, ...], list[float]] = {labels: [] for labels in folded}
    for labels, value in observations:
        groups.setdefault(labels, []).append(value)
    family = HistogramMetricFamily(spec.name, spec.doc, labels=spec.labels)
    for labels, values in sorted(groups.items()):
        before = folded.get(labels, {})
        buckets = [(floatToGoString(b), before.get(repr(float(b)), 0) + sum(v <= b for v in values))
                   for b in spec.buckets]
        family.add_metric(list(labels), buckets + [("+Inf", before.get("+Inf", 0) + len(values))],
                          before.get("sum", 0.0) + sum(values))
    return family


def recovery_intervals(timeline: Iterable[dict]) -> Iterator[tuple[str, float]]:
    """(end_reason, seconds) for each recovery: from the end of an attempt that was preempted or lost to
    ``running_at`` of the job's next attempt that ran. Attempts that never ran (lost while launching)
    extend the recovery they belong to. ``timeline`` is ordered by job, then attempt."""
    job, pending = None, None
    for row in timeline:
        if row["job_id"] != job:
            job, pending = row["job_id"], None
        if pending is not None and row["running_at"] is not None:
            yield pending[0], max(0.0, row["running_at"] - pending[1])
            pending = None
        if row["end_reason"] in PREEMPTION_REASONS and row["ended_at"] is not None and pending is None:
            pending = (row["end_reason"], row["ended_at"])


class StateCollector:
    """Job and attempt metrics read from the controller's database on every scrape."""

    def __init__(self, db: Database, clock=time.time):
        self.db = db
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        counts = m.job_state_counts(self.db)
        jobs = GaugeMetricFamily("runner_jobs", "Jobs in each state", labels=("state",))
        for state in JOB_STATES:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs

        ended = m.ended_attempt_counts(self.db)
        attempts = CounterMetricFamily("runner_attempts", "Attempts that have ended, by where they ran and why "
                                       "they ended (the restart log)", labels=("cloud", "zone", "end_reason"))
        preemptions = CounterMetricFamily("runner_preemptions", "Attempts that ended by preemption or by losing "
                                          "their node", labels=("cloud", "zone", "end_reason"))
        for row in ended:
            labels = [row["cloud"] or "", row["zone"] or "", row["end_reason"]]
            attempts.add_metric(labels, row["n"])
            if row["end_reason"] in PREEMPTION_REASONS:
                preemptions.add_metric(labels, row["n"])
        yield attempts
        yield preemptions

        running = GaugeMetricFamily("runner_attempts_running", "Attempts running now", labels=("cloud", "zone"))
        for row in m.running_attempt_counts(self.db):
            running.add_metric([row["cloud"] or "", row["zone"] or ""], row["n"])
        yield running

        cost = CounterMetricFamily("runner_job_cost_usd", "What every job's attempts have cost, in USD "
                                   "(per-second billing; running attempts up to now)", labels=("cloud", "zone"))
        for row in m.cost_by_zone(self.db, self.clock()):
            cost.add_metric([row["cloud"] or "", row["zone"] or ""], round(row["usd"] or 0.0, 6))
        yield cost

        yield histogram(RECOVERY, (((reason,), seconds)
                                   for reason, seconds in recovery_intervals(m.attempt_timeline(self.db))))
        observed: dict[str, list] = {name: [] for name in MEASURED}
        for row in m.measurements(self.db):
            spec = MEASURED.get(row["name"])
            if spec is not None:
                observed[row["name"]].append((tuple(row["labels"].get(k, "") for k in spec.labels), row["value"]))
        folded: dict[str, dict] = {name: {} for name in MEASURED}
        for row in m.rollup(self.db):
            spec = MEASURED.get(row["name"])
            if spec is not None:
                totals = folded[row["name"]].setdefault(tuple(row["labels"].get(k, "") for k in spec.labels), {})
                totals[row["le"]] = row["n"]
                if row["le"] == "+Inf":
                    totals["sum"] = row["total"]
        for name, spec in MEASURED.items():
            yield histogram(spec, observed[name], folded[name])


# --- agent reports -> measurements -----------------------------------------------------------------
# The measurements table's size as this process last saw it, per database (each report group's statement returns it).
_seen_counts: "weakref.WeakKeyDictionary[Database, int]" = weakref.WeakKeyDictionary()


def record_commits(store: Store, tx: Tx, reports: list[CheckpointReport], keep: int = MAX_MEASUREMENTS,
                   last: bool = False) -> Recorded:
    """Durable commits the agents reported (a report group's, or one): each checkpoint as the store keeps it and its
    commit seconds once per job, attempt and step (runner/state/checkpoints.py), then the measurements kept
    bounded, with the count that write returned (no statement of its own).

    ``last``: nothing follows in ``tx``. On Postgres its COMMIT then goes out with the checkpoints' statement, one
    round trip fewer, unless the table may be due a fold after them as far as this process has seen its size (its
    first group learns it): such a group folds in its transaction, as without ``last``. Where rows written
    elsewhere (another controller, a notice) made the fold due all the same, the next group folds."""
    seen = _seen_counts.get(store.db)
    adding = sum(report.measurement is not None for report in reports)
    then_commit = last and seen is not None and seen + adding <= keep + keep // FOLD_SLACK_DIVISOR
    recorded = store.record_checkpoints(tx, reports, then_commit=then_commit)
    if recorded.measurements is not None:
        _seen_counts[store.db] = (recorded.measurements if tx.committed
                                  else _bound(tx, keep, recorded.measurements))
    return recorded


def commit_measurement(job_id: str, attempt: int, checkpoint: dict, now: float | None = None) -> m.Measurement | None:
    """The measurement of a durable commit's seconds, as :func:`record_commits` stores it (None: none reported)."""
    seconds = _number(checkpoint.get("seconds"))
    if seconds is None:
        return None
    return m.Measurement(f"{job_id}/{attempt}/step-{checkpoint.get('step')}/commit", "checkpoint_commit_seconds",
                         seconds, {"emergency": "true" if checkpoint.get("emergency") else "false"}, now or time.time())


def record_notice(tx: Tx, job_id: str, attempt: int, notice: dict, now: float | None = None,
                  keep: int = MAX_MEASUREMENTS) -> None:
    """A notice report's timing, once per job, attempt and notice; a report without it records nothing."""
    received = _number(notice.get("received_unix"))
    if received is None:
        return
    _record_notice_timing(tx, job_id, attempt, notice, received, now)
    _bound(tx, keep)


def bound_measurements(tx: Tx, keep: int = MAX_MEASUREMENTS, count: int | None = None) -> None:
    """Fold what is over ``keep`` observations (after many were recorded at once); ``count``: how many the table
    holds, where the caller knows it (else read)."""
    _bound(tx, keep, count)


def _bound(tx: Tx, keep: int, count: int | None = None) -> int:
    """Keep the newest ``keep`` observations one by one; fold the rest into the histograms' totals, once they are a
    twentieth over ``keep``. Folding sorts the kept rows: at 2,000 nodes, done for every report group's few new
    rows it made each group's write transaction four times as long once the table was full. The table's size
    after."""
    count = m.measurement_count(tx) if count is None else count
    if count > keep + keep // FOLD_SLACK_DIVISOR:
        count -= m.fold_oldest(tx, keep, lambda name: MEASURED[name].buckets if name in MEASURED else None)
    return count


def _record_notice_timing(tx: Tx, job_id: str, attempt: int, notice: dict, received: float,
                          now: float | None) -> None:
    labels = {"source": str(notice.get("source", "")), "kind": str(notice.get("kind", ""))}
    key = f"{job_id}/{attempt}/{notice.get('id') or labels['source'] + ':' + labels['kind']}"
    now = now or time.time()
    issued, deadline = _number(notice.get("issued_unix")), _number(notice.get("deadline_unix"))
    if issued is not None:  # a notice cannot be seen before it is issued: below 0 is clock skew
        m.add_measurement(tx, key + "/detection", job_id, attempt, "notice_detection_seconds",
                          max(0.0, received - issued), labels, now)
    if deadline is not None:
        m.add_measurement(tx, key + "/warning", job_id, attempt, "notice_warning_seconds",
                          max(0.0, deadline - received), labels, now)


def without_timing(notice: dict) -> dict:
    """The notice as the restart log keeps it."""
    return {k: v for k, v in notice.items() if k not in TIMING_FIELDS}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        if value is not None:
            log.warning("ignoring a reported figure that is not a number", value=repr(value)[:40])
        return None
    return float(value)


# --- the endpoint --------------------------------------------------------------------------------------
def registry_for(db: Database) -> CollectorRegistry:
    """A registry with the database collector and the process's own standard collectors."""
    registry = CollectorRegistry()
    registry.register(StateCollector(db))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, who: Principal = Depends(require_admin)) -> Response:
    """Prometheus text (or OpenMetrics, when the scraper asks for it)."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body = encoder(registry_for(request.app.state.controller.store.db))
    return Response(body, headers={"Content-Type": content_type})
