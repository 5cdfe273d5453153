"""Multi-node quickstart: DDP over 2 nodes x 2 processes (gloo, CPU) that survives losing a node.

Started on every node by torchrun, with the runner's gang variables (see job.yaml):

    torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=2 \
        --master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT train.py --steps 400

The Checkpointer is collective once torch.distributed is initialised: every rank builds it with its own
objects and calls restore() and step() at the same steps; one checkpoint per step is written for the whole
job, and a notice on any node makes every rank stop at the same step.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from runner.checkpoint import Checkpointer, ResumableSampler
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    from runner.checkpoint import Checkpointer, ResumableSampler


def make_dataset(n: int = 1024, features: int = 16) -> TensorDataset:
    """A deterministic regression problem: y = sin(x @ w) plus a little noise."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = torch.sin(x @ w) + 0.05 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-time", type=float, default=0.05, help="extra sleep per step, seconds")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--interval", default="10s", help="periodic checkpoint interval: 30s, 10m, auto")
    parser.add_argument("--bit-exact", action="store_true",
                        help="one DDP bucket per parameter: a resumed run ends with exactly the weights of an "
                             "uninterrupted one even where the library leaves DDP's buckets alone "
                             "(docs/checkpointing.md)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    dataset = make_dataset()
    # DDP over more than two ranks sums gradients in an order that depends on its buckets, which it lays out
    # anew after the first step of every run; the Checkpointer saves the layout and gives it back to the
    # resumed DDP. A bucket per parameter keeps one layout without that (slower all-reduce), for a DDP the
    # library leaves alone (a communication hook, mixed precision).
    buckets = {"bucket_cap_mb_list": [1e-6]} if args.bit_exact else {}
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1)), **buckets)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    sampler = ResumableSampler(dataset, shuffle=True, seed=0)  # shards over the process group by itself
    # Its own generator: a new DataLoader iterator (each epoch, and after a resume mid-epoch) then draws its
    # seed from it rather than from the global RNG that dropout uses and the checkpoint restores.
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, generator=torch.Generator().manual_seed(0))

    ckpt = Checkpointer(model=model, optimizer=optimizer, sampler=sampler, interval=args.interval)
    step = ckpt.restore()
    print(f"rank {rank}/{world}: " + (f"resumed from step {step}" if step else "starting fresh"), flush=True)

    model.train()
    while step < args.steps and not ckpt.should_stop:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if args.step_time > 0:
                time.sleep(args.step_time)
            ckpt.step(step)
            if ckpt.should_stop or step >= args.steps:
                break
    ckpt.close()
    if ckpt.should_stop and step < args.steps:
        print(f"rank {rank}: stopping at step {step}; the checkpoint is committed", flush=True)
    elif rank == 0:
        print(f"final weights sha256 {weights_sha256(model.module)}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
