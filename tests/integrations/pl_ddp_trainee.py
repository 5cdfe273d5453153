"""The Lightning example's model under torchrun with DDP (gloo on CPU), each rank seeded differently.

``torchrun --nproc-per-node 2 pl_ddp_trainee.py [--sigterm-at STEP]``: rank 1 alone sends itself SIGTERM at
the end of that step's batch; the ranks agree to stop at the next step. Every rank draws its own dropout
masks (seeded by its rank), so a resume is exact only if each rank gets its own RNG states back.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import lightning
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "lightning"))
import train  # noqa: E402

from runner.checkpoint import ResumableSampler  # noqa: E402
from runner.integrations.lightning import RunnerCallback, last_checkpoint  # noqa: E402


class SigtermAt(lightning.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sigterm-at", type=int)
    args = parser.parse_args()
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    lightning.seed_everything(rank, verbose=False)
    data = train.dataset()
    loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=ResumableSampler(data, seed=0))
    callbacks = [RunnerCallback()] + ([] if args.sigterm_at is None else [SigtermAt(args.sigterm_at)])
    callbacks.reverse()  # the signal first, so the runner's callback sees it in the same step
    trainer = lightning.Trainer(max_steps=args.steps, accelerator="cpu", devices=world, strategy="ddp",
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, use_distributed_sampler=False, callbacks=callbacks)
    model = train.Regressor()
    resume = last_checkpoint()
    print(f"resuming from {resume}" if resume else "starting fresh", flush=True)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    print(f"final weights sha256 {train.weights_sha256(model)}", flush=True)
    # A torchrun script ends by destroying its process groups: exiting with gloo's alive can abort the
    # process at interpreter shutdown ("terminate called without an active exception").
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
