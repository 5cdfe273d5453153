"""The job file: schema, loading, and errors that name the key.

The schema and the loader (pydantic) are imported on first use, so that a process that only needs
``SpecError`` or the durations (the agent, most CLI commands) does not pay for them.
"""

from importlib import import_module

from ..durations import format_duration, parse_duration
from .errors import SpecError

_LAZY = {"load_job_file": ".load", "parse_job": ".load", "validate_job": ".load", "CheckpointSpec": ".schema",
         "JobSpec": ".schema", "RecoverySpec": ".schema", "Resources": ".schema"}

__all__ = [
    "CheckpointSpec", "JobSpec", "RecoverySpec", "Resources", "SpecError",
    "format_duration", "load_job_file", "parse_duration", "parse_job", "validate_job",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
