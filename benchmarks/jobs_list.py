"""`runner jobs` at 10,000 jobs: the real CLI against a real controller whose database holds N jobs.

The jobs are written straight through the store (no launch): most ended days ago (two attempts each, the
first preempted), some ended within the last day, a few still running. Then `runner server` starts on that
database and `runner jobs`, `runner jobs --json` and `runner jobs --all --json` (where the CLI knows it) run
as real processes; printed: each command's wall and CPU time and output size (`runner --help`: the CLI's own
start, the floor), and the API's answer time.

    python benchmarks/jobs_list.py --jobs 10000                   # SQLite
    python benchmarks/jobs_list.py --jobs 10000 --db postgresql://USER:PASS@HOST:PORT/DB   # an empty database
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import requests  # noqa: E402

from runner.spec import validate_job  # noqa: E402
from runner.spec.stored import stored_job  # noqa: E402
from runner.state import Store, open_database  # noqa: E402
from runner.state import job_changes  # noqa: E402
from runner.state.values import Offer  # noqa: E402

OFFER = Offer("local", "local", "local-a", "cpu", None, 0, 2, 4.0, 0.1, 0.3)
DAY = 86400.0


def fill(store: Store, jobs: int, recent: int, running: int) -> None:
    spec = stored_job(validate_job({"name": "bench", "run": "train", "recovery": {"resume_drill": "off"}}), None)
    now = time.time()
    with store.db.transaction() as tx:
        for i in range(jobs):
            job_id = f"bench-{i:06d}"
            active = i >= jobs - running
            ended = now - 3600 * (1 + i % 20) if i >= jobs - running - recent else now - 3 * DAY - i
            created = ended - 7200
            store.insert_job(tx, job_id, "bench", spec, "PENDING", created)
            first = store.insert_attempt(tx, job_id, f"n-{i}a", OFFER, True, 0, created)
            job_changes.end_attempt(tx, job_id, first, created + 3600, "preempted", exit_code=None, notice=None,
                                    checkpoint_step=500, lost_seconds=12.0, drill=None, message="preempted")
            second = store.insert_attempt(tx, job_id, f"n-{i}b", OFFER, True, 500, created + 3700)
            if active:
                job_changes.set_job_state(tx, job_id, "RUNNING", created + 3700, "running", ended=False)
                continue
            job_changes.end_attempt(tx, job_id, second, ended, "succeeded", exit_code=0, notice=None,
                                    checkpoint_step=1000, lost_seconds=0.0, drill=None, message="the job exited 0")
            job_changes.set_job_state(tx, job_id, "SUCCEEDED", ended, "the job exited 0", ended=True)


def run_cli(home: Path, *args: str) -> tuple[float, float, int, int]:
    """Wall and CPU seconds (the child's user + system: a loaded machine stretches the wall time), bytes out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["RUNNER_HOME"] = str(home)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "runner.cli.main", *args], env=env, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, len(done.stdout), done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--recent", type=int, default=200, help="jobs ended within the last day")
    parser.add_argument("--running", type=int, default=20)
    parser.add_argument("--db", help="a Postgres URL (an empty database); default: SQLite in a temporary home")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        url = args.db or f"sqlite:///{home / 'runner.db'}"
        start = time.perf_counter()
        store = Store(open_database(url))
        fill(store, args.jobs, args.recent, args.running)
        store.db.close()
        print(f"{args.jobs} jobs written in {time.perf_counter() - start:.1f}s ({url.split(':')[0]})")
        server = subprocess.Popen([sys.executable, "-m", "runner.cli.main", "server", "--data-dir", str(home),
                                   "--port", "0", "--db", url], env={**os.environ, "RUNNER_HOME": str(home)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not (home / "controller.json").exists():
                assert time.monotonic() < deadline and server.poll() is None, "the controller did not start"
                time.sleep(0.1)
            info = json.loads((home / "controller.json").read_text())
            headers = {"Authorization": f"Bearer {(home / 'admin-token').read_text().strip()}"}
            requests.get(info["url"] + "/v1/jobs", headers=headers, timeout=120)  # warm
            start = time.perf_counter()
            answer = requests.get(info["url"] + "/v1/jobs", headers=headers, timeout=120)
            print(f"GET /v1/jobs: {time.perf_counter() - start:.2f}s, {len(answer.content):,} bytes")
            print(f"{'command':<26} {'wall':>7} {'cpu':>7} {'bytes':>12}")
            for command in (("--help",), ("jobs",), ("jobs", "--json"), ("jobs", "--all", "--json")):
                wall, cpu, size, code = run_cli(home, *command)
                print(f"runner {' '.join(command):<19} {wall:6.2f}s {cpu:6.2f}s {size:>12,}  exit {code}")
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
