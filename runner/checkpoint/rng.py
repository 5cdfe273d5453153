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


def portable(state: dict) -> dict:
    """``state`` with NumPy's array as a tensor, so that it loads with ``torch.load(weights_only=True)``."""
    out = dict(state)
    if out.get("numpy") is not None:
        name, keys, pos, has_gauss, cached = out["numpy"]
        out["numpy"] = (name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    return out


def from_portable(state: dict) -> dict:
    """Inverse of ``portable``."""
    out = dict(state)
    if out.get("numpy") is not None and numpy is not None:
        name, keys, pos, has_gauss, cached = out["numpy"]
        out["numpy"] = (name, keys.numpy().astype(numpy.uint32), pos, has_gauss, cached)
    return out
