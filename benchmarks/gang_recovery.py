"""Gang recovery: from a notice to one node of a 2-node job to every rank restored, keeping the other node,
against the same job relaunched on two new nodes.

A real controller (``runner server``) with its own temporary RUNNER_HOME runs examples/multinode/train.py
(2 nodes x 2 ranks, DDP on gloo, CPU) on the local provider, resume drill off. Each trial waits until every
rank of the current attempt has restored and trained a little, then:

* **keep**: ``runner preempt JOB --node 1``: node 1 gets an AWS notice; every rank stops at one step, node 0
  is kept (its agent waits for the next attempt) and only node 1 is replaced;
* **relaunch**, the baseline in the same run: ``runner preempt JOB --node 1`` and ``--node 0`` at once:
  both nodes get a notice, both are replaced, as a runner that relaunches the whole gang would.

The clock runs from the controller's first ``chaos`` event of the trial (the notice is on the metadata
server) to the fourth ``restored`` event of the next attempt (every rank's ``Checkpointer.restore()``
reported through its node's agent). Phases come from the controller's database (read-only): attempt ended,
next attempt planned, gang formed (every node registered), every rank restored. Trials alternate between
the paths; everything started is stopped and the temporary folder removed at the end (``--keep`` keeps it).

    python benchmarks/gang_recovery.py [--count 3] [--time-scale 0.2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from recovery_bench import Bench, BenchError, wait_until  # noqa: E402
from report import machine, percentile  # noqa: E402

TRAIN = REPO / "examples" / "multinode" / "train.py"
JOB = """
name: gang-bench
run: >-
  torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=2
  --master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT
  train.py --steps 1000000 --step-time 0.02 --log-every 1000 --interval 1h
resources: {cloud: [local], num_nodes: 2}
checkpoint: {interval: 1h}
recovery: {max_preemptions: 1000, max_failures: 0, resume_drill: "off"}
"""
RANKS = 4
PHASES = ("attempt ended", "next attempt planned", "gang formed (every node registered)",
          "every rank restored", "total: notice to every rank restored")


@dataclass
class Trial:
    path: str
    phases: dict[str, float]


def restored_times(bench: Bench, job_id: str, attempt: int) -> list[float]:
    with bench.db() as db:
        rows = db.execute("SELECT time FROM events WHERE job_id = ? AND attempt = ? AND kind = 'restored' ORDER BY time",
                          (job_id, attempt)).fetchall()
    return [r["time"] for r in rows]


def current_attempt(bench: Bench, job_id: str) -> dict:
    with bench.db() as db:
        return dict(db.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt DESC LIMIT 1",
                               (job_id,)).fetchone())


def trial(bench: Bench, job_id: str, path: str) -> Trial:
    before = current_attempt(bench, job_id)
    wait_until(lambda: len(restored_times(bench, job_id, before["attempt"])) >= RANKS, 300,
               f"every rank of attempt {before['attempt']} restored")
    time.sleep(2.0)  # let it train a little: the notice lands mid-training, not mid-restore
    started = time.time()
    bench.cli("preempt", job_id, "--node", "1")
    if path == "relaunch":
        bench.cli("preempt", job_id, "--node", "0")
    nxt = wait_until(lambda: (lambda a: a if a["attempt"] > before["attempt"] else None)(current_attempt(bench, job_id)),
                     300, "the next attempt")
    restored = wait_until(lambda: (lambda t: t if len(t) >= RANKS else None)(
        restored_times(bench, job_id, nxt["attempt"])), 300, "every rank of the next attempt restored")
    with bench.db() as db:
        chaos = db.execute("SELECT MIN(time) AS t FROM events WHERE job_id = ? AND kind = 'chaos' AND time >= ?",
                           (job_id, started - 1)).fetchone()["t"]
        ended = db.execute("SELECT ended_at FROM attempts WHERE job_id = ? AND attempt = ?",
                           (job_id, before["attempt"])).fetchone()["ended_at"]
    nxt = wait_until(lambda: (lambda a: a if a["running_at"] else None)(current_attempt(bench, job_id)), 60,
                     "the gang formed")
    marks = [chaos, ended, nxt["started_at"], nxt["running_at"], restored[RANKS - 1]]
    phases = {name: round(b - a, 3) for name, a, b in zip(PHASES, marks, marks[1:])}
    phases[PHASES[-1]] = round(marks[-1] - chaos, 3)
    return Trial(path, phases)


def table(trials: list[Trial]) -> str:
    paths = ("keep", "relaunch")
    lines = ["| phase | keep node 0 (p50 / max) | relaunch both (p50 / max) | keep / relaunch (p50) |",
             "| --- | ---: | ---: | ---: |"]
    for name in PHASES:
        cells, p50 = [], {}
        for path in paths:
            values = [t.phases[name] for t in trials if t.path == path]
            p50[path] = percentile(values, 50)
            cells.append(f"{p50[path]:.2f} / {max(values):.2f}")
        ratio = f"{p50['keep'] / p50['relaunch']:.2f}x" if p50["relaunch"] > 0 else "–"
        label = f"**{name}**" if name.startswith("total") else name
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3, help="trials per path")
    parser.add_argument("--time-scale", type=float, default=0.2, help="simulated clock (AWS grace 120 s x this)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and its logs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gang-bench-"))
    bench = Bench(root, args.time_scale)
    began = time.monotonic()
    try:
        bench.start()
        folder = root / "job"
        folder.mkdir()
        shutil.copy(TRAIN, folder / "train.py")
        (folder / "job.yaml").write_text(JOB)
        job_id = bench.cli_json("submit", str(folder / "job.yaml"))["id"]
        trials = []
        for n in range(args.count * 2):
            path = ("keep", "relaunch")[n % 2]
            trials.append(trial(bench, job_id, path))
            print(f"trial {n + 1}: {path}: {trials[-1].phases[PHASES[-1]]:.2f} s", file=sys.stderr, flush=True)
        bench.cli("cancel", job_id, check=False)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        bench.shutdown()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{machine()}; time_scale {args.time_scale}; {args.count} trials per path; "
          f"{time.monotonic() - began:.0f} s wall time. Seconds:\n")
    print(table(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
