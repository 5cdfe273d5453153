"""The job file's schema (docs/job-file.md), one pydantic model per section.

The same models generate docs/job-schema.json for editors (``python -m runner.spec.jsonschema``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..durations import parse_duration
from .deadline import parse_deadline
from .urls import check_fsspec_url

CLOUDS = ("local", "aws", "gcp", "azure")
MAX_RESUME_DRILL_SECONDS = 15 * 60
PREPARE_SIGNALS = ("rebalance", "notice")  # what may launch a job's replacement while its node still trains
MAX_NUM_NODES = 1024  # the schema's bound; what fits in one zone is each provider's to say at submit
MAX_STEP = 2**53  # a step count above this loses precision as a float (progress = step / total_steps) and in JSON
# The validation context of a job read back from the controller's database (runner/spec/stored.py): the checks
# that depend on this machine (an installed filesystem) were made at submit, and are not made again.
STORED = "stored"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_ACCELERATOR = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*):([1-9][0-9]*)$")


# One argument or one environment string of a new process (Linux MAX_ARG_STRLEN, 32 pages, NUL included):
# ``run`` and ``setup`` each reach the node as one argument of ``bash -c``, each env entry as KEY=value.
MAX_ARGUMENT_BYTES = 128 * 1024 - 1
# All of them together, leaving the node's own environment room under ARG_MAX (2 MiB on Linux).
MAX_COMMAND_AND_ENV_BYTES = 1024 * 1024


def _not_a_boolean(value, expected: str) -> None:
    """A duration key given true or false (which would otherwise pass as 1 or 0 seconds)."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not {expected}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _kind(value) -> str:
    """What a value is, without the value: for a message about a key whose values may be secrets."""
    if value is None:
        return "nothing"
    return {str: "a string", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), f"a {type(value).__name__}")


def _command_text(key: str, value: str | None) -> str | None:
    """``run``/``setup``: no NUL byte (no process can take it) and short enough to be one argument."""
    if value is None:
        return value
    if "\0" in value:
        raise ValueError("contains a NUL byte, which no command line can carry; remove it")
    size = len(value.encode())
    if size > MAX_ARGUMENT_BYTES:
        raise ValueError(f"is {size // 1024} KiB; a command can be at most 128 KiB (one argument of bash -c); "
                         f"put the commands in a script in the workdir and {key}: bash that-script.sh")
    return value


class Resources(_Section):
    """What a node must offer."""

    cloud: Optional[list[Literal["local", "aws", "gcp", "azure"]]] = Field(
        default=None, description="Clouds to use; default: every configured cloud."
    )
    accelerators: Optional[Union[str, list[str]]] = Field(
        default=None, description="NAME:COUNT (T4:1), or a list of alternatives any of which will do "
                                  "([A100:1, L4:1, T4:1]): the job runs where a step is cheapest; omit for CPU only.")
    cpus: Optional[int] = Field(default=None, ge=1, strict=True, description="Minimum vCPUs.")
    memory_gb: Optional[float] = Field(default=None, gt=0, strict=True, description="Minimum memory in GiB.")
    regions: Optional[list[str]] = Field(default=None, min_length=1, description="Allowed regions.")
    spot_policy: Literal["spot", "on-demand", "auto"] = Field(
        default="spot", description="spot, on-demand, or auto (spot, falling back to on-demand)."
    )
    max_price_per_hour: Optional[float] = Field(default=None, gt=0, strict=True, description="USD cap per node-hour.")
    num_nodes: int = Field(default=1, ge=1, le=MAX_NUM_NODES, strict=True,
                           description="Nodes launched together as one gang in one zone (docs/multinode.md).")
    min_nodes: Optional[int] = Field(
        default=None, ge=1, le=MAX_NUM_NODES, strict=True,
        description="Below num_nodes, the gang is elastic: when a node is preempted or lost, the others train on "
                    "while at least this many remain, and the replacement joins later (docs/elastic.md). "
                    "Default: num_nodes (not elastic).")

    @field_validator("min_nodes")
    @classmethod
    def _at_most_num_nodes(cls, value, info):
        num_nodes = info.data.get("num_nodes")
        if value is not None and isinstance(num_nodes, int) and value > num_nodes:
            raise ValueError(f"{value} is more than resources.num_nodes ({num_nodes}); use a number from 1 to "
                             f"{num_nodes} (below num_nodes makes the gang elastic), or leave it out")
        return value

    @property
    def elastic(self) -> bool:
        """The gang trains on with fewer nodes after a loss (``min_nodes`` below ``num_nodes``)."""
        return self.min_nodes is not None and self.min_nodes < self.num_nodes

    @property
    def fewest_nodes(self) -> int:
        """``min_nodes``, or ``num_nodes`` when it is not set."""
        return self.min_nodes if self.min_nodes is not None else self.num_nodes

    @field_validator("cloud", mode="before")
    @classmethod
    def _one_cloud_as_list(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("cloud")
    @classmethod
    def _some_cloud(cls, value, info):
        if value == [] and not (info.context or {}).get(STORED):  # an older version stored [] as every cloud
            raise ValueError("is an empty list; list at least one of local, aws, gcp, or omit the key for every "
                             "configured cloud")
        return value

    @field_validator("accelerators", mode="before")
    @classmethod
    def _accelerator_format(cls, value):
        """Each alternative well formed and listed once; errors name the item (``resources.accelerators[1]``)."""
        if value is None or isinstance(value, str):
            if isinstance(value, str) and not _ACCELERATOR.match(value):
                raise ValueError(f"{value!r} is not NAME:COUNT (for example T4:1 or A100:8)")
            return value
        if not isinstance(value, list):
            raise ValueError(f"must be NAME:COUNT or a list of them, such as [A100:1, L4:1] (got {value!r})")
        if not value:
            raise ValueError("is an empty list; list at least one NAME:COUNT, or omit the key for CPU only")
        seen: dict[str, int] = {}
        for index, item in enumerate(value):
            if not isinstance(item, str) or not _ACCELERATOR.match(item):
                raise ValueError(f"[{index}]: {item!r} is not NAME:COUNT (for example T4:1 or A100:8)")
            key = item.upper()
            if key in seen:
                raise ValueError(f"[{index}]: {item} is listed twice (also [{seen[key]}]); list each alternative once")
            seen[key] = index
        return value

    def accelerator_options(self) -> list[tuple[str, int]]:
        """Every accelerator alternative as (name, count), in the order given; [] for CPU only."""
        if not self.accelerators:
            return []
        items = [self.accelerators] if isinstance(self.accelerators, str) else self.accelerators
        return [(name, int(count)) for name, count in (item.rsplit(":", 1) for item in items)]

    def accelerator(self) -> tuple[str, int] | None:
        """The first accelerator alternative (name, count), or None for CPU only."""
        options = self.accelerator_options()
        return options[0] if options else None

    def accelerators_text(self) -> str:
        """``resources.accelerators`` as written in a message: ``T4:1`` or ``[A100:1, T4:1]``."""
        if isinstance(self.accelerators, list):
            return "[" + ", ".join(self.accelerators) + "]"
        return self.accelerators or "none"


class CheckpointSpec(_Section):
    """Where and how often the training process checkpoints."""

    local_dir: Optional[str] = Field(default=None, description="Fast node-local tier.")
    durable_url: Optional[str] = Field(default=None, description="Any fsspec URL (s3://, gs://, file://).")
    interval: Union[str, float] = Field(default="auto", description="auto, or a duration such as 30s, 10m, 1h.")
    keep: int = Field(default=3, ge=1, strict=True, description="Committed checkpoints kept.")

    @field_validator("durable_url")
    @classmethod
    def _durable_url(cls, value, info):
        if value is not None and not (info.context or {}).get(STORED):
            check_fsspec_url(value)  # what this machine has installed: not asked again of a stored job
        return value

    @field_validator("interval", mode="before")
    @classmethod
    def _finite_interval(cls, value):
        _not_a_boolean(value, "'auto' or a duration such as 30s, 10m or 1h")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration; use 'auto' or a duration such as 30s, 10m or 1h")
        return value

    @field_validator("interval")
    @classmethod
    def _interval(cls, value):
        if value == "auto":
            return value
        if parse_duration(value) <= 0:
            raise ValueError("must be 'auto' or a positive duration such as 10m")
        return value


class RecoverySpec(_Section):
    """How many relaunches a job gets, and when the resume drill runs."""

    max_preemptions: int = Field(default=50, ge=0, strict=True, description="Relaunches after a preemption.")
    max_failures: int = Field(default=2, ge=0, strict=True, description="Relaunches after the job's own non-zero exit.")
    resume_drill: Union[str, float] = Field(default="10m", description="When to prove resume works (≤ 15m), or 'off'.")
    deadline: Optional[Union[str, float]] = Field(
        default=None, description="Finish by then: a duration from submission (36h) or an RFC 3339 time; "
                                  "with spot_policy auto the scheduler picks spot or on-demand to meet it.")
    total_steps: Optional[int] = Field(default=None, gt=0, lt=MAX_STEP, strict=True, validate_default=True,
                                       description="With deadline: the step at which the job is done "
                                                   "(less than 2**53).")
    prepare_on: list[Literal["rebalance", "notice"]] = Field(
        default_factory=lambda: ["notice"],
        description="Signals that launch the replacement node while the job still trains on the old one: notice "
                    "(a preemption notice whose deadline leaves time) and rebalance (an AWS rebalance "
                    "recommendation: a warm standby, billed, released after standby_timeout if no notice follows).")
    standby_timeout: Union[str, float] = Field(
        default="10m", description="How long a standby launched on a rebalance recommendation waits for a notice "
                                   "before it is released.")

    @field_validator("prepare_on", mode="before")
    @classmethod
    def _prepare_on(cls, value):
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not a list; use e.g. [rebalance, notice]")
        for item in value:
            if item not in PREPARE_SIGNALS:
                raise ValueError(f"{item!r} is not one of {', '.join(PREPARE_SIGNALS)}")
        return list(dict.fromkeys(value))

    @field_validator("standby_timeout", mode="before")
    @classmethod
    def _standby_timeout_not_a_boolean(cls, value):
        _not_a_boolean(value, "a duration such as 10m")
        return value

    @field_validator("standby_timeout")
    @classmethod
    def _standby_timeout(cls, value):
        if isinstance(value, bool) or parse_duration(value) <= 0:
            raise ValueError(f"{value!r} is not a positive duration such as 10m")
        return value

    def standby_timeout_seconds(self) -> float:
        return parse_duration(self.standby_timeout)

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value):
        if value is None:
            return value
        if isinstance(value, bool) or isinstance(value, (dict, list)):
            raise ValueError(f"{value!r} is neither a duration (36h) nor an RFC 3339 time (2026-11-25T18:00:00Z)")
        parse_deadline(value)
        return value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else value

    @field_validator("total_steps")
    @classmethod
    def _total_steps_with_deadline(cls, value, info):
        if value is None and info.data.get("deadline") is not None:
            raise ValueError("required with recovery.deadline: the step at which the job is done "
                             "(the scheduler measures progress as step / total_steps)")
        return value

    @field_validator("resume_drill", mode="before")
    @classmethod
    def _drill_off(cls, value):
        if value is False:  # YAML reads an unquoted off as false
            return "off"
        _not_a_boolean(value, "a duration such as 10m (at most 15m), or 'off'")
        return value

    @field_validator("resume_drill")
    @classmethod
    def _drill(cls, value):
        if value == "off":
            return "off"
        seconds = parse_duration(value)
        if seconds > MAX_RESUME_DRILL_SECONDS:
            raise ValueError(f"{value!r} is later than the 15m limit; use at most 15m, or 'off'")
        if seconds <= 0:
            raise ValueError("must be a positive duration such as 10m, or 'off'")
        return value

    def resume_drill_seconds(self) -> float | None:
        """Seconds after the start at which the drill runs, or None when off."""
        return None if self.resume_drill == "off" else parse_duration(self.resume_drill)


class JobSpec(_Section):
    """A job file."""

    name: str = Field(description="Lowercase letters, digits and '-', 1-63 characters.")
    workdir: str = Field(default=".", description="Folder shipped to every node; default: the job file's folder.")
    setup: Optional[str] = Field(default=None, description="Shell command run once per node before run.")
    run: str = Field(description="Shell command that trains.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    resources: Resources = Field(default_factory=Resources)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)

    @field_validator("name")
    @classmethod
    def _name(cls, value):
        if not 1 <= len(value) <= 63 or not _NAME.match(value):
            raise ValueError(
                f"{value!r} is not a valid name: use 1-63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        return value

    @field_validator("run")
    @classmethod
    def _run(cls, value):
        if not value.strip():
            raise ValueError("must be a non-empty shell command")
        return _command_text("run", value)

    @field_validator("setup")
    @classmethod
    def _setup(cls, value):
        return _command_text("setup", value)

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_as_strings(cls, value):
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if isinstance(key, str) and "=" in key:  # {API_KEY=...}: the shell's form, its value in the key
                    raise ValueError(f"{key.partition('=')[0].strip()!r}: write NAME: value, not NAME=value (the "
                                     "value is not shown here)")
                if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                    raise ValueError(f"{key!r} is not a valid environment variable name")
                if isinstance(item, (dict, list)) or item is None:
                    raise ValueError(f"{key}: value must be a string, number or boolean")
                out[key] = str(item).lower() if isinstance(item, bool) else str(item)
                if "\0" in out[key]:
                    raise ValueError(f"{key}: the value contains a NUL byte, which no environment can carry; "
                                     "remove it")
                if len(f"{key}={out[key]}".encode()) > MAX_ARGUMENT_BYTES:
                    raise ValueError(f"{key}: the value is over 128 KiB, more than one environment variable can "
                                     "hold; put it in a file in the workdir and pass the file's name")
            return out
        # Never the value itself (the pydantic message quotes its input): `env: [API_KEY=...]`, the list form of
        # other tools, holds the very secrets that must stay out of error messages.
        raise ValueError(f"must be a mapping of NAME: value, such as {{WANDB_MODE: offline}} (got {_kind(value)})")

    @model_validator(mode="after")
    def _fits_in_one_process_start(self):
        size = sum(len(text.encode()) for text in (self.run, self.setup or ""))
        size += sum(len(f"{key}={value}".encode()) + 1 for key, value in self.env.items())
        if size > MAX_COMMAND_AND_ENV_BYTES:
            raise ValueError(f"run, setup and env together are {size // 1024} KiB; at most 1024 KiB can be passed "
                             "to the job's process; move the long parts into files in the workdir")
        return self
