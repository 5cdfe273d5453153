"""config.yaml's sections as models (runner/validation.py): what ``load_config`` and ``scheduler_settings`` in
runner/home.py check. Each cloud's own section is checked by its provider (runner/providers/)."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import field_validator

from .durations import parse_duration
from .validation import Section


def _mapping(value, example: str):
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"must be a mapping such as {example}")
    return value


class SchedulerConfig(Section):
    """``scheduler:``: ``auto_on_demand_after``, how long an auto job waits for spot before on-demand, and
    ``gang_timeout``, how long a job's nodes (one or several) get to all register (both default 10 minutes)."""

    auto_on_demand_after: Union[str, float] = "10m"
    gang_timeout: Union[str, float] = "10m"

    @field_validator("auto_on_demand_after", "gang_timeout", mode="before")
    @classmethod
    def _duration(cls, value, info):
        seconds = parse_duration(value)  # a ValueError that says what a duration looks like
        if info.field_name == "gang_timeout" and seconds <= 0:
            raise ValueError("must be a positive duration such as 10m")
        return value


class LocalConfig(Section):
    """``clouds.local``: the keys of the simulated market; their values are checked by the LocalProvider."""

    zones: Any = None
    time_scale: Any = None
    no_capacity: Any = None
    zone_capacity: Any = None
    boot_seconds: Any = None
    durable_mb_per_s: Any = None

    @field_validator("zones", mode="before")
    @classmethod
    def _zones(cls, value):
        """A list of zone names: a bare name or a number would pass as its characters or fail at start."""
        if value is None:
            return value
        if not isinstance(value, list) or not value or not all(isinstance(z, str) and z.strip() for z in value):
            raise ValueError(f"{value!r} is not a list of zone names; give e.g. [local-a, local-b, local-c]")
        twice = next((z for i, z in enumerate(value) if z in value[:i]), None)
        if twice is not None:
            raise ValueError(f"lists {twice} twice; list each zone once")
        return value


class CloudsConfig(Section):
    """``clouds:``: the clouds to launch on, each checked by its provider (runner/providers/)."""

    local: Optional[LocalConfig] = None
    aws: Optional[dict[str, Any]] = None
    gcp: Optional[dict[str, Any]] = None

    @field_validator("local", "aws", "gcp", mode="before")
    @classmethod
    def _section(cls, value, info):
        return _mapping(value, f"{{{info.field_name}: {{...}}}} (docs/operations.md)")


class RunnerConfig(Section):
    """``$RUNNER_HOME/config.yaml``."""

    server: Optional[str] = None
    token: Optional[str] = None
    clouds: Optional[CloudsConfig] = None
    scheduler: Optional[SchedulerConfig] = None

    @field_validator("clouds", mode="before")
    @classmethod
    def _clouds(cls, value):
        return _mapping(value, "{local: {}} or {aws: {regions: [...], image_id: ...}}")

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler(cls, value):
        return _mapping(value, "{auto_on_demand_after: 10m}")
