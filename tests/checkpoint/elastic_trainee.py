"""The training loop of an elastic gang, as users write it, for tests/checkpoint/test_elastic.py (gloo, CPU).

One process per node (the test's harness plays the agents). Every step appends a JSON line to
``--report``.<pid>.jsonl: the step, the world, this rank, the sample indices it trained and whether the world
changed. After each step a rank holds while the step is at or past the number in ``--gate`` (the harness
moves it), so the harness acts between known steps. At the end each rank writes its model to ``--out``.<pid>.pt.
``ELASTIC_TRAINEE_DIE_AT=send:N`` (``recv:N``, ``broadcast:N``) kills the process (SIGKILL) at its Nth
point-to-point send (receive, broadcast) of the state to (from) a peer: a node dying in the middle of a joiner's transfer; ``restored``: once
``restore()`` has returned. ``ELASTIC_TRAINEE_FREEZE_AT`` (same values but ``restored``) stops the process there
instead (SIGSTOP): a node that vanished without a reset, its connections open and silent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from runner.checkpoint import Checkpointer, ResumableSampler
from runner.checkpoint import peer_state

SAMPLES = 48


class Indexed(Dataset):
    """Fixed samples of a learnable linear map (so runs that see the data in other batches stay close), which
    also say which they are."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, 8, generator=generator)
        self.y = self.x @ torch.randn(8, 2, generator=generator) + 0.01 * torch.randn(SAMPLES, 2, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def build():
    """The model and its optimizer, the same on every rank (and in the test's replay of the run)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)


def held(gate: Path, step: int) -> bool:
    try:
        return step >= int(gate.read_text())
    except (OSError, ValueError):
        return False


def dump(path: str, step: int, model, optimizer, sampler, extra: dict) -> None:
    """The state every rank of a new world must hold alike (the sampler's own rank and RNG state aside)."""
    place = {k: v for k, v in sampler.state_dict().items() if k != "torch_rng"}
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sampler": place,
                "extra": dict(extra)}, f"{path}.{os.getpid()}.{step}.pt")


def die_at(where: str, how: int = signal.SIGKILL) -> None:
    """Kill this process (or send it ``how``) at its Nth point-to-point ``send`` or ``recv`` of the state
    (``where``: "send:N"), or at its Nth ``broadcast`` of it as the sender (after a loss)."""
    op, count = where.split(":")
    calls = [0]
    link, op = (peer_state.Broadcast, "send") if op == "broadcast" else (peer_state.PointToPoint, op)
    real = getattr(link, op)

    def dying(self, tensor):
        calls[0] += 1
        if calls[0] >= int(count):
            os.kill(os.getpid(), how)
        return real(self, tensor)

    setattr(link, op, dying)


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--local-dir", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--gate")
    p.add_argument("--dump", help="write the registered state at each change of world to DUMP.<pid>.<step>.pt")
    args = p.parse_args(argv)
    if ":" in os.environ.get("ELASTIC_TRAINEE_DIE_AT", ""):
        die_at(os.environ["ELASTIC_TRAINEE_DIE_AT"])
    if ":" in os.environ.get("ELASTIC_TRAINEE_FREEZE_AT", ""):
        die_at(os.environ["ELASTIC_TRAINEE_FREEZE_AT"], signal.SIGSTOP)
    dist.init_process_group("gloo")
    model, optimizer = build()
    dataset = Indexed()
    sampler = ResumableSampler(dataset, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    extra = {"samples_seen": 0}  # this rank's own count; a joining rank takes its sender's
    ckpt = Checkpointer(model=model, optimizer=optimizer, sampler=sampler, local_dir=args.local_dir, interval="1h",
                        extra=extra)
    step = ckpt.restore()
    if os.environ.get("ELASTIC_TRAINEE_DIE_AT") == "restored":  # a joiner dying right after it joined
        os.kill(os.getpid(), signal.SIGKILL)
    if args.dump and step > 0:  # a joining process: what it received from a peer
        dump(args.dump, step, model, optimizer, sampler, extra)
    ddp = nn.parallel.DistributedDataParallel(model)
    batches = iter(loader)
    report = open(f"{args.report}.{os.getpid()}.jsonl", "a")
    gate = Path(args.gate) if args.gate else None
    while step < args.steps:
        epoch = sampler.epoch  # before next(): drawing an epoch's last, partial batch already moves it on
        try:
            x, y, index = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        extra["samples_seen"] += len(index)
        ckpt.step(step)
        if args.dump and ckpt.world_changed:
            dump(args.dump, step, model, optimizer, sampler, extra)
        report.write(json.dumps({"step": step, "world": ckpt.world_size, "rank": ckpt.rank, "pid": os.getpid(),
                                 "epoch": epoch, "indices": index.tolist(), "changed": ckpt.world_changed,
                                 "stop": ckpt.should_stop, "reason": ckpt.stop_reason}) + "\n")
        report.flush()
        if ckpt.should_stop:
            break
        if ckpt.world_changed:
            ddp = nn.parallel.DistributedDataParallel(model)
            batches = iter(loader)
        while gate is not None and held(gate, step):
            Path(f"{gate}.{os.getpid()}").write_text(str(step))
            time.sleep(0.02)
    ckpt.close()
    torch.save(model.state_dict(), f"{args.out}.{os.getpid()}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
