"""Every error the checkpoint library raises on purpose; each message says what to do about it."""

from __future__ import annotations

from ..errors import RunnerError


class CheckpointError(RunnerError):
    """Base class of the library's errors."""


class CheckpointConfigError(CheckpointError, ValueError):
    """A constructor argument or environment variable is unusable (bad URL, missing driver, bad interval)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files do not match its manifest (missing, truncated, or failing a checksum)."""


class RestoreError(CheckpointError):
    """A verified checkpoint does not fit the registered objects (for example, the model changed shape)."""


class NoRoomToRestoreError(RestoreError):
    """A good checkpoint cannot be fetched onto this node: its local disk is full. Unlike a checkpoint that does not
    fit the model, another node (with room) can resume from it."""


class NoWorldToJoinError(RestoreError):
    """A process started to join an elastic gang got no world to enter in time: the gang, not the checkpoint, is
    at fault, and a relaunch may find one."""


class SupersededError(CheckpointError):
    """A newer attempt of the same job has started: this process no longer commits where that attempt reads."""
