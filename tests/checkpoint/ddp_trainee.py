"""A training program for the distributed checkpoint tests, run under torchrun (gloo, CPU).

DDP by default, FSDP2 with ``--fsdp``. Rank 0 writes the final weights to ``--out``; every rank writes
``--report``.<rank>.json with the step it restored, the step it ended at and whether it was told to stop.
Faults on purpose: ``--signal-self RANK:STEP`` (that rank sends itself SIGTERM before step STEP's
``ckpt.step``), ``--pause-for-sigterm STEP`` (every rank waits at that step until a SIGTERM reaches it,
after rank 0 wrote ``<report>.paused``), ``--die-mid-save RANK:STEP`` (that rank is killed with SIGKILL once
its files of step STEP are written, before the checkpoint can commit).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runner.checkpoint import Checkpointer, ResumableSampler


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--local-dir", required=True)
    p.add_argument("--durable-url")
    p.add_argument("--every-steps", type=int)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--out")
    p.add_argument("--report")
    p.add_argument("--dump-full", help="after restore, write the full model state here (rank 0) and exit")
    p.add_argument("--signal-self")
    p.add_argument("--pause-for-sigterm", type=int)
    p.add_argument("--die-mid-save")
    p.add_argument("--mismatch", action="store_true", help="rank 1 registers no optimizer")
    p.add_argument("--ranks-per-node", type=int, help="give each group of this many ranks a local folder of its "
                   "own, <local-dir>/node<N>, as the ranks of one node of a multi-node job have")
    p.add_argument("--counting-store", action="store_true", help="register countingfile:// (counting_store.py)")
    return p.parse_args(argv)


def rank_step(text: str | None) -> tuple[int, int] | None:
    return tuple(int(x) for x in text.split(":")) if text else None


def build(args):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, args.width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(args.width, 2))
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in (model[0], model[3]):
            fully_shard(layer, mesh=mesh)
        model = fully_shard(model, mesh=mesh)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(96, 8, generator=generator), torch.randn(96, 2, generator=generator))
    sampler = ResumableSampler(dataset, shuffle=True, seed=3)
    return model, optimizer, sampler, DataLoader(dataset, batch_size=4, sampler=sampler)


def full_state(model) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def main(argv) -> int:
    args = parse(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer, sampler, loader = build(args)
    objects = {"model": model, "optimizer": optimizer, "sampler": sampler}
    if args.mismatch and rank == 1:
        del objects["optimizer"]
    if args.counting_store:
        import counting_store

        counting_store.register()
    local_dir = Path(args.local_dir)
    if args.ranks_per_node:
        local_dir = local_dir / f"node{rank // args.ranks_per_node}"
    ckpt = Checkpointer(**objects, local_dir=local_dir,
                        durable_url=args.durable_url, every_steps=args.every_steps, interval="1h", keep=3)
    got_sigterm = threading.Event()
    library_handler = signal.getsignal(signal.SIGTERM)

    def observe(signum, frame):  # the library's handler records the notice; this one lets the test pause
        got_sigterm.set()
        library_handler(signum, frame)

    signal.signal(signal.SIGTERM, observe)
    die = rank_step(args.die_mid_save)
    if die and die[0] == rank:
        from runner.checkpoint import dcp_format

        written = dcp_format.own_files

        def own_files_then_die(folder, who):
            if folder.name.endswith(f"{die[1]:08d}"):
                os.kill(os.getpid(), signal.SIGKILL)
            return written(folder, who)

        dcp_format.own_files = own_files_then_die

    restored = step = ckpt.restore()
    if args.dump_full:
        state = full_state(model)
        if rank == 0:
            torch.save(state, args.dump_full)
        ckpt.close()
        dist.destroy_process_group()
        return 0
    signal_self = rank_step(args.signal_self)
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if signal_self and signal_self == (rank, step):
                os.kill(os.getpid(), signal.SIGTERM)
            ckpt.step(step)
            if ckpt.should_stop or step >= args.steps:
                break
            if args.pause_for_sigterm == step:
                if rank == 0:
                    Path(args.report + ".paused").write_text(str(step))
                if not got_sigterm.wait(300):
                    print("no SIGTERM came", file=sys.stderr)
                    return 3
        if ckpt.should_stop:
            break
    stopped = ckpt.should_stop
    if args.fsdp and args.out:
        final = full_state(model)
    ckpt.close()
    if args.report:
        Path(f"{args.report}.{rank}.json").write_text(json.dumps(
            {"rank": rank, "restored": restored, "step": step, "should_stop": stopped, "time": time.time()}))
    if args.out:
        if not args.fsdp:
            final = model.module.state_dict()
        if rank == 0:
            torch.save(final, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
