"""The Lightning example (examples/lightning/train.py), made to receive SIGTERM at a chosen step.

``python pl_trainee.py --sigterm-at 23 [example options]``: the process sends itself SIGTERM at the end of
that step's batch, before the runner's callback sees it, so the emergency checkpoint is of that step.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "lightning"))

import lightning  # noqa: E402
import train  # noqa: E402


class SigtermAt(lightning.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    argv = sys.argv[1:]
    sigterm_at = None
    if "--sigterm-at" in argv:
        index = argv.index("--sigterm-at")
        sigterm_at = int(argv[index + 1])
        del argv[index:index + 2]
    trainer, model, loader = train.build(train.parse(argv))
    if sigterm_at is not None:
        trainer.callbacks.insert(0, SigtermAt(sigterm_at))
    resume = train.last_checkpoint()
    print(f"resuming from {resume}" if resume else "starting fresh", flush=True)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    print(f"final weights sha256 {train.weights_sha256(model)}", flush=True)
