"""The Hugging Face example (examples/transformers/train.py), made to receive SIGTERM at a chosen step.

``python hf_trainee.py --sigterm-at 5 [example options]``: the process sends itself SIGTERM in the step-end
event of step 5, before the runner's callback sees that step, so the emergency checkpoint is of step 5.
Under torchrun, ``--sigterm-rank R`` sends it in rank R only (the others learn it from the agreement).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "transformers"))

import train  # noqa: E402
from transformers import TrainerCallback  # noqa: E402


class SigtermAt(TrainerCallback):
    def __init__(self, step: int, rank: int | None) -> None:
        self.step, self.rank = step, rank

    def on_step_end(self, args, state, control, **kwargs):
        mine = self.rank is None or int(os.environ.get("RANK", "0")) == self.rank
        if state.global_step == self.step and mine:
            os.kill(os.getpid(), signal.SIGTERM)


def take(argv: list[str], flag: str) -> int | None:
    if flag not in argv:
        return None
    index = argv.index(flag)
    value = int(argv[index + 1])
    del argv[index:index + 2]
    return value


if __name__ == "__main__":
    argv = sys.argv[1:]
    sigterm_at, sigterm_rank = take(argv, "--sigterm-at"), take(argv, "--sigterm-rank")
    trainer = train.build(train.parse(argv))
    if sigterm_at is not None:
        trainer.callback_handler.callbacks.insert(0, SigtermAt(sigterm_at, sigterm_rank))
    resume = train.last_checkpoint()
    print(f"resuming from {resume}" if resume else "starting fresh", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print(f"final weights sha256 {train.weights_sha256(trainer.model)}", flush=True)
    if torch.distributed.is_initialized():  # exiting with gloo's groups alive can abort at shutdown
        torch.distributed.destroy_process_group()
