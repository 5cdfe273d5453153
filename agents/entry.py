"""The agent's entry point (``runner agent``): its config, its JSON log, and which agent runs: the one that
supervises the job's process on its node, or the sidecar beside a container that runs it."""

from __future__ import annotations

from pathlib import Path

from runner.logconfig import configure_logging

from .config import AgentConfigError, load_agent_config


def run_agent(config_path: Path) -> int:
    try:
        config = load_agent_config(config_path)
    except AgentConfigError as exc:
        print(f"error: {exc}")
        return 2
    configure_logging(config.state_dir / "agent.jsonl")
    if config.mode == "sidecar":
        from .sidecar import Sidecar

        return Sidecar(config).run()
    from .main import Agent

    return Agent(config).run()
