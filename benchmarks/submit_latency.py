"""How long a submitted job waits for its first attempt with `runner server --workers N`, by which worker took the
submit: the leader (its reconciler is woken in-process) or another worker.

Each row starts the real controller on a fresh Postgres database with the in-memory provider (as
benchmarks/controller_scale.py does), then submits ``--jobs`` jobs one at a time, each on a new connection (so the
kernel picks the worker), asking that connection's worker first whether it leads (``GET /healthz``). The next job is
submitted once the previous one has its attempt, after a random pause (so submits fall at every phase of the
reconciler's tick). The wait is the attempt's start minus the job's creation, both as the database recorded them.

    python benchmarks/submit_latency.py --pg-bin /usr/lib/postgresql/15/bin --workers 1,2 --jobs 40
    python benchmarks/submit_latency.py --db postgresql://USER:PASS@HOST/DB
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.controller_scale import JOB, postgres_databases, start_controller  # noqa: E402
from benchmarks.report import machine, percentile  # noqa: E402


def wait_for_a_leader(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _ in range(8):  # new connections: the kernel spreads them over the workers
            if requests.get(url + "/healthz", timeout=10).json().get("leader"):
                return
        time.sleep(0.2)
    raise SystemExit("no worker leads")


def submit_all(url: str, token: str, db_url: str, jobs: int) -> list[tuple[bool, float]]:
    """(submitted through the leader, seconds from the job's creation to its first attempt's start) per job."""
    from runner.state import Store, open_database

    store = Store(open_database(db_url, migrate=False))
    headers = {"Authorization": f"Bearer {token}"}
    waits = []
    try:
        for i in range(jobs):
            time.sleep(random.uniform(0, 1.0))
            with requests.Session() as session:  # one new connection for both requests
                leader = session.get(url + "/healthz", timeout=10).json()["leader"]
                reply = session.post(url + "/v1/jobs", json={"spec": {**JOB, "name": f"wake-{i}"}}, headers=headers,
                                     timeout=30)
                reply.raise_for_status()
            job_id = reply.json()["id"]
            deadline = time.monotonic() + 60
            while not (attempts := store.attempts(job_id)):
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} had no attempt within 60 s")
                time.sleep(0.01)
            waits.append((leader, attempts[0].started_at - store.job(job_id).created_at))
    finally:
        store.db.close()
    return waits


def measure(workers: int, db_url: str, jobs: int) -> list[tuple[bool, float]]:
    with tempfile.TemporaryDirectory(prefix="runner-submit-") as folder:
        process, url, token = start_controller(Path(folder), db_url, workers)
        try:
            wait_for_a_leader(url)
            return submit_all(url, token, db_url, jobs)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="comma-separated controller process counts")
    parser.add_argument("--jobs", type=int, default=40, help="jobs submitted per row")
    parser.add_argument("--db", default=os.environ.get("RUNNER_BENCH_PG_URL"),
                        help="a Postgres URL whose user may create databases (or RUNNER_BENCH_PG_URL)")
    parser.add_argument("--pg-bin", metavar="DIR", help="a folder with Postgres's initdb and pg_ctl: a throwaway "
                                                        "cluster on this machine")
    args = parser.parse_args()
    rows = []
    with postgres_databases(args) as databases:
        if databases is None:
            raise SystemExit("--workers needs Postgres: pass --db URL or --pg-bin DIR")
        fresh, server = databases
        print(f"{machine()}; Postgres: {server}")
        for workers in (int(n) for n in args.workers.split(",")):
            with fresh() as db_url:
                waits = measure(workers, db_url, args.jobs)
            for through_leader in (True, False):
                seconds = sorted(wait for leader, wait in waits if leader == through_leader)
                if seconds:
                    rows.append((workers, "leader" if through_leader else "another worker", seconds))
    baseline = next((percentile(s, 50) for w, via, s in rows if w == 1), None)
    print("\n| workers | submitted to | jobs | p50 ms | p90 ms | max ms | p50 x 1 worker |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for workers, via, seconds in rows:
        p50 = percentile(seconds, 50)
        ratio = f"{p50 / baseline:.1f}" if baseline else "-"
        print(f"| {workers} | {via} | {len(seconds)} | {p50 * 1000:.0f} | {percentile(seconds, 90) * 1000:.0f} | "
              f"{seconds[-1] * 1000:.0f} | {ratio} |")


if __name__ == "__main__":
    main()
