"""What a report group's write transaction costs: groups of 1, 3 and 10 durable checkpoint reports, each written as
the report lane writes a group (runner/controller/event_api.py ``record_reports``), on SQLite and on Postgres.

Three versions in the same run, their groups alternated: "one by one", the report lane as it was (each report in
turn: its attempt's fence read, two UPDATEs, its commit seconds' INSERT; then the measurements counted), kept here
only to be measured against; "batched, COMMIT apart", the controller's code with its COMMIT in a round trip of its
own, as it was before the COMMIT went out with the checkpoints; and "batched", the controller's code now
(runner/state/checkpoints.py: on Postgres one statement for the whole group, sent with its savepoint and the
transaction's COMMIT in one round trip). Printed per store, version and group size: the round trips a group makes,
COMMIT included (a savepoint taken and released is two, a statement sent with its savepoint one, or with its
savepoint and the COMMIT; on SQLite these are calls, not round trips; BEGIN with the write lock goes out with the
first statement, the callers' nodes' read), the transaction's p50 / p99 wall time, and each version's ratios to
the version above it. ``--busy`` adds a thread that keeps the interpreter busy, as the controller's event loop
does under load: a thread that waits for the database then waits for the interpreter too, once per round trip.

Each row starts from 1,000 jobs with a running attempt and a node each and a measurements table filled to its
10,000 rows (folded back as the controller does once 500 over: both versions meet the same folds).

    python benchmarks/report_group.py --pg-url postgresql://USER:PASS@localhost/DB      # SQLite and Postgres
    python benchmarks/report_group.py --groups 300 --busy 0,1
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog  # noqa: E402

from benchmarks.report import machine, percentile  # noqa: E402
from runner.controller import metrics, reports  # noqa: E402
from runner.controller.auth import live_node  # noqa: E402
from runner.controller.event_api import ReportRequest, _event, record_reports  # noqa: E402
from runner.controller.front_door import json_object  # noqa: E402
from runner.controller.group_commit import all_at_once  # noqa: E402
from runner.spec import validate_job  # noqa: E402
from runner.spec.stored import stored_job  # noqa: E402
from runner.state import Store, open_database  # noqa: E402
from runner.state import measurements as m  # noqa: E402
from runner.state.values import Offer  # noqa: E402

JOBS = 1000
SIZES = (1, 3, 10)
OFFER = Offer(cloud="memory", region="mem", zone="mem-a", instance_type="sim", accelerator=None, accelerator_count=0,
              cpus=4, memory_gb=16.0, spot_price=0.01, on_demand_price=0.05)


# --- the report lane as it was, kept here only to be measured against ------------------------------------------
def one_by_one(state, tx, requests: list[ReportRequest]) -> list:
    """The previous ``record_reports`` for checkpoint reports: each report's statements in turn, in one savepoint."""
    nodes = state.store.nodes_by_token_hashes(tx, list(dict.fromkeys(r.token_hash for r in requests)))
    outcomes = all_at_once(tx, [functools.partial(_old_checkpoint, nodes.get(r.token_hash), r.body) for r in requests])
    metrics.bound_measurements(tx)
    return outcomes


def _old_checkpoint(node, body: bytes, tx):
    node = live_node(node)
    kind, data = _event(json_object(body))
    reports.step(data.get("step"), "data.step")
    checkpoint = {**data, "attempt": node.attempt, "time": data.get("time", time.time())}
    latest = tx.one("SELECT MAX(attempt) AS a FROM attempts WHERE job_id = ?", (node.job_id,))
    if latest["a"] is not None and node.attempt < latest["a"]:
        return {"accepted": False}, None
    tx.execute("UPDATE jobs SET step = ?, checkpoint = ? WHERE id = ? AND step <= ?",
               (checkpoint["step"], json.dumps(checkpoint), node.job_id, checkpoint["step"]))
    tx.execute("""UPDATE attempts SET checkpoint_step = CASE WHEN COALESCE(checkpoint_step, 0) > ? THEN checkpoint_step
                      ELSE ? END WHERE job_id = ? AND attempt = ?""",
               (checkpoint["step"], checkpoint["step"], node.job_id, node.attempt))
    measured = metrics.commit_measurement(node.job_id, node.attempt, checkpoint)
    m.add_measurement(tx, measured.key, node.job_id, node.attempt, measured.name, measured.value, measured.labels,
                      measured.time)
    return {"accepted": True}, None


class _CommitApart:
    """A transaction whose last statement goes without the COMMIT (the COMMIT alone, as the report lane sent it
    before its COMMIT went out with the group's checkpoints)."""

    def __init__(self, tx):
        self.tx = tx

    def __getattr__(self, name):
        return getattr(self.tx, name)

    def all_in_savepoint_then_commit(self, sql: str, params: tuple = ()) -> list[dict]:
        return self.tx.all_in_savepoint(sql, params)


def commit_apart(state, tx, requests: list[ReportRequest]) -> list:
    """``record_reports`` with its COMMIT in a round trip of its own."""
    return record_reports(state, _CommitApart(tx), requests)


# each version's x columns compare it with the version before it
VERSIONS = {"one by one": one_by_one, "batched, COMMIT apart": commit_apart, "batched": record_reports}


# --- the measurement -------------------------------------------------------------------------------------------
class CountingTx:
    """A transaction that counts its round trips (a savepoint taken and released is two; ``all_in_savepoint`` one)."""

    def __init__(self, tx):
        self.tx, self.statements = tx, 0

    def __getattr__(self, name):
        if name in ("execute", "execute_many", "one", "all", "all_in_savepoint", "all_in_savepoint_then_commit"):
            self.statements += 1
        return getattr(self.tx, name)

    @contextmanager
    def savepoint(self):
        self.statements += 2
        with self.tx.savepoint():
            yield self


def prepare(store: Store) -> None:
    spec = stored_job(validate_job({"name": "bench", "run": "train", "recovery": {"resume_drill": "off"}}), None)
    now = time.time()
    with store.db.transaction() as tx:
        for i in range(JOBS):
            store.insert_job(tx, f"job-{i}", "bench", spec, "RUNNING", now)
            store.insert_attempt(tx, f"job-{i}", f"node-{i}", OFFER, True, 0, now)
            store.insert_node(tx, f"node-{i}", f"job-{i}", 1, "memory", f"hash-{i}", OFFER, True, now)
        for i in range(metrics.MAX_MEASUREMENTS):
            m.add_measurement(tx, f"old-{i}", f"job-{i % JOBS}", 1, "checkpoint_commit_seconds", 0.5,
                              {"emergency": "false"}, now - 100_000 + i)


def run(store: Store, groups: int) -> dict[tuple[str, int], tuple[int, list[float]]]:
    """Per (version, size): round trips a group and each group's wall seconds."""
    state = SimpleNamespace(store=store, admin_token="admin", scheduler=None)
    results: dict[tuple[str, int], tuple[int, list[float]]] = {}
    node, step = 0, 0
    for size in SIZES:
        for n in range(groups + 5):  # the first five warm the statement caches
            for version, write_group in VERSIONS.items():
                step += 1
                requests = []
                for _ in range(size):
                    body = {"kind": "checkpoint", "data": {"step": step, "durable": True, "emergency": False,
                                                           "seconds": 0.25, "manifest": f"file:///x/{step}"}}
                    requests.append(ReportRequest(f"hash-{node % JOBS}", json.dumps(body).encode()))
                    node += 1
                started = time.perf_counter()
                with store.db.transaction() as tx:
                    counting = CountingTx(tx)
                    outcomes = write_group(state, counting, requests)
                elapsed = time.perf_counter() - started
                if not tx.committed:  # the COMMIT went alone, at the transaction's end
                    counting.statements += 1
                assert all(ok and answer[0]["accepted"] for ok, answer in outcomes), outcomes
                if n >= 5:
                    statements, times = results.setdefault((version, size), (counting.statements, []))
                    times.append(elapsed)
    return results


@contextmanager
def busy(threads: int):
    """``threads`` threads that keep the interpreter busy (pure Python), as an event loop under load does."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    workers = [threading.Thread(target=spin, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join()


def fresh_postgres(url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", help="a Postgres whose user may create databases (else SQLite only)")
    parser.add_argument("--groups", type=int, default=200, help="groups of each size and version")
    parser.add_argument("--busy", default="0,1", help="busy threads beside the writer, a row set each")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(machine())
    stores = ["sqlite"] + (["postgres"] if args.pg_url else [])
    print("| store | busy threads | group | version | round trips a group (COMMIT included) | p50 ms | p99 ms "
          "| x p50 | x p99 |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for kind in stores:
        for threads in (int(b) for b in args.busy.split(",")):
            with tempfile.TemporaryDirectory() as directory:
                url = (f"sqlite:///{Path(directory) / 'runner.db'}" if kind == "sqlite"
                       else fresh_postgres(args.pg_url, "report_group_bench"))
                store = Store(open_database(url))
                prepare(store)
                with busy(threads):
                    results = run(store, args.groups)
                store.db.close()
            for size in SIZES:
                base = None
                for version in VERSIONS:
                    statements, times = results[(version, size)]
                    p50, p99 = percentile(times, 50) * 1e3, percentile(times, 99) * 1e3
                    ratio = "" if base is None else \
                        f"{p50 / (percentile(base, 50) * 1e3):.2f} | {p99 / (percentile(base, 99) * 1e3):.2f}"
                    base = times
                    print(f"| {kind} | {threads} | {size} | {version} | {statements} | {p50:.2f} | {p99:.2f} | "
                          f"{ratio or ' | '} |", flush=True)


if __name__ == "__main__":
    main()
