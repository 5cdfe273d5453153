"""What one reconciler tick costs with N running nodes on the in-memory provider (describe_interval 0).

The scheduler's own loop, no HTTP: N single-node jobs are submitted and launched, then ``tick()`` runs
``--ticks`` times with nothing changing. Printed: wall time per tick (p50, max) and the process's CPU per
tick (worker threads included), with the cloud calls run inline and on the controller's threads.

    python benchmarks/reconciler_tick.py --nodes 2000 --ticks 20
    python benchmarks/reconciler_tick.py --describe-per-node   # one describe call per node, as a cloud's
    python benchmarks/reconciler_tick.py --queued 10000 --db postgresql://USER:PASS@HOST/DB

``--queued N``: N jobs wait instead, on a market that refuses every launch (each zone refused once, then backed
off): what a long queue adds to every tick, on SQLite and, with ``--db``, on a fresh Postgres database.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog  # noqa: E402

from runner.providers.memory import MemoryProvider, PerNodeMemoryProvider  # noqa: E402
from runner.scheduler.reconciler import Reconciler, SchedulerContext, threaded_calls  # noqa: E402
from runner.spec import validate_job  # noqa: E402
from runner.spec.stored import stored_job  # noqa: E402
from runner.state import Store, open_database  # noqa: E402


def build(directory: Path, nodes: int, per_node: bool = False, **calls) -> tuple[Reconciler, Store]:
    store = Store(open_database(f"sqlite:///{directory / 'runner.db'}"))
    provider = (PerNodeMemoryProvider if per_node else MemoryProvider)(zone_capacity=nodes)
    ctx = SchedulerContext(store=store, providers={provider.name: provider}, controller_url="http://controller",
                           node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}", **calls)
    spec = stored_job(validate_job({"name": "bench", "run": "train", "recovery": {"resume_drill": "off"}}), None)
    with store.db.transaction() as tx:
        for i in range(nodes):
            store.insert_job(tx, f"bench-{i}", "bench", spec, "PENDING", time.time())
    reconciler = Reconciler(ctx)
    deadline = time.monotonic() + 600
    while len(store.nodes(("running",))) < nodes:  # launches answered (inline: in the first tick)
        assert time.monotonic() < deadline, "the nodes never all launched"
        reconciler.tick()
        ctx.nudge.wait(0.05)
        ctx.nudge.clear()
    return reconciler, store


def measure(reconciler: Reconciler, ticks: int) -> tuple[list[float], list[float]]:
    reconciler.tick()  # warm
    walls, cpus = [], []
    for _ in range(ticks):
        wall, cpu = time.perf_counter(), time.process_time()
        reconciler.tick()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls, cpus


def build_queue(url: str, jobs: int) -> tuple[Reconciler, Store]:
    """``jobs`` waiting jobs on a market that refuses every launch, past their first refusals."""
    store = Store(open_database(url))
    provider = MemoryProvider()
    provider.refuse(times=10**9)
    ctx = SchedulerContext(store=store, providers={provider.name: provider}, controller_url="http://controller",
                           node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}")
    spec = stored_job(validate_job({"name": "bench", "run": "train", "recovery": {"resume_drill": "off"}}), None)
    with store.db.transaction() as tx:
        for i in range(jobs):
            store.insert_job(tx, f"bench-{i}", "bench", spec, "PENDING", time.time())
    reconciler = Reconciler(ctx)
    for _ in range(3):  # every zone refused once, then backed off
        reconciler.tick()
    return reconciler, store


def fresh_postgres(url: str) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS reconciler_tick_bench")
        conn.execute("CREATE DATABASE reconciler_tick_bench")
    return url.rsplit("/", 1)[0] + "/reconciler_tick_bench"


def main_queued(jobs: int, ticks: int, pg_url: str | None) -> None:
    for name in ["sqlite"] + (["postgres"] if pg_url else []):
        with tempfile.TemporaryDirectory() as directory:
            url = fresh_postgres(pg_url) if name == "postgres" else f"sqlite:///{Path(directory) / 'runner.db'}"
            reconciler, store = build_queue(url, jobs)
            walls, cpus = measure(reconciler, ticks)
            print(f"{name:9s} {jobs} jobs waiting: tick wall p50 {statistics.median(walls) * 1e3:7.1f} ms, "
                  f"max {max(walls) * 1e3:7.1f} ms; CPU p50 {statistics.median(cpus) * 1e3:7.1f} ms")
            store.db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--describe-per-node", action="store_true",
                        help="describe node by node (a cloud's per-node API) instead of in one batch call")
    parser.add_argument("--queued", type=int, metavar="N", help="N jobs waiting for capacity instead of running")
    parser.add_argument("--db", metavar="URL", help="with --queued: a Postgres whose user may create databases")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))  # no line per job
    if args.queued:
        main_queued(args.queued, args.ticks, args.db)
        return
    for name, calls in (("inline", {}), ("threaded", threaded_calls())):
        with tempfile.TemporaryDirectory() as directory:
            reconciler, store = build(Path(directory), args.nodes, args.describe_per_node, **calls)
            walls, cpus = measure(reconciler, args.ticks)
            print(f"{name:9s} {args.nodes} running nodes: tick wall p50 {statistics.median(walls) * 1e3:7.1f} ms, "
                  f"max {max(walls) * 1e3:7.1f} ms; CPU p50 {statistics.median(cpus) * 1e3:7.1f} ms")
            store.db.close()


if __name__ == "__main__":
    main()
