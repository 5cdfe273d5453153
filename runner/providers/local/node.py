"""A simulated node: its own metadata servers, then the agent, in one process session.

Run by the local provider as ``python -m runner.providers.local.node NODE_DIR``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(node_dir: Path) -> int:
    env = dict(os.environ)
    endpoints = {}
    try:
        from .metadata import serve_all
    except ImportError:
        servers = None
    else:
        servers = serve_all()
        endpoints = servers.endpoints()
        env.update(servers.environment())
    (node_dir / "metadata.json").write_text(json.dumps(endpoints))
    boot(node_dir)
    agent = subprocess.Popen(
        [sys.executable, "-m", "runner.cli.main", "agent", "--config", str(node_dir / "agent.yaml")], env=env
    )
    signal.signal(signal.SIGTERM, lambda *_: agent.send_signal(signal.SIGTERM))
    code = agent.wait()
    if servers is not None:
        servers.stop()
    return code


def boot(node_dir: Path) -> None:
    """Wait out the simulated VM's boot (``clouds.local.boot_seconds`` from the launch) before the agent starts.
    The metadata servers are up meanwhile, as a cloud's are: a notice may reach a node that is still booting.
    A terminate kills this process's whole session, sleep included."""
    try:
        plan = json.loads((node_dir / "boot.json").read_text())
    except (OSError, ValueError):
        return
    ready_at = float(plan.get("launched_at", 0)) + float(plan.get("boot_seconds", 0))
    while (left := ready_at - time.time()) > 0:
        time.sleep(min(left, 1.0))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
