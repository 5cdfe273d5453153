"""The Hugging Face example (examples/transformers/train.py), made to receive SIGTERM at a chosen step.

``python hf_trainee.py --sigterm-at 5 [example options]``: the process sends itself SIGTERM in the step-end
event of step 5, before the runner's callback sees that step, so the emergency checkpoint is of step 5.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "transformers"))

import train  # noqa: E402
from transformers import TrainerCallback  # noqa: E402


class SigtermAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    argv = sys.argv[1:]
    sigterm_at = None
    if "--sigterm-at" in argv:
        index = argv.index("--sigterm-at")
        sigterm_at = int(argv[index + 1])
        del argv[index:index + 2]
    trainer = train.build(train.parse(argv))
    if sigterm_at is not None:
        trainer.callback_handler.callbacks.insert(0, SigtermAt(sigterm_at))
    resume = train.last_checkpoint()
    print(f"resuming from {resume}" if resume else "starting fresh", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print(f"final weights sha256 {train.weights_sha256(trainer.model)}", flush=True)
