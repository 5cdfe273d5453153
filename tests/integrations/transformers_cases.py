"""What tests/integrations/test_transformers.py trains: examples/transformers/train.py and a callback built on
it. The tests import this module when they run, not at collection: transformers takes seconds of CPU to import,
and under `pytest -n N` every worker collects every test module."""

from __future__ import annotations

import os
import signal

from transformers import TrainerCallback

from runner.integrations.transformers import RunnerCallback, last_checkpoint

from .conftest import load_example

__all__ = ["RunnerCallback", "SigtermAt", "example", "last_checkpoint"]
example = load_example("transformers")


class SigtermAt(TrainerCallback):
    """Sends this process SIGTERM at the end of one step, before the runner's callback sees that step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
