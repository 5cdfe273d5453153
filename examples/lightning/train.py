"""A tiny regression model trained with Lightning, protected by the runner (examples/lightning).

Random data, a small MLP with dropout (so the RNG matters), a ``ResumableSampler`` so that a resume
mid-epoch goes on exactly where the preempted run stopped. The runner lines are marked.

    python train.py --steps 200           # outside the runner: checkpoints into ./checkpoints
    runner submit job.yaml                # under the runner: interval, keep and tiers from the job file
"""

from __future__ import annotations

import argparse
import hashlib
import time

import lightning
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runner.checkpoint import ResumableSampler  # <- the runner: a data position that survives a resume
from runner.integrations.lightning import RunnerCallback, last_checkpoint  # <- the runner


class Regressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=3e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Progress(lightning.Callback):
    """Prints a line every few steps, and slows the steps down when asked (to have time to preempt it)."""

    def __init__(self, every: int, step_time: float) -> None:
        self.every, self.step_time = every, step_time

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % self.every == 0:
            print(f"step {trainer.global_step}", flush=True)
        if self.step_time:
            time.sleep(self.step_time)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(200, 8, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(200, 1, generator=generator))


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds added to each step")
    parser.add_argument("--log-every", type=int, default=10)
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    lightning.seed_everything(0, verbose=False)
    data = dataset()
    sampler = ResumableSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=0)
    trainer = lightning.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        callbacks=[Progress(args.log_every, args.step_time), RunnerCallback()])  # <- the runner
    return trainer, Regressor(), loader


def main(argv=None) -> None:
    trainer, model, loader = build(parse(argv))
    resume = last_checkpoint()  # <- the runner: None on a fresh start
    print(f"resuming from {resume}" if resume else "starting fresh", flush=True)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    print(f"final weights sha256 {weights_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
