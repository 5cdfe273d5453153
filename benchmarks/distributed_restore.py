"""Distributed restore benchmark: how long ``restore()`` takes every rank of a DDP job, by the way tensors are read.

    python benchmarks/distributed_restore.py [--ranks 2] [--size-mb 1000] [--repeat 3] [--dir PATH]

The script starts itself under ``torch.distributed.run --standalone`` (gloo, CPU, OMP_NUM_THREADS=1). Every rank
builds the same DDP model holding ``--size-mb`` of state in eight equal buffers (replicated, as a DDP model's is:
every rank reads all of it at a restore; the gang benchmark's trainee is the same), saves it once with
``Checkpointer`` into a fresh folder under ``--dir``, removed at the end (a tmpfs such as /dev/shm shows the
reader's own cost, a disk adds the disk's), then restores it ``--repeat`` times by each reader, taking turns:

* DCP's reader: torch.distributed.checkpoint's ``FileSystemReader.read_data``, each tensor ``torch.load``-ed into
  memory of its own and copied into the model's;
* direct: runner/checkpoint/dcp_read.py, each tensor's bytes read straight into the model's tensor, four files at
  a time.

Every figure is the slowest rank's, from ``restore()``'s call to its return (the checks of the files' checksums
and the ranks' agreement included, the same for both), the median of the rounds. Each restore is checked to load
the saved state bit for bit. Ratios are against DCP's reader in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

READERS = ("DCP's reader", "direct")


def launch(args) -> int:
    """Run this script under torchrun, one process per rank, all saving into one fresh folder under ``--dir``,
    removed at the end (a checkpoint of ``--size-mb`` is left nowhere)."""
    folder = tempfile.mkdtemp(prefix="restore-bench-", dir=args.dir)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
               __file__, "--worker", "--size-mb", str(args.size_mb), "--repeat", str(args.repeat), "--dir", folder]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        return subprocess.run(command, env=env).returncode
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def build(size_mb: float):
    import torch

    torch.manual_seed(0)
    inner = torch.nn.Linear(8, 1)
    for i in range(8):
        inner.register_buffer(f"ballast{i}", torch.rand(max(1, int(size_mb * 1e6 / 4 / 8))))
    model = torch.nn.parallel.DistributedDataParallel(inner, broadcast_buffers=False)
    return inner, model, torch.optim.SGD(model.parameters(), lr=0.01)


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    from runner.checkpoint import Checkpointer, dcp_format

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    inner, model, optimizer = build(args.size_mb)
    saved = {name: buffer.clone() for name, buffer in inner.named_buffers()}
    ckpt = Checkpointer(model=model, optimizer=optimizer, local_dir=args.dir, every_steps=1)
    ckpt.restore()
    ckpt.step(1)
    ckpt.close()
    seconds: dict[str, list[float]] = {name: [] for name in READERS}
    for _ in range(args.repeat):
        for name in READERS:
            dcp_format.READ_DIRECT = name == "direct"
            for buffer in inner.buffers():
                buffer.zero_()
            ckpt = Checkpointer(model=model, optimizer=optimizer, local_dir=args.dir, every_steps=1)
            dist.barrier()
            started = time.perf_counter()
            step = ckpt.restore()
            took = time.perf_counter() - started
            ckpt.close()
            if step != 1 or any(not torch.equal(b, saved[n]) for n, b in inner.named_buffers()):
                raise SystemExit(f"rank {rank}: {name} did not restore the saved state")
            slowest = [0.0] * dist.get_world_size()
            dist.all_gather_object(slowest, took)
            seconds[name].append(max(slowest))
    if rank == 0:
        base = statistics.median(seconds[READERS[0]])
        print(f"\n{dist.get_world_size()} ranks, {args.size_mb:g} MB of replicated state each, {args.dir}; "
              f"median of {args.repeat}, slowest rank\n")
        print("| reader | restore s | / DCP's reader |")
        print("| --- | ---: | ---: |")
        for name in READERS:
            median = statistics.median(seconds[name])
            print(f"| {name} | {median:.2f} | {median / base:.2f} |")
    dist.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size-mb", type=float, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    sys.exit(main())
