"""The agent's config file: the two modes, and mistakes named by their key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agents.config import AgentConfigError, load_agent_config


def write(tmp_path: Path, **keys) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(keys))
    return path


def test_a_sidecar_needs_only_its_shared_folder(tmp_path: Path):
    """`mode: sidecar` with a scratch_dir is a standalone sidecar, listening in that folder."""
    config = load_agent_config(write(tmp_path, mode="sidecar", scratch_dir=str(tmp_path / "shared")))
    assert config.mode == "sidecar" and not config.reports
    assert config.control_socket == tmp_path / "shared" / "control.sock"


def test_the_default_mode_supervises_and_needs_the_controller(tmp_path: Path):
    """Without a mode the agent supervises the job, which needs a controller URL, a node id and a token."""
    with pytest.raises(AgentConfigError, match="missing controller_url, node_id, token"):
        load_agent_config(write(tmp_path, scratch_dir=str(tmp_path)))


def test_an_unknown_mode_is_refused_by_name(tmp_path: Path):
    """A mode other than supervise or sidecar is refused, naming the key and the choices."""
    with pytest.raises(AgentConfigError, match="mode: 'attach' is not one of supervise, sidecar"):
        load_agent_config(write(tmp_path, mode="attach", scratch_dir=str(tmp_path)))


def test_a_controller_url_without_a_token_is_refused(tmp_path: Path):
    """A sidecar given a controller URL but no token is refused rather than silently left standalone."""
    with pytest.raises(AgentConfigError, match="controller_url and token go together"):
        load_agent_config(write(tmp_path, mode="sidecar", scratch_dir=str(tmp_path),
                                controller_url="http://127.0.0.1:8470"))


def test_a_sidecar_folder_too_long_for_a_socket_is_refused(tmp_path: Path):
    """A shared folder whose socket path would not fit AF_UNIX is refused, since a sidecar cannot move it."""
    with pytest.raises(AgentConfigError, match="scratch_dir: .* too long"):
        load_agent_config(write(tmp_path, mode="sidecar", scratch_dir="/" + "x" * 120))


def test_an_unknown_watch_value_is_refused_by_name(tmp_path: Path):
    """`watch` takes auto, off or a cloud's name."""
    with pytest.raises(AgentConfigError, match="watch: 'oracle'"):
        load_agent_config(write(tmp_path, mode="sidecar", scratch_dir=str(tmp_path), watch="oracle"))
