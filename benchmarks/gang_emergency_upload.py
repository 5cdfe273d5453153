"""A gang's emergency checkpoint: time from the save to durable, files sent as written against local first.

    python benchmarks/gang_emergency_upload.py [--ranks 2] [--size-mb 1000] [--mb-per-s 200] [--repeat 3]
                                               [--busy 0] [--dir PATH]

Each rank is a process of its own standing for a node (gloo, CPU): its own local tier under ``--dir`` and its
own durable bandwidth (``local-durable://``, the local market's bucket, ``--mb-per-s`` per node and direction).
The state is ``--size-mb`` of replicated tensors of 125 MB (as the cloud recovery benchmark's trainee), so each
rank writes its share, about ``size / ranks``, as several files. The library's Persister saves it as an
emergency checkpoint two ways, alternated in one run:

* **local first**: every rank's files are written and checksummed, the local folder committed, then uploaded
  (every periodic checkpoint, and a gang's emergency before files were sent as written);
* **as written**: each file goes up as the local write closes it (runner/checkpoint/early_upload.py).

``--busy N`` starts N processes that fill tensors with random numbers for the whole run, standing in for what
shares a gang's stop on this machine: the next attempt's processes building their model.

Figures: the slowest rank's seconds from the save's start (the state staged) to the durable commit, the
median of ``--repeat`` trials of each path after one warm-up save each. Each rank stages the whole state here
(the library stages only a rank's share, docs/checkpointing.md): the two write paths compared get the same
staging, and the figures in docs/ were taken so.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import machine  # noqa: E402

TENSOR_MB = 125


def _busy() -> None:
    import torch

    torch.set_num_threads(1)
    while True:
        torch.rand(32 * 1024 * 1024)


def _rank(rank: int, ranks: int, args, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    from runner import local_durable
    from runner.checkpoint import dcp_format, persist
    from runner.checkpoint.durable import DurableTier
    from runner.checkpoint.group import GlooComm
    from runner.checkpoint.local import LocalTier

    root = Path(args.dir)
    os.environ.update(local_durable.throttle_environment(args.mb_per_s, root / f"bandwidth-{rank}"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    writer = GlooComm(dist.new_group(backend="gloo"), rank, ranks)
    uploader = GlooComm(dist.new_group(backend="gloo"), rank, ranks)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    for i in range(max(1, round(args.size_mb / TENSOR_MB))):
        model.register_buffer(f"ballast{i}", torch.rand(int(TENSOR_MB * 1e6 / 4)))
    durable = DurableTier(f"local-durable://{root / 'bucket'}")
    local = LocalTier(root / f"local-{rank}")
    early = persist.Persister._uploads_early
    persister = persist.Persister(local, durable, 2, lambda job: None, lambda job: None, writer=writer,
                                  uploader=uploader, fmt=persist.DcpFormat(writer))
    stager = dcp_format.Stager()
    step = 0
    for trial in range(args.repeat + 1):
        for path in ("local first", "as written"):
            step += 1
            persist.Persister._uploads_early = early if path == "as written" else (lambda self, job: False)
            persister.buffer_free.wait()
            dist.barrier()
            started = time.monotonic()
            staged = stager.stage(dcp_format.capture({"model": model}, {}, rank))
            job = persist.SaveJob(step, staged, True, None, None, seq=step, started=started)
            persister.submit(job)
            job.durable_done.wait()
            seconds = time.monotonic() - started
            if job.durable_manifest is None:
                raise RuntimeError(f"step {step} did not reach the durable tier: {job.durable_error}")
            slowest = torch.tensor([seconds])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0 and trial > 0:
                results.append((path, float(slowest.item())))
    persister.stop()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size-mb", type=float, default=1000)
    parser.add_argument("--mb-per-s", type=float, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="processes filling tensors beside the ranks")
    parser.add_argument("--dir", default=None, help="where the local tiers and the bucket go (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        args.dir = folder
        context = multiprocessing.get_context("spawn")
        results = context.Manager().list()
        busy = [context.Process(target=_busy, daemon=True) for _ in range(args.busy)]
        for process in busy:
            process.start()
        port = 29000 + os.getpid() % 1000
        ranks = [context.Process(target=_rank, args=(r, args.ranks, args, port, results)) for r in range(args.ranks)]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join()
        for process in busy:
            process.kill()
        if any(process.exitcode for process in ranks):
            print("a rank failed", file=sys.stderr)
            return 1
        by_path: dict[str, list[float]] = {}
        for path, seconds in results:
            by_path.setdefault(path, []).append(seconds)
    print(machine())
    print(f"{args.ranks} ranks, {args.size_mb:.0f} MB replicated, durable {args.mb_per_s:.0f} MB/s per node, "
          f"{args.busy} busy processes beside them; slowest rank, median of {args.repeat}")
    base = statistics.median(by_path["local first"])
    print("| path | save to durable s | ratio |")
    print("| --- | ---: | ---: |")
    for path in ("local first", "as written"):
        median = statistics.median(by_path[path])
        print(f"| {path} | {median:.2f} | {median / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
