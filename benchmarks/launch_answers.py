"""What applying a start-up's launch answers costs: N jobs are launched on the in-memory provider (inline, so every
answer is back at once), then the reconciler's ``collect_launches`` applies them, timed.

Two ways in the same run, alternated: each answer in a transaction of its own (as before: a BEGIN, the write lock and
a commit each, the commit a flush of the database's log), and the answers that come one after another together,
``LAUNCH_ANSWERS_A_TRANSACTION`` a transaction (runner/scheduler/reconciler.py). Printed per store and way: the
transactions and the wall time of applying all N.

    python benchmarks/launch_answers.py --jobs 500 --pg-url postgresql://USER:PASS@localhost/DB
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog  # noqa: E402

from benchmarks.report import machine  # noqa: E402
from benchmarks.report_group import fresh_postgres  # noqa: E402
from runner.providers.memory import MemoryProvider  # noqa: E402
from runner.scheduler import reconciler  # noqa: E402
from runner.scheduler.reconciler import SchedulerContext  # noqa: E402
from runner.spec import validate_job  # noqa: E402
from runner.spec.stored import stored_job  # noqa: E402
from runner.state import Store, open_database  # noqa: E402


class CountingTransactions:
    def __init__(self, db):
        self.db, self.count = db, 0

    def transaction(self, **kwargs):
        self.count += 1
        return self.db.transaction(**kwargs)

    def __getattr__(self, name):
        return getattr(self.db, name)


def apply_all(url: str, jobs: int, together: int) -> tuple[int, float]:
    """The transactions and seconds ``collect_launches`` takes for ``jobs`` answers, ``together`` a transaction."""
    store = Store(open_database(url))
    provider = MemoryProvider(zone_capacity=jobs)
    ctx = SchedulerContext(store=store, providers={provider.name: provider}, controller_url="http://controller",
                           node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}")
    spec = stored_job(validate_job({"name": "bench", "run": "train", "recovery": {"resume_drill": "off"}}), None)
    with store.db.transaction() as tx:
        for i in range(jobs):
            store.insert_job(tx, f"bench-{i}", "bench", spec, "PENDING", time.time())
    reconciler.launch_pending_jobs(ctx)  # asked for and answered (inline)
    counting = CountingTransactions(store.db)
    store.db = counting
    reconciler.LAUNCH_ANSWERS_A_TRANSACTION = together
    started = time.perf_counter()
    reconciler.collect_launches(ctx)
    elapsed = time.perf_counter() - started
    store.db = counting.db
    assert len(store.nodes(("running",))) == jobs
    store.db.close()
    return counting.count, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2, help="each way this many times, alternated")
    parser.add_argument("--pg-url", help="a Postgres whose user may create databases (else SQLite only)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(machine())
    print("| store | way | transactions | seconds for all | ms an answer |")
    print("| --- | --- | ---: | ---: | ---: |")
    together = reconciler.LAUNCH_ANSWERS_A_TRANSACTION
    for kind in ["sqlite"] + (["postgres"] if args.pg_url else []):
        for _ in range(args.rounds):
            for way, size in (("each alone", 1), (f"{together} together", together)):
                with tempfile.TemporaryDirectory() as directory:
                    url = (f"sqlite:///{Path(directory) / 'runner.db'}" if kind == "sqlite"
                           else fresh_postgres(args.pg_url, "launch_answers_bench"))
                    count, seconds = apply_all(url, args.jobs, size)
                print(f"| {kind} | {way} | {count} | {seconds:.2f} | {seconds / args.jobs * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
