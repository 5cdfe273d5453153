"""The agent's config file (written by the bootstrap script or the local provider)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml


class AgentConfigError(Exception):
    pass


@dataclass(frozen=True)
class AgentConfig:
    controller_url: str
    node_id: str
    token: str
    scratch_dir: Path
    cloud: str | None = None
    zone: str | None = None
    heartbeat_seconds: float = 2.0
    stop_grace_seconds: float = 10.0
    drill_timeout_seconds: float = 120.0  # how long the job gets to checkpoint, and to restore, in the drill
    watch: str = "auto"  # auto (the endpoint variables, else probe link-local), off, or aws|gcp|azure


def load_agent_config(path: Path) -> AgentConfig:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise AgentConfigError(f"{path}: agent config not found; pass --config FILE") from None
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: not valid YAML ({exc})") from None
    missing = [k for k in ("controller_url", "node_id", "token", "scratch_dir") if not data.get(k)]
    if missing:
        raise AgentConfigError(f"{path}: missing {', '.join(missing)}")
    known = set(AgentConfig.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise AgentConfigError(f"{path}: unknown key {sorted(unknown)[0]!r}")
    data["scratch_dir"] = Path(data["scratch_dir"])
    return AgentConfig(**data)
