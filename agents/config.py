"""The agent's config file (written by the bootstrap script or the local provider, or by hand for a sidecar)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml
from pydantic import field_validator, model_validator

from runner.errors import ConfigError
from runner.validation import Section, validate

MODES = ("supervise", "sidecar")
WATCH = ("auto", "off", "aws", "gcp", "azure")
SOCKET_NAME = "control.sock"
SOCKET_PATH_LIMIT = 107  # bytes of an AF_UNIX path on Linux, less the terminating NUL


class AgentConfigError(ConfigError):
    pass


@dataclass(frozen=True)
class AgentConfig:
    scratch_dir: Path
    controller_url: str | None = None
    node_id: str | None = None
    token: str | None = None
    # supervise: the agent runs the job's setup and run itself (a VM). sidecar: the training process is started
    # by someone else (the training container of a pod) and reaches the agent through the control socket.
    mode: str = "supervise"
    cloud: str | None = None
    zone: str | None = None
    heartbeat_seconds: float = 2.0
    stop_grace_seconds: float = 10.0
    drill_timeout_seconds: float = 120.0  # how long the job gets to checkpoint, and to restore, in the drill
    # ... to restore, when it differs: the restart starts Python and the job's imports again (None: as above)
    drill_restore_timeout_seconds: float | None = None
    gcp_spot_grace_seconds: float | None = None  # what a GCP preemption leaves (default 30 s; simulations less)
    watch: str = "auto"  # auto (the endpoint variables, else probe link-local), off, or aws|gcp|azure
    address: str | None = None  # where a gang's other nodes reach this one (default: the route to the controller)

    @property
    def reports(self) -> bool:
        """Is there a controller to report to? (A sidecar without one runs standalone, logging only.)"""
        return bool(self.controller_url and self.token)

    @property
    def control_socket(self) -> Path:
        """Where the agent listens and the training library connects (``RUNNER_CONTROL``)."""
        if self.mode == "sidecar":
            return self.scratch_dir / SOCKET_NAME  # must be in the shared volume; its length is checked on load
        return control_socket_path(self.scratch_dir, self.node_id or "agent")

    @property
    def state_dir(self) -> Path:
        """The folder above the scratch folder: the agent's log and its remembered notice."""
        return self.scratch_dir.parent


def control_socket_path(scratch_dir: Path, node_id: str) -> Path:
    """The control socket in the scratch folder, or under /tmp when that path is too long for AF_UNIX."""
    path = scratch_dir / SOCKET_NAME
    if len(str(path).encode()) < 100:
        return path
    return Path(tempfile.gettempdir()) / f"runner-{node_id}.sock"


class AgentConfigFile(Section):
    """The agent's config file: the keys of :class:`AgentConfig`, checked."""

    scratch_dir: Optional[str] = None
    controller_url: Optional[str] = None
    node_id: Optional[str] = None
    token: Optional[str] = None
    mode: str = "supervise"
    cloud: Optional[str] = None
    zone: Optional[str] = None
    heartbeat_seconds: float = 2.0
    stop_grace_seconds: float = 10.0
    drill_timeout_seconds: float = 120.0
    drill_restore_timeout_seconds: Optional[float] = None
    gcp_spot_grace_seconds: Optional[float] = None
    watch: str = "auto"
    address: Optional[str] = None

    @field_validator("mode", "watch")
    @classmethod
    def _one_of(cls, value, info):
        choices = MODES if info.field_name == "mode" else WATCH
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value

    @model_validator(mode="after")
    def _what_the_mode_needs(self):
        required = ("scratch_dir",) if self.mode == "sidecar" else ("controller_url", "node_id", "token", "scratch_dir")
        missing = [key for key in required if not getattr(self, key)]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if self.mode == "sidecar" and bool(self.controller_url) != bool(self.token):
            raise ValueError("controller_url and token go together: give both to report to the controller, or "
                             "neither to run the sidecar standalone")
        return self


def load_agent_config(path: Path) -> AgentConfig:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise AgentConfigError(f"{path}: agent config not found; pass --config FILE") from None
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise AgentConfigError(f"{path}: expected a mapping of keys such as scratch_dir and mode")
    checked = validate(AgentConfigFile, data, source=str(path), error=AgentConfigError)
    config = AgentConfig(**{**checked.model_dump(exclude_unset=True), "scratch_dir": Path(checked.scratch_dir)})
    if config.mode == "sidecar" and len(str(config.control_socket).encode()) > SOCKET_PATH_LIMIT:
        raise AgentConfigError(f"{path}: scratch_dir: {str(config.scratch_dir)!r} is too long for the control "
                               f"socket inside it (at most {SOCKET_PATH_LIMIT - len(SOCKET_NAME) - 1} bytes); "
                               "mount the shared volume at a shorter path")
    return config
