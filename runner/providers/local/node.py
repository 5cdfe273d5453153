"""A simulated node: its own metadata servers, then the agent, in one process session.

Run by the local provider as ``python -m runner.providers.local.node NODE_DIR GATE_FD``.

The process does nothing until its launcher has recorded it: it first reads its gate (a pipe from the launcher)
to the end, which comes when the launcher closes it after writing ``NODE_DIR/ref``, or when the launcher dies.
It then goes on only if the ref names this process. So a launcher killed between starting the process and
recording it leaves no node running that no controller can find (it would train, and on a cloud bill, for
nobody); the next leader's launch of the node finds it gone and starts it again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(node_dir: Path, gate_fd: int) -> int:
    if not recorded_by_launcher(node_dir, gate_fd):
        print("its launcher stopped before recording this node; not starting", flush=True)
        return 0
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


def recorded_by_launcher(node_dir: Path, gate_fd: int) -> bool:
    """Wait until the launcher closes the gate (or dies), then whether ``NODE_DIR/ref`` names this process."""
    from .processes import process_ref

    while os.read(gate_fd, 4096):
        pass
    os.close(gate_fd)
    try:
        recorded = (node_dir / "ref").read_text()
    except FileNotFoundError:
        return False
    return recorded == process_ref(os.getpid())


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
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
