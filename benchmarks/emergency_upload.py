"""Emergency checkpoint: time from the save to durable, uploading from the staged buffer against local first.

    python benchmarks/emergency_upload.py [--size-mb 256] [--mb-per-s 200] [--repeat 3] [--dir PATH]

One process's state (a model's weights and Adam's two moments, ``--size-mb`` in all) is saved through the
library's Persister to a local tier on ``--dir``'s disk and a durable tier held to ``--mb-per-s`` per direction
(``local-durable://``, the local market's bucket, whose throttle this uses). Two paths, alternated, in the same
run:

* **local first**: the local tier is written and fsynced, then the files are uploaded (every periodic
  checkpoint, and an emergency one before the upload from the buffer);
* **from the buffer**: an emergency checkpoint's upload starts as soon as the state is staged, beside the
  local write (runner/checkpoint/persist.py).

Figures: from the start of the save (before staging) to the commit on each tier, the median of ``--repeat``
trials of each path after one warm-up save. The upload alone is size / bandwidth; with a fast local disk the
paths differ by the local write, with a slow one by more.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import machine  # noqa: E402

from runner import local_durable  # noqa: E402
from runner.checkpoint.durable import DurableTier  # noqa: E402
from runner.checkpoint.local import LocalTier  # noqa: E402
from runner.checkpoint.persist import Persister, SaveJob  # noqa: E402
from runner.checkpoint.staging import Stager  # noqa: E402


def build_state(size_mb: float) -> dict:
    """A third weights, two thirds Adam moments, in 16 MiB tensors."""
    tensor_mb = 16
    count = max(3, int(size_mb / tensor_mb))
    tensors = {f"t{i}": torch.randn(tensor_mb * 1024 * 1024 // 4) for i in range(count)}
    return {"step": 0, "objects": {"model": tensors}, "extra": {}, "rng": None}


def trial(persister: Persister, stager: Stager, state: dict, step: int, from_buffer: bool) -> tuple[float, float]:
    """Seconds from the save's start to the local commit and to the durable one."""
    persister.buffer_free.wait()
    started = time.monotonic()
    job = SaveJob(step, stager.stage(state), emergency=from_buffer, attempt=1, job_id="bench", seq=step,
                  started=started)
    persister.submit(job)
    durable_at = local_at = None
    while durable_at is None or local_at is None:
        if local_at is None and job.local_done.wait(0.005):
            local_at = time.monotonic()
        if durable_at is None and job.durable_done.wait(0.005):
            durable_at = time.monotonic()
    if job.durable_manifest is None:
        raise RuntimeError(f"step {step} did not reach the durable tier: {job.durable_error}")
    return local_at - started, durable_at - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=256)
    parser.add_argument("--mb-per-s", type=float, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the local tier and the bucket go (default: a temp dir)")
    args = parser.parse_args()

    os.environ[local_durable.RATE_VARIABLE] = repr(args.mb_per_s)
    state = build_state(args.size_mb)
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        local = LocalTier(Path(root) / "local")
        durable = DurableTier(f"local-durable://{root}/bucket")
        persister = Persister(local, durable, 2, lambda job: None, lambda job: None)
        stager = Stager()
        trial(persister, stager, state, 1, from_buffer=False)  # warm-up: the buffer allocated, pages touched
        results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        step = 2
        for index in range(args.repeat):
            for from_buffer in ((False, True) if index % 2 == 0 else (True, False)):
                results[from_buffer].append(trial(persister, stager, state, step, from_buffer))
                step += 1
        persister.stop()

    size_mb = sum(t.numel() * 4 for t in state["objects"]["model"].values()) / 1e6
    print(f"machine: {machine()}")
    print(f"state {size_mb:.0f} MB, durable tier {args.mb_per_s:g} MB/s (upload alone "
          f"{size_mb / args.mb_per_s:.2f} s), median of {args.repeat} trials per path\n")
    print("| path | to local s | to durable s | durable / local first |")
    print("| --- | ---: | ---: | ---: |")
    base = statistics.median(d for _, d in results[False])
    for from_buffer, name in ((False, "local first (before)"), (True, "from the staged buffer (emergency)")):
        local_s = statistics.median(loc for loc, _ in results[from_buffer])
        durable_s = statistics.median(d for _, d in results[from_buffer])
        print(f"| {name} | {local_s:.2f} | {durable_s:.2f} | {durable_s / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
