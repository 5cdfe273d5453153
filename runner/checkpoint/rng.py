"""Capture and restore every random number generator a training step can draw from."""

from __future__ import annotations

import random

import torch

try:
    import numpy
except ImportError:  # pragma: no cover - NumPy is optional
    numpy = None


def capture() -> dict:
    """States of python's ``random``, NumPy's global generator (if importable), torch CPU and every CUDA device."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    """Put back what ``capture`` took; generators the saving process lacked are left as they are."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if numpy is not None and state.get("numpy") is not None:
        numpy.random.set_state(state["numpy"])
    cuda_states = state.get("cuda")
    if cuda_states and torch.cuda.is_available():
        count = min(len(cuda_states), torch.cuda.device_count())
        for index in range(count):
            torch.cuda.set_rng_state(cuda_states[index].cpu(), index)
