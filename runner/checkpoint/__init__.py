"""runner.checkpoint: fast, atomic, resumable checkpoints for PyTorch training (docs/checkpointing.md).

Needs only the standard library, torch and fsspec; xxhash (faster checksums), NumPy (its RNG is saved)
and structlog (logs) are used when importable. See docs/checkpointing.md.
"""

from .checkpointer import Checkpointer
from .errors import CheckpointConfigError, CheckpointError, CorruptCheckpointError, RestoreError
from .sampler import ResumableSampler
from . import cuda_gate

cuda_gate.install()  # a process started ahead on a GPU node holds before its first CUDA use (cuda_gate.py)

__all__ = [
    "CheckpointConfigError",
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "ResumableSampler",
    "RestoreError",
]
