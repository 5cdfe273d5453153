"""Training pause at an AWS notice: trained through (the replacement prepared during the notice) against the
older path (checkpoint and stop at once, then launch), measured in the same run.

A real controller with its own temporary RUNNER_HOME (benchmarks/recovery_bench.py's Bench) at time scale 1
(AWS's notice leaves 120 s) runs a small PyTorch job whose setup sleeps ``--setup`` seconds (a node's setup:
packages, data) and which prints every step with its time. Each trial waits for step 30, sends
``runner preempt JOB --notice aws`` and waits until the next attempt has trained a few steps, then cancels
the job. The pause is the time from the last step the old attempt printed to the first step of the next
one; steps redone are the old attempt's last step minus the step the next resumed from.

- **trained through**: ``recovery.prepare_on: [notice]`` (the default);
- **stop at once** (baseline): ``recovery.prepare_on: []``: the replacement is launched at the handover.

    python benchmarks/train_through.py [--count 1] [--setup 5]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recovery_bench import Bench, BenchError  # noqa: E402

TRAINEE = """
import sys, time
import torch
from runner.checkpoint import Checkpointer

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10)
step = ckpt.restore()
print(f"resumed from step {step}" if step else "starting fresh", flush=True)
while True:
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    step += 1
    print(f"step {step} at {time.time():.3f}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        break
    time.sleep(0.05)
ckpt.close()
"""
STEP = re.compile(r"^step (\d+) at ([0-9.]+)$", re.M)
PATHS = {"trained through": "[notice]", "stop at once": "[]"}


def trial(bench: Bench, root: Path, name: str, prepare_on: str, setup: float) -> dict:
    folder = root / name
    folder.mkdir()
    (folder / "train.py").write_text(TRAINEE)
    (folder / "job.yaml").write_text(
        f"name: {name}\nsetup: sleep {setup}\nrun: python train.py\nresources: {{cloud: [local]}}\n"
        f"recovery: {{resume_drill: 'off', prepare_on: {prepare_on}}}\n")
    job_id = bench.cli_json("submit", str(folder / "job.yaml"))["id"]
    _wait(lambda: re.search(r"^step 30 at", bench.cli("logs", job_id).stdout, re.M), 600, "step 30")
    bench.cli("preempt", job_id, "--notice", "aws")
    _wait(lambda: len(STEP.findall(bench.cli("logs", job_id, "--attempt", "2", check=False).stdout)) >= 3,
          600, "the next attempt's steps")
    bench.cli("cancel", job_id)
    old = [(int(s), float(t)) for s, t in STEP.findall(bench.cli("logs", job_id, "--attempt", "1").stdout)]
    new = [(int(s), float(t)) for s, t in STEP.findall(bench.cli("logs", job_id, "--attempt", "2").stdout)]
    resumed = bench.cli_json("restarts", job_id)[1]["resumed_from_step"]
    return {"pause": new[0][1] - old[-1][1], "redone": old[-1][0] - resumed}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise BenchError(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1, help="trials per path (interleaved)")
    parser.add_argument("--setup", type=float, default=5.0, help="seconds the job's setup takes on a node")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="train-through-"))
    bench = Bench(root, time_scale=1.0)
    results: dict[str, list[dict]] = {path: [] for path in PATHS}
    try:
        bench.start()
        for i in range(args.count):
            for path, prepare_on in PATHS.items():
                name = f"{'through' if prepare_on == '[notice]' else 'baseline'}-{i}"
                results[path].append(trial(bench, root, name, prepare_on, args.setup))
                print(f"{path}: {results[path][-1]}", flush=True)
    finally:
        bench.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(r["pause"] for r in results["stop at once"])
    print(f"\n| path | training pause (s, median of {args.count}) | steps redone | pause / baseline |")
    print("| --- | --- | --- | --- |")
    for path, rows in results.items():
        pause = statistics.median(r["pause"] for r in rows)
        redone = statistics.median(r["redone"] for r in rows)
        print(f"| {path} | {pause:.1f} | {redone:g} | {pause / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
