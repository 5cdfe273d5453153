"""The job file: schema, loading, and errors that name the key."""

from ..durations import format_duration, parse_duration
from .errors import SpecError
from .load import load_job_file, parse_job, validate_job
from .schema import CheckpointSpec, JobSpec, RecoverySpec, Resources

__all__ = [
    "CheckpointSpec", "JobSpec", "RecoverySpec", "Resources", "SpecError",
    "format_duration", "load_job_file", "parse_duration", "parse_job", "validate_job",
]
