"""A simulated node: its own metadata servers, then the agent, in one process session.

Run by the local provider as ``python -m runner.providers.local.node NODE_DIR``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
    agent = subprocess.Popen(
        [sys.executable, "-m", "runner.cli.main", "agent", "--config", str(node_dir / "agent.yaml")], env=env
    )
    signal.signal(signal.SIGTERM, lambda *_: agent.send_signal(signal.SIGTERM))
    code = agent.wait()
    if servers is not None:
        servers.stop()
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
