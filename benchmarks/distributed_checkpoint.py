"""Distributed checkpoint benchmark: a DDP job's save stall and commit, and the stop agreement's cost per step.

How long a collective save blocks every rank's training, how soon it is on disk, and what agreeing on the
stop step costs each training step.

    python benchmarks/distributed_checkpoint.py [--ranks 4] [--size-mb 256] [--repeat 3] [--dir PATH]

The script starts itself under ``torch.distributed.run --standalone`` (gloo, CPU, OMP_NUM_THREADS=1). Every
rank builds the same DDP model and Adam state: weights a third of ``--size-mb``, Adam moments the other two
thirds, after one optimizer step so the moments exist. The state is replicated, so a checkpoint holds one
copy of it whatever the number of ranks.

Save methods, in one run, on the same disk and the same state, each save into a fresh folder:

* ours: ``Checkpointer.save(step)``. *Stall* is the time ``save()`` blocks the training thread, *commit*
  the time until ``wait()`` returns: the checkpoint is committed on the local tier (every rank's files
  fsynced and checksummed, the manifest written);
* torch.distributed.checkpoint ``async_save`` into a ``FileSystemWriter``, with the thread executor (the
  default) and with the process executor: stall until ``async_save`` returns, commit until its future's
  ``result()``;
* DCP ``save`` (blocking): stall = commit;
* ``torch.save`` of the full state on rank 0 + fsync, the other ranks waiting at a barrier: stall =
  commit. It is the reference of the ratio columns.

DCP is given the state dict our library gives it (``get_model_state_dict`` / ``get_optimizer_state_dict``,
built inside the timed region as ours is), and its own gloo group. Every figure is the slowest rank's,
the best of ``--repeat`` rounds after one warm-up round (buffers allocated, the process executor's daemon
started); the methods take turns within a round, so a noisy disk affects them alike.

The stop agreement: under torch.distributed ``Checkpointer.step()`` starts an all-reduce of one int64
(bitwise OR) each step and reads it at the next (runner/checkpoint/agreement.py). Timed in microseconds per
step, slowest rank: ``ckpt.step(s)`` with no save due, against the same loop calling nothing and loops doing
a blocking ``dist.all_reduce`` per step (the naive way to agree): of one float (the goal: ``ckpt.step`` back
to back costs no more than this), of one int64 OR, and of six float64s (MAX), the vector the agreement
used before it was packed into one word. Once back
to back (``--agree-steps`` steps), and once with 10 ms of waiting per step standing in for the device's work
(a tenth as many steps), which the pipelined all-reduce overlaps and the blocking one cannot.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.checkpoint import build_state as single_process_state, state_bytes  # noqa: E402
from benchmarks.report import machine  # noqa: E402

from runner.checkpoint import Checkpointer  # noqa: E402

if __name__ == "__mp_main__":  # the daemon of DCP's process executor logs every request at INFO
    logging.disable(logging.INFO)

DEVICE_WAIT_S = 0.010  # a training step's device time, in the agreement loops that wait


# ------------------------------------------------------------------ the launcher


def launch(args) -> int:
    """Run this script under torchrun, one process per rank, all writing into one fresh temp folder."""
    folder = tempfile.mkdtemp(prefix="dist-ckpt-bench-", dir=args.dir)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
               __file__, "--size-mb", str(args.size_mb), "--repeat", str(args.repeat),
               "--agree-steps", str(args.agree_steps), "--folder", folder]
    try:
        return subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------ the state


def build_state(size_mb: float):
    """DDP over the single-process benchmark's state (Linear layers a third of ``size_mb``, Adam moments the rest)."""
    model, optimizer = single_process_state(size_mb / 1024, "cpu")
    return nn.parallel.DistributedDataParallel(model), optimizer


def dcp_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


# ------------------------------------------------------------------ the save methods


@dataclass
class Timing:
    stall: float
    commit: float
    path: Path  # what the save wrote


def now() -> float:
    return time.perf_counter()


class Ours:
    name = "ours: Checkpointer.save + wait"

    def __init__(self, model, optimizer, folder: Path) -> None:
        self.ckpt = Checkpointer(model=model, optimizer=optimizer, local_dir=folder / "ours", interval="1h", keep=1)
        self.steps = itertools.count(1)

    def save(self, n: int) -> Timing:
        step = next(self.steps)
        start = now()
        self.ckpt.save(step)
        staged = now()
        if not self.ckpt.wait():
            raise RuntimeError(f"our save of step {step} failed")
        return Timing(staged - start, now() - start, self.ckpt.local.folder(step))

    def discard(self, path: Path) -> None:
        pass  # keep=1: the Checkpointer removes the older checkpoint itself


class DcpSave:
    """``dcp.save`` (``async_options`` None), or ``dcp.async_save(..., **async_options)``."""

    def __init__(self, name: str, model, optimizer, folder: Path, group, async_options: dict | None = None) -> None:
        self.name, self.model, self.optimizer, self.folder, self.group = name, model, optimizer, folder, group
        self.async_options = async_options

    def save(self, n: int) -> Timing:
        import torch.distributed.checkpoint as dcp

        path = self.folder / f"{self.name.replace(' ', '_').replace(',', '')}-{n}"
        writer = dcp.FileSystemWriter(str(path))
        start = now()
        state = dcp_state(self.model, self.optimizer)
        if self.async_options is None:
            dcp.save(state, storage_writer=writer, process_group=self.group)
            seconds = now() - start
            return Timing(seconds, seconds, path)
        future = dcp.async_save(state, storage_writer=writer, process_group=self.group, **self.async_options)
        returned = now()
        future.result()
        return Timing(returned - start, now() - start, path)

    def discard(self, path: Path) -> None:
        shutil.rmtree(path)


class TorchSave:
    name = "torch.save + fsync (rank 0)"

    def __init__(self, model, optimizer, folder: Path) -> None:
        self.model, self.optimizer, self.folder = model, optimizer, folder

    def save(self, n: int) -> Timing:
        path = self.folder / f"torch-{n}.pt"
        start = now()
        if dist.get_rank() == 0:
            with open(path, "wb") as f:
                torch.save({"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
        dist.barrier()
        seconds = now() - start
        return Timing(seconds, seconds, path)

    def discard(self, path: Path) -> None:
        path.unlink()


def save_methods(model, optimizer, folder: Path, group) -> list:
    """The reference first, ours last; the process executor only where this torch has it."""
    from torch.distributed.checkpoint import state_dict_saver

    methods = [TorchSave(model, optimizer, folder),
               DcpSave("DCP save (blocking)", model, optimizer, folder, group)]
    kinds = getattr(state_dict_saver, "AsyncCheckpointerType", None)
    if kinds is None:  # older torch: threads only
        methods.append(DcpSave("DCP async_save", model, optimizer, folder, group, {}))
    else:
        for label, kind in (("thread", kinds.THREAD), ("process", kinds.PROCESS)):
            methods.append(DcpSave(f"DCP async_save, {label}", model, optimizer, folder, group,
                                   {"async_checkpointer_type": kind}))
    methods.append(Ours(model, optimizer, folder))
    return methods


# ------------------------------------------------------------------ measuring


def slowest(*seconds: float) -> list[float]:
    """The largest of each value over all ranks."""
    values = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.tolist()


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure_saves(methods: list, repeat: int) -> dict[str, tuple[float, float, int]]:
    """Per method: the best stall and the best commit (slowest rank) of ``repeat`` rounds after a warm-up round,
    and the bytes its save left on disk."""
    rounds: dict[str, list[tuple[float, float, int]]] = {method.name: [] for method in methods}
    for n in range(repeat + 1):
        for method in methods:
            dist.barrier()
            timing = method.save(n)
            stall, commit = slowest(timing.stall, timing.commit)
            nbytes = 0
            if dist.get_rank() == 0:
                nbytes = disk_bytes(timing.path)
                method.discard(timing.path)
            dist.barrier()
            if n > 0:  # round 0 is the warm-up
                rounds[method.name].append((stall, commit, nbytes))
    return {name: (min(r[0] for r in runs), min(r[1] for r in runs), runs[-1][2]) for name, runs in rounds.items()}


def per_step_us(call, steps: int, wait_s: float, counter) -> float:
    """Microseconds per step of ``steps`` calls of ``call(step)`` (after ``wait_s`` of sleep each), slowest rank."""
    dist.barrier()
    start = now()
    for _ in range(steps):
        if wait_s:
            time.sleep(wait_s)
        call(next(counter))
    (elapsed,) = slowest(now() - start)
    return elapsed / steps * 1e6


def measure_agreement(ckpt, group, steps: int, repeat: int) -> dict[str, list[float]]:
    """Per loop: microseconds per step back to back, and with ``DEVICE_WAIT_S`` of waiting per step."""
    one = torch.zeros(1)
    word = torch.zeros(1, dtype=torch.int64)  # the agreement's word
    six = torch.zeros(6, dtype=torch.float64)  # the agreement's former vector
    loops = {
        "nothing": lambda step: None,
        "ckpt.step(s), no save due": ckpt.step,
        "blocking all_reduce, 1 float": lambda step: dist.all_reduce(one, group=group),
        "blocking all_reduce, 1 int64 OR": lambda step: dist.all_reduce(word, op=dist.ReduceOp.BOR, group=group),
        "blocking all_reduce, 6 float64": lambda step: dist.all_reduce(six, op=dist.ReduceOp.MAX, group=group),
    }
    counter = itertools.count(10**6)  # every rank calls ckpt.step with the same, increasing steps
    return {name: [min(per_step_us(call, n, wait_s, counter) for _ in range(repeat))
                   for n, wait_s in ((steps, 0.0), (max(1, steps // 10), DEVICE_WAIT_S))]
            for name, call in loops.items()}


# ------------------------------------------------------------------ the report


def print_saves(rows: dict[str, tuple[float, float, int]]) -> None:
    reference = rows[TorchSave.name][1]
    print(f"{'method':32} {'stall s':>8} {'commit s':>9} {'stall/torch.save':>17} {'commit/torch.save':>18} "
          f"{'MiB on disk':>12}")
    for name, (stall, commit, nbytes) in rows.items():
        print(f"{name:32} {stall:8.3f} {commit:9.3f} {stall / reference:17.3f} {commit / reference:18.3f} "
              f"{nbytes / 1024**2:12.1f}")


def print_agreement(rows: dict[str, list[float]], steps: int, repeat: int) -> None:
    wait_ms = DEVICE_WAIT_S * 1e3
    print(f"stop agreement: microseconds per step, slowest rank, best of {repeat} x {steps} steps back to back "
          f"and {repeat} x {max(1, steps // 10)} steps with {wait_ms:g} ms of waiting")
    print(f"{'each step calls':32} {'back to back':>13} {'added':>8} {f'{wait_ms:g} ms wait':>13} {'added':>8}")
    base = rows["nothing"]
    for name, (tight, waiting) in rows.items():
        print(f"{name:32} {tight:13.1f} {tight - base[0]:8.1f} {waiting:13.1f} {waiting - base[1]:8.1f}")


# ------------------------------------------------------------------ one rank


def worker(args) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = Path(args.folder)
    model, optimizer = build_state(args.size_mb)
    group = dist.new_group(backend="gloo")  # DCP's collectives and the naive agreement, apart from the timing's
    methods = save_methods(model, optimizer, folder, group)
    if rank == 0:
        print(f"machine: {machine()}\nstate: {state_bytes(model, optimizer) / 1024**2:.0f} MiB replicated on each "
              f"of {world} ranks (gloo, CPU, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}); disk folder "
              f"{folder}\n", flush=True)
    saves = measure_saves(methods, args.repeat)
    ours = methods[-1]
    agreement = measure_agreement(ours.ckpt, group, args.agree_steps, args.repeat)
    if rank == 0:
        print(f"saves: slowest rank, best of {args.repeat} after a warm-up")
        print_saves(saves)
        print()
        print_agreement(agreement, args.agree_steps, args.repeat)
    ours.ckpt.close()
    dist.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--size-mb", type=float, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--agree-steps", type=int, default=1000, help="steps per timed agreement loop")
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temp folder)")
    parser.add_argument("--folder", help=argparse.SUPPRESS)  # set by the launcher for its ranks
    args = parser.parse_args()
    if "RANK" not in os.environ:
        return launch(args)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
