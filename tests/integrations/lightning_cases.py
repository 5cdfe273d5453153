"""What tests/integrations/test_lightning.py trains: examples/lightning/train.py and callbacks and models built on
it. The tests import this module when they run, not at collection: lightning takes several CPU-seconds to import,
and under `pytest -n N` every worker collects every test module."""

from __future__ import annotations

import os
import signal

import lightning
import torch

from runner.integrations.lightning import RunnerCallback, last_checkpoint

from .conftest import load_example

__all__ = ["NanOnSteps2And5", "RunnerCallback", "SigtermAt", "Wider", "example", "last_checkpoint", "lightning"]
example = load_example("lightning")


class SigtermAt(lightning.Callback):
    """Sends this process SIGTERM at the end of one step's batch, before the runner's callback sees it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class Wider(example.Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


class NanOnSteps2And5(example.Regressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.trainer.global_step in (1, 4):  # steps 2 and 5: a NaN loss whose gradient stays finite
            return loss - loss.detach() + float("nan")
        return loss
